"""Replicas that cannot affect one another, replayed one at a time, or side by side in worker
processes, instead of together on one clock.

A router that reads no load (Router.reads_load False: round-robin, random) sends each request
where the order of requests alone says. With mixed replicas only, a feed whose releases are all
known before the run (no sessions, no closed loop), no autoscaling and no lockstep, which replica
serves which request is then settled before anything runs, and nothing a replica does reaches
another. So the cluster routes every request first (Cluster.entry: the same router, board and
entry times as on one clock), then replays each replica alone, with its own memory hot in the
CPU's caches (interleaving 16 replicas' objects made every call slower: reports/bench_cluster.md)
and, where several CPUs are free, in forked worker processes. Each replica's records and token
gaps go to files as it ends, and are merged as they are read in the order the one clock keeps them
(in_clock_order's: by when each request left, ties by replica; pagesim.cluster.spill), so the
outputs are the same bytes either way (tests/cluster/test_independent.py), and the cluster's
memory does not hold every request's record at once.
"""

from __future__ import annotations

import heapq
import multiprocessing
import os
import pickle
import tempfile
from array import array

import simpy

from pagesim.sim.releases import event_at

# (the cluster, the folder of its routed requests and records) a forked worker replays (set before
# the workers start)
_APART = None


def run_apart(cluster, jobs: int | None = None):
    """Route every request, replay each replica alone (in up to `jobs` processes; default: the
    CPUs this process may use), merge: the ClusterResult."""
    from pagesim.cluster.results import ClusterResult

    from pagesim.cluster.spill import MergedRecords

    routed = _route_all(cluster)
    count = len(cluster.replicas)
    results = [None] * count
    done, cluster.end_time = 0, 0.0
    # (the replicas' records, in files until the records are let go: MergedRecords keeps it)
    folder = tempfile.TemporaryDirectory(prefix="pagesim-apart-")
    try:
        for index, result, end in _replayed(cluster, routed, worker_count(jobs, count), folder.name):
            results[index] = result
            cluster.end_time = max(cluster.end_time, end)  # (on one clock: when its last engine ended)
            done += len(result.metrics.requests)
            if cluster.on_progress is not None:
                cluster.on_progress(done)
    except BaseException:
        folder.cleanup()
        raise
    # in the one clock's order, merged as they are read; each replica's metrics.requests are its
    # own file's (read in if asked for); each record's replica is the merge's (none has a decode replica)
    cluster.records = MergedRecords([result.metrics.requests for result in results], folder)
    for result in results:  # (each replica's files stay while anything reads them)
        result.metrics.requests.folder = folder
        if result.metrics.span_tally is not None:
            result.metrics.span_tally.folder = folder
    cluster.record_replica = cluster.record_decode = cluster.record_time = None
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
    queued entries cost ~120; a replica's queue is built as it is replayed (_queue). The router
    knows a request by its trace record's fields (Cluster.routed_request): none is built here."""
    workload = cluster.requests  # (a Workload: the static feed's requests, released at their arrival times)
    routed = [(array("d"), array("i")) for _ in cluster.replicas]
    routed_request, entry, host_s = cluster.routed_request, cluster.entry, cluster.host_s
    for index, (arrival, record) in enumerate(zip(workload.arrival_times, workload.records())):
        # (each request's id is its place in the workload, as Workload builds it)
        replica, at = entry(routed_request(index, record.prompt_len, record.prompt_token_ids), arrival + host_s)
        times, indices = routed[replica.index]
        times.append(at)
        indices.append(index)
    cluster.feed.release_all()
    return routed


def _queue(replica, routed: tuple[array, array], requests: list) -> None:
    """The replica's queue of requests to enter: the heap the cluster's deliveries keep on one
    clock, (enters at, order, request), each request built here. (Routed in time order, the list
    is a heap already.)"""
    times, indices = routed
    replica.feed.pending = [(at, order, requests[i]) for order, (at, i) in enumerate(zip(times, indices))]
    heapq.heapify(replica.feed.pending)


