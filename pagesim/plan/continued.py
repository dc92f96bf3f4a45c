"""Continued probes: one replay over a probe's whole cap of arrivals, judged at checkpoints.

A steady-state probe (pagesim.plan.run.probe_steady) asks for the record of n requests, then
2n, 4n ... until its verdict is decided. Restarting the replay for every length costs about
twice the final length (n + 2n + ... + N ~ 2N). A ContinuedReplay simulates ONE replay over the
cap's arrivals (the same seed: a run of n requests is the first n of it) and, asked for the
first n requests' checkpoint, runs on until every one of them has left (finished or rejected),
or until an SLO is certain to fail over them (pagesim.plan.slo.FailureWatch), and pauses there.
Asked for a longer checkpoint, it runs on from the pause: a probe that needs k extensions
simulates its final length once (plus the arrivals during its last requests' drain).

How a checkpoint differs from a restarted run of n requests (docs/plan.md, "Continued probes"):
- the judged requests and window are those of the restarted run: the first n requests, the
  warm-up the first warmup_fraction x n / rate seconds, the window from there to the n-th
  arrival;
- but later arrivals keep coming while the first n drain: no drain tail, the last judged
  requests see the load the steady state would give them, never less. Under FCFS later
  arrivals queue behind, so they can only delay the judged ones (joining their batch, taking
  KV blocks): the judged window is, if anything, more loaded, never flattered;
- the summary fields are the judged requests' and window's, not the whole replay's (Checkpoint).

Pausing changes nothing the replay simulates: it stops between SimPy events (as the engine
starts a step) and resumes with the same events in the same order, so a checkpoint is the same
whichever checkpoints were taken before it (tested), and a cache may hold checkpoints apart.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import simpy

from pagesim.metrics import reject_reasons, served_span
from pagesim.plan.slo import SLO, FailureWatch, request_latencies
from pagesim.sim.cost.base import CostModel
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace


@dataclass
class Checkpoint:
    """The first `num_requests` requests of a continued replay, judged as one run.

    requests: their RequestRecords, in the order they left (those that left before the stop,
    when `stopped` is set). summary: the run-summary fields a record needs, over them alone:
    - num_requests, num_finished, num_rejected, reject_reasons: the judged requests';
    - request_throughput, output_token_throughput: their finished requests (output tokens of every
      sequence) over the span from their first arrival to their last finish, as
      pagesim.metrics.summarize_requests counts a whole run's;
    - mean_kv_utilization (time-weighted over steps), peak_kv_utilization: the engine's steps up to
      the moment the last judged request left (or the stopping one did): the KV pool as the judged
      requests shared it, later arrivals' blocks included;
    - num_preemptions: the judged requests' own preemptions;
    - num_kv_blocks: the pool's size."""

    num_requests: int
    warmup_s: float
    requests: list
    summary: dict
    stopped: SLO | None = None  # the SLO certain to fail that stopped the checkpoint early


@dataclass
class _Target:
    """The checkpoint being run to, fed the replay's departures in the order they happen."""

    n: int
    warmup_s: float
    watch: FailureWatch | None
    left: int  # judged requests not yet departed
    end: int | None = None  # index of the departure that decided it (all judged left, or the stop)
    stopped: SLO | None = None
    seen: int = 0  # departures fed so far

    def see(self, record, latencies: dict) -> None:
        """One departure: its record and its latencies as they were when it left."""
        index = self.seen
        self.seen += 1
        if self.end is not None or record.request_id >= self.n:
            return
        self.left -= 1
        if self.watch is not None and record.status == "finished" and record.arrival_time >= self.warmup_s:
            self.stopped = self.watch.add(latencies)
        if self.stopped is not None or self.left == 0:
            self.end = index


@dataclass
class _Totals:
    """What each departure left behind (one entry per departure, in order): the step log's
    running totals, and its latencies as they were then, before async output delays its last
    token (Replay.deliver), so the failure watch sees the same values however the replay paused."""

    latencies: list = field(default_factory=list)
    utilization_time: array = field(default_factory=lambda: array("d"))
    step_time: array = field(default_factory=lambda: array("d"))
    peak_used: array = field(default_factory=lambda: array("q"))


