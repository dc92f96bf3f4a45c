"""Replicas that cannot affect one another, replayed one at a time, or side by side in worker
processes, instead of together on one clock.

A router that reads no load (Router.reads_load False: round-robin, random) sends each request
where the order of requests alone says. With mixed replicas only, a feed whose releases are all
known before the run (no sessions, no closed loop), no autoscaling and no lockstep, which replica
serves which request is then settled before anything runs, and nothing a replica does reaches
another. So the cluster routes every request first (Cluster.place: the same router, board and
entry times as on one clock), then replays each replica alone, with its own memory hot in the
CPU's caches (interleaving 16 replicas' objects made every call slower: reports/bench_cluster.md)
and, where several CPUs are free, in forked worker processes. The records are merged in the order
the one clock keeps them: by when each request left, ties by replica (in_clock_order), so
the outputs are the same bytes either way (tests/cluster/test_independent.py).
"""

from __future__ import annotations

import heapq
import multiprocessing
import os
import tempfile
from array import array

import simpy

from pagesim.metrics import RequestColumns
from pagesim.sim.releases import event_at

# (the cluster, its routed requests, the folder for records) a forked worker replays (set before
# the workers start)
_APART = None


def run_apart(cluster, jobs: int | None = None):
    """Route every request, replay each replica alone (in up to `jobs` processes; default: the
    CPUs this process may use), merge: the ClusterResult."""
    from pagesim.cluster.results import ClusterResult

    routed = _route_all(cluster)
    count = len(cluster.replicas)
    results, left = [None] * count, [None] * count
    done, cluster.end_time = 0, 0.0
    with tempfile.TemporaryDirectory(prefix="pagesim-apart-") as folder:
        for index, result, times, end in _replayed(cluster, routed, worker_count(jobs, count), folder):
            results[index], left[index] = result, times
            cluster.end_time = max(cluster.end_time, end)  # (on one clock: when its last engine ended)
            done += len(times)
            if cluster.on_progress is not None:
                cluster.on_progress(done)
        _merge(cluster, results, left)
    return ClusterResult(cluster, results)


def worker_count(jobs: int | None, replicas: int) -> int:
    """Processes to replay in: `jobs`, or the CPUs this process may use, at most one per
    replica; 1 inside a daemonic worker (which may not start processes of its own) and where
    processes cannot be forked (Windows)."""
    if multiprocessing.current_process().daemon or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    if jobs is None:
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(jobs, replicas))


def _route_all(cluster) -> list[tuple[array, array]]:
    """Route every request, in the order the router takes them: it reaches the router at its
    release plus the router's host time, as on one clock. Per replica, when each of its requests
    enters it and which request it is (its place in cluster.requests): 12 bytes a request, where
    queued entries cost ~120; a replica's queue is built as it is replayed (_queue)."""
    feed = cluster.feed  # (static: the workload in order, each request released at its arrival time)
    routed = [(array("d"), array("i")) for _ in cluster.replicas]
    index = 0
    while not feed.exhausted:
        request = feed.pop()  # (built as it is taken: the workload is a Workload)
        replica, entering, at = cluster.place(request, request.arrival_time + cluster.host_s)
        # (no P/D here: a request enters as it came, so its place in the workload names it)
        assert entering is request
        times, indices = routed[replica.index]
        times.append(at)
        indices.append(index)
        index += 1
    return routed


def _queue(replica, routed: tuple[array, array], requests: list) -> None:
    """The replica's queue of requests to enter: the heap the cluster's deliveries keep on one
    clock, (enters at, order, request), each request built here. (Routed in time order, the list
    is a heap already.)"""
    times, indices = routed
    replica.feed.pending = [(at, order, requests[i]) for order, (at, i) in enumerate(zip(times, indices))]
    heapq.heapify(replica.feed.pending)


def _replayed(cluster, routed: list, jobs: int, folder: str):
    """(replica index, its ReplayResult, when each of its records left, when it ended), as each is
    done. folder: where worker processes leave their records' columns (_Spilled)."""
    if jobs == 1:
        for replica in cluster.replicas:
            _queue(replica, routed[replica.index], cluster.requests)
            yield (replica.index, *_replay(replica, cluster))
        return
    global _APART
    _APART = cluster, routed, folder  # (the workers are forked: they find it here, nothing is pickled to them)
    try:
        with multiprocessing.get_context("fork").Pool(jobs, initializer=_worker_start) as pool:
            # (the workers have their copies: this process needs the arrival times no more; the
            # workload is the one every replica and the feed share, so they all let them go)
            cluster.requests.clear()
            routed.clear()
            yield from pool.imap_unordered(_replay_index, range(len(cluster.replicas)))
    finally:
        _APART = None


def _worker_start() -> None:
    from pagesim.children import die_with_parent

    die_with_parent()


