"""Continued fleet probes: one cluster run over a probe's whole cap of arrivals, judged at
checkpoints, as pagesim.plan.continued judges one replica's replay (docs/plan.md, "Continued
probes"): the first n requests' checkpoint runs the cluster on until every one of them has left
it (as its client saw it: under P/D from its decode replica), and pauses at the first moment
after that departure (Cluster.launch: pausing between SimPy events changes nothing simulated);
a longer checkpoint continues from there. Later arrivals keep being routed while the first n
drain, so a checkpoint's judged requests are, if anything, more loaded than a restarted run's.

The summary is the judged requests' and the window's, as a replica's checkpoint's
(pagesim.plan.continued.judged_summary), pooled over the replicas as the cluster summary pools
them (KV utilization weighted by each replica's step time, the peak the largest replica's), plus
a `cluster` section for the imbalance figures: each replica's share of the judged requests and its
busy time up to the moment the last of them left.

Async output (tokens reach the client a step late): a record's times are delivered as the
cluster's finish() would, once the step after its finish has begun on its replica; pausing just
after the deciding departure, every replica's next step is then logged, in progress (its
(end, duration) kept from the step hooks) or not begun before the finish, which settles it."""

from __future__ import annotations

import math
from array import array

import simpy

from pagesim.cluster.cluster import Cluster
from pagesim.cluster.results import client_record, imbalance
from pagesim.plan.continued import Checkpoint, _Target, judged_summary
from pagesim.workload.trace import Trace


class ContinuedCluster:
    """One Cluster of spec (its configurations' num_requests: the cap) on a clock that can pause.
    checkpoint(n) for any n up to the cap, in any order; the cluster only moves forward. Raises
    CannotServe (and ValueError for a trace the cluster cannot replay) as Cluster does."""

    def __init__(self, spec, trace: Trace, warmup_fraction: float, cost_models: dict | None = None):
        self.spec, self.cfg, self.warmup_fraction = spec, spec.groups[0].cfg, warmup_fraction
        self.cluster = cluster = Cluster(spec, trace, keep_steps=False, cost_models=cost_models)
        self.env = simpy.Environment()
        self.done = cluster.launch(self.env)
        cluster.on_progress = self._departed
        replicas = cluster.replicas
        self._in_step: list[tuple[float, float] | None] = [None] * len(replicas)  # each one's latest step begun
        for r in replicas:
            self._hook(r)
        self._busy = array("d")  # per departure, every replica's busy time then (len(replicas) values)
        self._kv = array("d")  # per departure: utilization time and step time summed, largest peak share
        self._delivered = [0] * len(replicas)  # records whose times are final, per replica
        self._target: _Target | None = None
        self._decided: simpy.Event | None = None

    @property
    def cap(self) -> int:
        return len(self.cluster.requests)

    def simulated_arrivals(self) -> int:
        """Requests routed so far (each once, whatever its stages)."""
        return sum(r.sim.num_submitted for r in self.cluster.replicas if r.role != "decode")

    def checkpoint(self, n: int) -> Checkpoint:
        if not 1 <= n <= self.cap:
            raise ValueError(f"a checkpoint of {n} requests in a cluster run of {self.cap}")
        target = _Target(n, self.warmup_fraction * n / self.cfg.rate, None, n)
        for record in self.cluster.records:
            target.see(_client(record), None)  # what already happened decides it, perhaps
        if target.end is None:
            self._target, self._decided = target, self.env.event()
            try:
                self.env.run(until=self._decided | self.done)
            finally:
                self._target = None
            if target.end is None:
                raise RuntimeError(f"the cluster run ended before its first {n} requests left")
        self._deliver()
        return self._judged(target)

    def _hook(self, replica) -> None:
        """Keep each replica's latest step begun (chained before the cluster's own hooks)."""
        k, steps, sim = replica.index, self._in_step, replica.sim
        on_step, on_run = sim.on_step, sim.on_decode_run

        def step(end: float, duration: float, shape) -> None:
            steps[k] = (end, duration)
            if on_step is not None:
                on_step(end, duration, shape)

        def run(ends, durations, num_seqs, context_tokens) -> None:
            steps[k] = (ends[0], durations[0])
            if on_run is not None:
                on_run(ends, durations, num_seqs, context_tokens)
        sim.on_step, sim.on_decode_run = step, run

    def _departed(self, _num_done: int) -> None:
        util = step_time = peak = 0.0
        for r in self.cluster.replicas:
            log, blocks = r.sim.metrics.step_log, r.sim.pool.num_device_blocks
            self._busy.append(log.duration_sum)
            util += log.utilization_time
            step_time += log.duration_sum
            peak = max(peak, log.peak_used / blocks if blocks and len(log) else 0.0)
        self._kv.extend((util, step_time, peak))
        target = self._target
        if target is not None and target.end is None:
            target.see(_client(self.cluster.records[-1]), None)
            if target.end is not None:  # decided: pause at the first moment after now
                env, decided = self.env, self._decided
                timer = env.timeout(math.nextafter(env.now, math.inf) - env.now)
                timer.callbacks.append(lambda _event: decided.succeed())

    def _deliver(self) -> None:
        """Every record left so far gets its client's times (Replay.deliver), once."""
        for k, r in enumerate(self.cluster.replicas):
            done, log = r.sim.metrics.requests, r.sim.metrics.step_log
            step = self._in_step[k]
            begun = step if step is not None and (not len(log) or step[0] > log.time[-1]) else None  # not logged yet
            for record in done[self._delivered[k]:]:
                r.sim.deliver(record, begun)
            self._delivered[k] = len(done)

    def _judged(self, target: _Target) -> Checkpoint:
        cluster, end, n = self.cluster, target.end, target.n
        replicas = len(cluster.replicas)
        judged, served = [], [0] * replicas
        for i, record in enumerate(cluster.records[:end + 1]):
            if _client(record).request_id >= n:
                continue
            judged.append(client_record(record))
            served[cluster.record_replica[i]] += 1
            if cluster.record_decode[i] >= 0:
                served[cluster.record_decode[i]] += 1
        util, step_time, peak = self._kv[3 * end:3 * end + 3]
        blocks = sum(r.sim.pool.num_device_blocks for r in cluster.replicas)
        summary = judged_summary(judged, util / step_time if step_time else 0.0, peak, blocks)
        busy = list(self._busy[replicas * end:replicas * (end + 1)])
        summary["cluster"] = {
            "groups": [{"name": g.name, "count": g.count, "role": g.role} for g in self.spec.groups],
            "requests_per_replica": served, "busy_s_per_replica": busy,
            "imbalance": {**imbalance("requests", served), **imbalance("busy", busy)},
        }
        return Checkpoint(n, target.warmup_s, judged, summary)


def _client(record):
    """The record a request's client goes by: a P/D pair's decode record."""
    return record[1] if isinstance(record, tuple) else record