class ContinuedReplay:
    """One Replay of cfg (its num_requests: the cap) on a clock that can pause (module docstring).
    checkpoint(n) for any n up to the cap, in any order; the replay only moves forward.
    Raises pagesim.core.errors.CannotServe where the Replay does (building it or running it)."""

    def __init__(self, cfg: ReplayConfig, trace: Trace, slos: list[SLO] | None, warmup_fraction: float,
                 cost_model: CostModel | None = None):
        """slos: stop a checkpoint once one is certain to fail over its measured requests (None:
        never); cost_model: instead of the one cfg names (as Replay takes it)."""
        self.cfg, self.slos, self.warmup_fraction = cfg, slos, warmup_fraction
        self.sim = sim = Replay(cfg, trace, cost_model=cost_model, keep_steps=False)
        self.env = simpy.Environment()
        self.engine = sim.launch(self.env)
        sim.on_progress = self._departed
        sim.on_step = lambda end, duration, _shape: self._step_starts(end, duration)
        sim.on_decode_run = lambda ends, durations, *_: self._step_starts(ends[0], durations[0])
        self._totals = _Totals()
        self._target: _Target | None = None
        self._pause: simpy.Event | None = None
        self._next_step: tuple[float, float] | None = None  # (end, duration) of the step paused at
        self._delivered = 0  # departures whose times are final (pagesim.sim.engine.Replay.deliver)

    @property
    def cap(self) -> int:
        return self.cfg.num_requests

    def checkpoint(self, n: int) -> Checkpoint:
        if not 1 <= n <= self.cap:
            raise ValueError(f"a checkpoint of {n} requests in a replay of {self.cap}")
        target = self._target_for(n)
        for record, latencies in zip(self.sim.metrics.requests, self._totals.latencies):
            target.see(record, latencies)  # what already happened decides it, perhaps
        if target.end is None:
            self._target, self._pause, self._next_step = target, self.env.event(), None
            try:
                self.env.run(until=self._pause | self.engine)
            finally:
                self._target = None
            if target.end is None:  # (the engine ended: every request has left)
                raise RuntimeError(f"the replay ended before its first {n} requests left")
        done = self.sim.metrics.requests
        for record in done[self._delivered:]:
            self.sim.deliver(record, self._next_step)
        self._delivered = len(done)
        return self._judged(target)

    def _target_for(self, n: int) -> _Target:
        warmup_s = self.warmup_fraction * n / self.cfg.rate
        first = self.sim.requests[:n]
        watch = None
        if self.slos:
            watch = FailureWatch(self.slos, sum(1 for r in first if r.arrival_time >= warmup_s))
        return _Target(n, warmup_s, watch, len(first))

    def _departed(self, _num_done: int) -> None:
        log, totals = self.sim.metrics.step_log, self._totals
        totals.utilization_time.append(log.utilization_time)
        totals.step_time.append(log.duration_sum)
        totals.peak_used.append(log.peak_used)
        record = self.sim.metrics.requests[-1]
        latencies = request_latencies(record)
        totals.latencies.append(latencies)
        if self._target is not None:
            self._target.see(record, latencies)

    def _step_starts(self, end: float, duration: float) -> None:
        """Pause as the first step after the decision starts: its end is then known, which async
        output needs to time the last departures (Replay.deliver)."""
        target = self._target
        if target is not None and target.end is not None and not self._pause.triggered:
            self._next_step = (end, duration)
            self._pause.succeed()

    def _judged(self, target: _Target) -> Checkpoint:
        end = target.end
        judged = [r for r in self.sim.metrics.requests[:end + 1] if r.request_id < target.n]
        blocks, totals = self.sim.pool.num_device_blocks, self._totals
        step_time = totals.step_time[end]
        mean_kv = totals.utilization_time[end] / step_time if step_time else 0.0
        peak_kv = totals.peak_used[end] / blocks if blocks and step_time else 0.0
        return Checkpoint(target.n, target.warmup_s, judged, judged_summary(judged, mean_kv, peak_kv, blocks),
                          target.stopped)


def judged_summary(judged: list, mean_kv: float, peak_kv: float, blocks: int) -> dict:
    """A checkpoint's summary fields (Checkpoint) from its judged requests' records and the KV
    pool's figures up to the moment the last of them left."""
    finished = [r for r in judged if r.status == "finished"]
    span = served_span(judged, finished)
    return {
        "num_requests": len(judged),
        "num_finished": len(finished),
        "num_rejected": len(judged) - len(finished),
        "reject_reasons": reject_reasons(judged),
        "request_throughput": len(finished) / span if span > 0 else 0.0,
        "output_token_throughput": sum(r.total_output_len for r in finished) / span if span > 0 else 0.0,
        "mean_kv_utilization": mean_kv,
        "peak_kv_utilization": peak_kv,
        "num_preemptions": sum(r.num_preemptions for r in judged),
        "num_kv_blocks": blocks,
    }