def _replay_index(index: int):
    cluster, routed, folder = _APART
    replica = cluster.replicas[index]
    _queue(replica, routed[index], cluster.requests)
    replayed = _replay(replica, None)
    replica.sim = None  # (its result goes to the parent: this worker keeps nothing of it for its next replica)
    metrics = replayed[0].metrics
    metrics.requests = _Spilled.write(metrics.requests, folder, index)
    return (index, *replayed)


class _Spilled:
    """A replica's record columns (RequestColumns) that its worker wrote to files, which the parent
    reads back a column at a time as it merges them (RequestColumns.concat: pop_column): unpickled,
    every replica's columns would lie in the parent at once, beside the merged copy (at 1M
    requests, 80 MB its heap kept after they were let go)."""

    def __init__(self, stem: str, count: int, tables: dict) -> None:
        self.stem, self.count, self.tables = stem, count, tables

    @classmethod
    def write(cls, records: RequestColumns, folder: str, index: int) -> _Spilled:
        import numpy as np

        spilled = cls(os.path.join(folder, f"replica{index}-"), len(records), records.tables)
        for name, column in records.packed().columns.items():
            np.save(f"{spilled.stem}{name}.npy", column)
        return spilled

    def packed(self) -> _Spilled:
        return self

    def pop_column(self, name: str):
        import numpy as np

        path = f"{self.stem}{name}.npy"
        column = np.load(path)
        os.remove(path)
        return column

    def __len__(self) -> int:
        return self.count


def _replay(replica, cluster) -> tuple:
    """Replay one replica alone on its own clock: its routed requests enter at their times (as the
    cluster's deliveries would have them enter), its engine runs until they are all done.
    cluster: where progress is reported as records leave (in-process), or None."""
    sim, env = replica.sim, simpy.Environment()
    left = array("d")
    done = 0 if cluster is None else sum(len(r.sim.metrics.requests) for r in cluster.replicas[:replica.index])

    def recorded(_count) -> None:
        # when it left: its last step's end, which a decode run that went on past finishes tells
        # only later (a request turned away as it entered has none: then)
        finish = sim.metrics.requests[-1].finish_time
        left.append(env.now if finish is None else finish)
        if cluster is not None and cluster.on_progress is not None:
            cluster.on_progress(done + len(left))

    # (it reads the record's own time, not the clock: Replay._may_absorb_finishes)
    recorded.counts_only = cluster is None or getattr(cluster.on_progress, "counts_only", cluster.on_progress is None)
    sim.on_progress = recorded
    # Its requests are all routed, and its ends reach nobody who could release another (the
    # router reads no load; no sessions): its releases are all known, as a static feed's are.
    replica.feed.static = True
    env.process(_enter(env, sim, replica.feed))  # (first, as the cluster's router process is)
    env.run(until=sim.start(env))
    result = sim.finish()
    result.metrics.pack()  # (its records as columns: what the parent merges, in a fifth of the memory)
    return result, left, env.now


def _enter(env: simpy.Environment, sim, feed):
    """Submit the replica's routed requests, each exactly at its time."""
    pending = feed.pending
    while pending:
        at = pending[0][0]
        if at > env.now:
            yield event_at(env, at)
        sim.submit(feed.pop())
    sim.wake()  # (its feed ran dry: an idle engine sees that it is done)


def in_clock_order(cluster, records, times: array, replicas: array, decodes: array) -> None:
    """Set the cluster's records (with their replica, decode replica and leaving time columns) in
    the one clock's order: by when each left, ties by replica, a replica's own order kept (a stable
    sort). A run on one clock gives them by time already, so only its ties move (its event queue
    ordered those); a run apart gives them replica by replica, and this merges them.
    records: a list, or RequestColumns (seen in the new order, not copied)."""
    import numpy as np

    order = np.lexsort((np.frombuffer(replicas, dtype=np.int32), np.frombuffer(times, dtype=np.float64)))
    if isinstance(records, RequestColumns):
        cluster.records = records.take(order.astype(np.int32))  # (4 bytes a request: a run stays far below 2**31)
    else:
        cluster.records = [records[i] for i in order.tolist()]
    for name, column, dtype in (("record_replica", replicas, np.int32), ("record_decode", decodes, np.int32),
                                ("record_time", times, np.float64)):
        setattr(cluster, name, array(column.typecode, np.frombuffer(column, dtype=dtype)[order].tobytes()))


def _merge(cluster, results: list, left: list) -> None:
    """The replicas' records (packed: RequestColumns, or _Spilled), replica after replica in one set
    of columns that each replica's metrics.requests then sees its part of, put in the one clock's order."""
    sizes = [len(result.metrics.requests) for result in results]
    records = RequestColumns.concat([result.metrics.requests for result in results], release=True)
    start = 0
    for result, size in zip(results, sizes):
        result.metrics.requests = records.part(start, start + size)  # (the same rows, not a second copy)
        start += size
    times, replicas = array("d"), array("i")
    for index, replica_times in enumerate(left):
        times.extend(replica_times)
        replicas.extend(array("i", [index]) * len(replica_times))
    in_clock_order(cluster, records, times, replicas, array("i", [-1]) * len(records))
