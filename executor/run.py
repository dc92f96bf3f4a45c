"""Serving a trace on the real engine in wall-clock time, with the simulator's metrics schema.

Requests arrive at the same times the simulator would submit them (pagesim.workload.requests);
when the engine is idle the driver sleeps until the next arrival.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from executor.engine import EngineConfig, LLMEngine
from executor.models.loader import LoadedModel
from executor.noise import NoiseControl
from pagesim.core import Request
from pagesim.metrics import MetricsRecorder
from pagesim.workload.requests import WorkloadConfig, synthetic_prompt, time_origin
from pagesim.workload.trace import Trace


@dataclass
class RunConfig(WorkloadConfig):
    """The workload (WorkloadConfig, as the simulator replays it) and the run's clock."""

    clock: str = "wall"  # wall | cpu (see RunClock)
    # noise control on the step clock (executor.noise.NoiseControl; the profiler applies the same)
    pin_cpu: int | None = None
    gc_during_steps: bool = False
    warmup_steps: int = 4

    def noise_control(self) -> NoiseControl:
        return NoiseControl(pin_cpu=self.pin_cpu, gc_during_steps=self.gc_during_steps, warmup_steps=self.warmup_steps)


class RunClock:
    """The run's time base. "wall": perf_counter, idle gaps slept through. "cpu": this thread's
    CPU time (time.thread_time) and idle gaps skipped to the next arrival, so that a run with one
    torch thread measures the work it did, not the load other processes put on the machine."""

    def __init__(self, kind: str = "wall", start: float = 0.0):
        if kind not in ("wall", "cpu"):
            raise ValueError(f"clock must be 'wall' or 'cpu', got {kind!r}")
        self.kind = kind
        self._read = time.perf_counter if kind == "wall" else time.thread_time
        self._offset = start - self._read()  # reads `start` now (a trace's first arrival may be a Unix time)

    def __call__(self) -> float:
        return self._read() + self._offset

    def wait_until(self, t: float) -> None:
        gap = t - self()
        if gap <= 0:
            return
        if self.kind == "wall":
            time.sleep(gap)
        else:
            self._offset += gap


def trace_requests(trace: Trace, run_cfg: RunConfig) -> tuple[list[Request], list[str]]:
    if run_cfg.concurrency is not None:
        # (its loop submits at arrival times; sessions' turns go as independent requests, docs/traces.md)
        raise ValueError("the executor replays open loop: closed-loop load (concurrency) is replay's and bench's "
                         "(pagesim bench against pagesim serve runs the executor closed loop)")
    return run_cfg.requests(trace)


def run_trace(lm: LoadedModel, trace: Trace, engine_cfg: EngineConfig, run_cfg: RunConfig, progress=None,
              step_shapes: list | None = None):
    """Returns (summary dict, MetricsRecorder). With step_shapes (a list), appends each step's
    (BatchShape, measured seconds) to it: the step log a cost model is checked against."""
    requests, notes = trace_requests(trace, run_cfg)
    noise = run_cfg.noise_control()
    noise.apply()
    noise.warm_up(lm, engine_cfg.block_size)
    engine = LLMEngine(lm, engine_cfg)
    origin = time_origin(requests, run_cfg.rate)
    metrics = MetricsRecorder(engine_cfg.num_gpu_blocks, run_cfg.warmup_s, origin=origin)
    done = 0
    pending = list(requests)
    clock = RunClock(run_cfg.clock, start=origin)

    def record(group) -> None:
        nonlocal done
        metrics.record_request(group)
        engine.finished_beams.pop(group.request_id, None)  # a trace run keeps metrics, not beams
        done += 1
        if progress is not None:
            progress(done)

    while pending or engine.has_unfinished():
        now = clock()
        while pending and pending[0].arrival_time <= now:
            req = pending.pop(0)
            if req.prompt_token_ids is None and req.prompt_len + req.sampling.max_tokens > engine.max_model_len:
                # the core rejects it for its length; building its prompt first could take minutes
                group = engine.scheduler.add_request(req)
            else:
                ids = req.prompt_token_ids or synthetic_prompt(req, lm.vocab_size, run_cfg.seed)
                group = engine.add_request(ids, req.sampling, req.arrival_time, req.request_id)
            if group.reject_reason:
                record(group)
        if not engine.has_unfinished():
            if pending:
                clock.wait_until(pending[0].arrival_time)
            continue
        with noise.step():
            began = clock()
            stats = engine.step(clock)
            ended = clock()
        metrics.record_step(stats.out, ended, ended - began, engine.scheduler)  # first: it holds their last token times
        if step_shapes is not None:
            step_shapes.append((stats.shape, ended - began))
        for group in stats.finished:
            record(group)
    summary = metrics.summary(
        driver="executor", engine=asdict(engine_cfg), run=asdict(run_cfg), notes=notes,
        model=lm.name, device=str(lm.device),
        num_kv_blocks=engine_cfg.num_gpu_blocks, kv_token_slots=engine_cfg.num_gpu_blocks * engine_cfg.block_size,
    )
    return summary, metrics