def _replayed(cluster, routed: list, jobs: int, folder: str):
    """(replica index, its ReplayResult, when it ended), as each is
    done. folder: where each replica's records and token gaps are left (_spilled)."""
    if jobs == 1:
        for replica in cluster.replicas:
            _queue(replica, routed[replica.index], cluster.requests)
            yield _spilled(replica.index, _replay(replica, cluster, folder), folder)
        return
    global _APART
    # (each worker reads its replicas' routed requests from files, and is forked without them)
    for index, (times, indices) in enumerate(routed):
        with open(os.path.join(folder, f"routed{index}"), "wb") as file:
            times.tofile(file)
            indices.tofile(file)
    routed.clear()
    _APART = cluster, folder  # (the workers are forked: they find it here, nothing is pickled to them)
    try:
        with multiprocessing.get_context("fork").Pool(jobs, initializer=_worker_start) as pool:
            # (the workers have their copies: this process needs the arrival times no more; the
            # workload is the one every replica and the feed share, so they all let them go)
            cluster.requests.clear()
            # (each result comes pickled by its worker and is unpickled here: a result that cannot
            # be rebuilt raises in this thread, where the pool's own unpickling would end its
            # result thread and leave this loop waiting for ever)
            for pickled in pool.imap_unordered(_replay_index, range(len(cluster.replicas))):
                yield pickle.loads(pickled)
    finally:
        _APART = None


def _worker_start() -> None:
    from pagesim.children import die_with_parent

    die_with_parent()


def _replay_index(index: int):
    cluster, folder = _APART
    replica = cluster.replicas[index]
    path = os.path.join(folder, f"routed{index}")
    count = os.path.getsize(path) // 12  # (a float and an int each)
    times, indices = array("d"), array("i")
    with open(path, "rb") as file:
        times.fromfile(file, count)
        indices.fromfile(file, count)
    os.remove(path)
    _queue(replica, (times, indices), cluster.requests)
    del times, indices
    replayed = _replay(replica, None, folder)
    replica.sim = None  # (its result goes to the parent: this worker keeps nothing of it for its next replica)
    return pickle.dumps(_spilled(index, replayed, folder), protocol=pickle.HIGHEST_PROTOCOL)


def _spilled(index: int, replayed: tuple, folder: str) -> tuple:
    """(index, result, when it ended), the result's records and when each left written to files
    in folder (pagesim.cluster.spill; its token gaps were, as it packed: _replay), which the parent
    reads a stretch at a time: unpickled, every replica's records and gaps would lie in the parent
    at once (at 1M requests, ~80 and ~65 bytes a request)."""
    from pagesim.cluster.spill import SpilledRecords

    result, left, end = replayed
    result.metrics.requests = SpilledRecords.write(result.metrics.requests, left, _stem(folder, index))
    return index, result, end


def _stem(folder: str, index: int) -> str:
    return os.path.join(folder, f"replica{index}-")


def _replay(replica, cluster, folder: str) -> tuple:
    """Replay one replica alone on its own clock: its routed requests enter at their times (as the
    cluster's deliveries would have them enter), its engine runs until they are all done.
    cluster: where progress is reported as records leave (in-process), or None. folder: where its
    token gaps go as it packs (spill.SpilledGaps)."""
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
    from pagesim.cluster.spill import SpilledGaps

    # (its records as columns: what the parent merges, in a fifth of the memory; its gaps to a file)
    result.metrics.pack(gaps=lambda tally: SpilledGaps.write(tally, _stem(folder, replica.index)))
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
    ordered those); a run apart merges its replicas' files in the same order (spill.MergedRecords)."""
    import numpy as np

    order = np.lexsort((np.frombuffer(replicas, dtype=np.int32), np.frombuffer(times, dtype=np.float64)))
    cluster.records = [records[i] for i in order.tolist()]
    for name, column, dtype in (("record_replica", replicas, np.int32), ("record_decode", decodes, np.int32),
                                ("record_time", times, np.float64)):
        setattr(cluster, name, array(column.typecode, np.frombuffer(column, dtype=dtype)[order].tobytes()))
