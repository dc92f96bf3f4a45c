"""A recorded real run, replayed through the simulator and compared (`pagesim validate`).

RealRun (pagesim.realruns) -> the replay's configuration (server settings as recorded, flags
override) -> the replay with the same arrivals and lengths -> predicted beside measured:
mean / median / p90 / p99 of TTFT, TPOT and E2E, the mean ITL and the throughput, with signed
errors (predicted / measured - 1), over the whole run and per load stage.

What the comparison counts: requests that succeeded in the real run and finished in the
replay. The measured ITL is the token-weighted mean gap, sum(E2E - TTFT) / sum(output - 1),
which is what vLLM's mean ITL pools; its percentiles need per-token times, which these runs do
not record, so TPOT (per request) carries the percentiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagesim.metrics import percentile
from pagesim.sim.cost.engine import DEFAULT_ENGINE
from pagesim.sim.engine import Replay, ReplayConfig, shared_workload, with_policy_presets

if TYPE_CHECKING:  # (the engine fit, numpy's least squares with it, is imported by the calls that fit)
    from pagesim.engine_fit import FitRun

METRICS = ("ttft", "tpot", "e2e")
# Runs of an engine older than vLLM v1 (DistServe's early-2024 fork) replay the paper's system.
V1_FIRST_VERSION = (0, 8)


class ValidateError(ValueError):
    """A run pagesim cannot replay; the message names what is missing."""


def engine_for(version: str | None) -> str:
    """The shipped engine profile for a recorded vLLM version: none recorded, the newest; a
    version before v1, or a fork without a version number, the paper-era engine."""
    if version is None:
        return DEFAULT_ENGINE
    parsed = _version(version)
    if parsed is None or parsed < V1_FIRST_VERSION:
        return "paper"
    return "vllm-0.15" if parsed < (0, 16) else "vllm-0.19"


# GPU names as runs record them (nvidia-smi's, a cluster file's), letters and digits only -> catalog
GPU_NAMES = (("a10080", "a100-80gb"), ("a10040", "a100-40gb"), ("h100", "h100-80gb"), ("h200", "h200-141gb"),
             ("rtxpro6000", "rtx-pro-6000-96gb"), ("l40s", "l40s-48gb"), ("4090", "rtx-4090-24gb"), ("a40", "a40-48gb"))


def catalog_gpu(recorded: str) -> str:
    """The catalog name of a GPU as a run records it (unknown names pass through to the catalog)."""
    key = "".join(ch for ch in recorded.lower() if ch.isalnum())
    key = key.replace("sxm4", "").replace("sxm5", "").replace("sxm", "").replace("nvidia", "")
    for pattern, name in GPU_NAMES:
        if pattern in key:
            return name
    return recorded


def _version(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    parts = str(text).lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None


def client_timeout(run) -> float | None:
    """The client's timeout, where the failed requests tell it: at least 10 of them, all abandoned
    within 5 % of the same time after their arrival (inference-perf's 300 s)."""
    times = sorted(r.abandoned_after_s for r in run.requests if not r.ok and r.abandoned_after_s)
    if len(times) >= 10 and times[-1] <= 1.05 * times[0]:
        return float(round(times[0]))
    return None


def kept_up(run) -> bool:
    """Whether the real server kept up with the run's load: no client timeouts and a median TTFT
    under a second. A run that did not is queue-dominated: it says little about step times and
    much about the queue, so it is left out of engine fits (and kept to judge them)."""
    if client_timeout(run) is not None:
        return False
    ttfts = sorted(r.ttft_s for r in run.requests if r.ok and r.ttft_s is not None)
    return bool(ttfts) and percentile(ttfts, 50) < 1.0


def replay_config(run, **overrides) -> tuple[ReplayConfig, list[str]]:
    """The replay of a real run: its recorded server settings, `overrides` (ReplayConfig fields,
    None = not given) on top. Returns the config and what was assumed."""
    s = run.server
    notes = []
    given = {k: v for k, v in overrides.items() if v is not None}
    model = given.pop("model", None) or s.model_config or s.model
    gpu = given.pop("gpu", None) or s.gpu
    if not model:
        raise ValidateError(f"{run.path}: the run does not record its model: give --model (a catalog name or config.json)")
    if not gpu:
        raise ValidateError(f"{run.path}: the run does not record its GPU: give --gpu (a catalog name)")
    gpu = catalog_gpu(gpu)
    recorded_engine = engine_for(s.engine_version)
    engine = given.pop("engine", None) or recorded_engine
    v1 = recorded_engine != "paper"  # the scheduler is the run's, whichever engine profile prices it
    options = {"model": model, "gpu": gpu, "engine": engine, "policy": "vllm-v1" if v1 else "paged",
               "rate": None, "num_requests": None, "tp": s.tensor_parallel_size or 1}
    if (s.data_parallel_size or 1) > 1 and s.enable_expert_parallel:
        options["ep"] = s.data_parallel_size * (s.tensor_parallel_size or 1)
    if s.kv_cache_dtype and s.kv_cache_dtype != "auto":
        options["kv_cache_dtype"] = s.kv_cache_dtype
    for name, value in (("max_num_seqs", s.max_num_seqs), ("max_num_batched_tokens", s.max_num_batched_tokens),
                        ("num_gpu_blocks", s.num_gpu_blocks), ("block_size", s.block_size),
                        ("prefix_caching", s.enable_prefix_caching), ("chunked_prefill", s.enable_chunked_prefill),
                        ("gpu_memory_utilization", s.gpu_memory_utilization), ("max_model_len", s.max_model_len)):
        if value is not None:
            options[name] = value
    clients = given.pop("concurrency", None)
    if clients is None:
        clients = closed_loop_clients(run)
        if clients:
            notes.append(f"a closed-loop run ({clients} clients): replayed closed loop, each request sent when one "
                         "of the replay's own ended (--concurrency 0: at the recorded send times)")
        staged = stage_clients(run)
        if staged and (s.data_parallel_size or 1) == 1:
            plan = ", ".join(f"{n} clients" if n else "recorded gaps" for n in staged)
            notes.append(f"{len(staged)} stages, closed-loop ones among them: replayed one after another, each "
                         f"starting when the previous stage's last request ended in the replay ({plan}; "
                         "--concurrency 0: every stage at the recorded send times)")
    if clients:
        options["concurrency"] = clients
    timeout = client_timeout(run)
    if timeout:
        options["client_timeout_s"] = timeout
        notes.append(f"the client gave up after {timeout:g} s: requests not finished by then are aborted in the replay")
    if s.engine_version is None and overrides.get("engine") is None:
        notes.append(f"vLLM version not recorded: engine profile {engine!r} (give --engine to choose)")
    options.update(given)
    try:
        return ReplayConfig(**with_policy_presets(options)), notes
    except (KeyError, ValueError) as e:
        raise ValidateError(f"{run.path}: {e.args[0] if isinstance(e, KeyError) else e}") from None


def closed_loop_clients(run) -> int | None:
    """The client count of a run that was one closed-loop stage (pagesim.realruns.Stage.closed_loop);
    None otherwise (several stages: stage_clients)."""
    if len(run.stages) == 1 and run.stages[0].closed_loop and run.stages[0].concurrency:
        return run.stages[0].concurrency
    return None


def stage_clients(run) -> list[int | None] | None:
    """Per stage of a run of several stages with a closed-loop one among them (a guidellm sweep of
    concurrencies, say): its client count, None for an open-loop stage. None for other runs."""
    if len(run.stages) > 1 and any(s.closed_loop and s.concurrency for s in run.stages):
        return [s.concurrency if s.closed_loop else None for s in run.stages]
    return None


def staged_replay(cfg: ReplayConfig, run, trace, keep_steps: bool) -> Replay:
    """A multi-stage closed-loop run's replay: its stages in order through a StagedFeed, each
    closed loop with its own clients or at its recorded gaps (pagesim.workload.sessions)."""
    from pagesim.workload.requests import time_origin
    from pagesim.workload.sessions import StagedFeed

    workload = shared_workload(cfg, trace)
    requests = workload[0]
    by_stage: dict[int, list] = {s.index: [] for s in run.stages}
    for real, request in zip(run.requests, requests):
        if (real.stage or 0) not in by_stage:
            raise ValidateError(f"{run.path}: request {real.index} is in stage {real.stage}, which the run does not list")
        by_stage[real.stage or 0].append(request)
    clients = stage_clients(run)
    feed = StagedFeed([(by_stage[s.index], n) for s, n in zip(run.stages, clients)], time_origin(requests, None))
    return Replay(cfg, trace, keep_steps=keep_steps, feed=feed, requests=workload)


def fit_run(run, **overrides) -> FitRun:
    """The run as the engine fit replays it (pagesim.engine_fit): same configuration as validate."""
    from pagesim.engine_fit import FitRun, MeasuredRequest

    run, _ = one_rank(run)
    cfg, _ = replay_config(run, **overrides)
    measured = [MeasuredRequest(i, r.ttft_s, r.e2e_s, r.generated_len, r.stage or 0)
                for i, r in enumerate(run.requests) if r.ok]
    return FitRun(run.name, cfg, run.to_trace(), measured)


# ----------------------------------------------------------------------------- comparison

@dataclass
class Sample:
    """Per request: TTFT, TPOT (None for one token), E2E and output tokens; the stage."""

    ttft: list = field(default_factory=list)
    tpot: list = field(default_factory=list)
    e2e: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    arrivals: list = field(default_factory=list)

    def add(self, ttft: float, e2e: float, output_len: int, arrival: float) -> None:
        self.ttft.append(ttft)
        self.e2e.append(e2e)
        self.tpot.append((e2e - ttft) / (output_len - 1) if output_len > 1 else None)
        self.outputs.append(output_len)
        self.arrivals.append(arrival)

    def stats(self) -> dict:
        out = {}
        for metric in METRICS:
            values = sorted(v for v in getattr(self, metric) if v is not None)
            if not values:
                continue
            out[f"{metric}_mean"] = sum(values) / len(values)
            out[f"{metric}_median"] = percentile(values, 50)
            out[f"{metric}_p90"] = percentile(values, 90)
            out[f"{metric}_p99"] = percentile(values, 99)
        gaps = sum(e - t for e, t, n in zip(self.e2e, self.ttft, self.outputs) if n > 1)
        tokens = sum(n - 1 for n in self.outputs if n > 1)
        if tokens:
            out["itl_mean"] = gaps / tokens
        if self.arrivals:
            span = max(a + e for a, e in zip(self.arrivals, self.e2e)) - min(self.arrivals)
            if span > 0:
                out["output_throughput"] = sum(self.outputs) / span
        out["count"] = len(self.e2e)
        return out


def compare(measured: dict, predicted: dict) -> dict:
    """{metric: {measured, predicted, error}} with error = predicted / measured - 1."""
    rows = {}
    for key, real in measured.items():
        if key == "count" or key not in predicted:
            continue
        pred = predicted[key]
        error = pred / real - 1 if real else None
        rows[key] = {"measured": real, "predicted": pred,
                     "error": error if error is not None and math.isfinite(error) else None}
    return rows


@dataclass
class Validation:
    run: object
    config: ReplayConfig
    notes: list[str]
    overall: dict
    stages: dict  # stage index -> comparison
    counts: dict
    replay: object  # the ReplayResult
    request_ids: list[int]  # the real run's request index of each replayed request
    observations: list[str] = field(default_factory=list)  # what the real run shows that bears on the errors

    def to_json(self) -> dict:
        from dataclasses import asdict

        return {"run": self.run.name, "format": self.run.source_format, "path": str(self.run.path),
                "config": asdict(self.config), "notes": self.notes, "assumptions": list(self.run.assumptions),
                "observations": self.observations,
                "counts": self.counts, "overall": self.overall,
                "stages": {str(k): v for k, v in self.stages.items()},
                "cost_model": self.replay.summary.get("cost_model")}


def one_rank(run):
    """A data-parallel run as one rank sees it (what the engine fit replays; validate replays every
    rank, replay_ranks): every dp-th request (vLLM's front end balances
    requests over the ranks; round robin is the even share), the rest left out, said so."""
    dp = run.server.data_parallel_size or 1
    if dp <= 1:
        return run, []
    from dataclasses import replace

    kept = [r for i, r in enumerate(run.requests) if i % dp == 0]
    return replace(run, requests=kept), [f"data parallel {dp}: one rank replayed, with every {dp}th request "
                                         f"({len(kept)} of {len(run.requests)}; the ranks' experts shared with "
                                         f"expert parallelism {dp * (run.server.tensor_parallel_size or 1)})"]


DP_STATS_INTERVAL_S = 0.1  # vLLM's DP coordinator publishes the ranks' counts this often (its default)


def replay_ranks(cfg: ReplayConfig, trace, dp: int, keep_steps: bool, progress=None):
    """A data-parallel run's ranks as a lockstep cluster (pagesim.cluster.lockstep): the result of
    rank 0 (its steps) with every rank's requests and the cluster's summary."""
    from dataclasses import replace

    from pagesim.cluster.cluster import Cluster
    from pagesim.cluster.spec import ClusterSpec, ReplicaGroup

    spec = ClusterSpec([ReplicaGroup("ranks", cfg, dp)], router="dp-balance", staleness_s=DP_STATS_INTERVAL_S,
                       lockstep=True)
    cluster = Cluster(spec, trace, keep_steps=keep_steps)
    cluster.on_progress = progress
    result = cluster.run()
    first = result.results[0]
    first.metrics.requests[:] = result.requests
    return replace(first, summary=result.summary)


def running_slots(run, cfg) -> int:
    """The requests the real server could run at once: max_num_seqs on each data-parallel rank."""
    return cfg.max_num_seqs * (run.server.data_parallel_size or 1)


def overload_notes(run, slots: int) -> list[str]:
    """A note where the real server held more requests than it could run at once (its queue
    grew): there the measured per-token time rose with the held requests on the shared H100 runs,
    which the replay does not price, and the queue multiplies any step error (reports/sim2real.md)."""
    peak, when = run.peak_held()
    if peak <= slots:
        return []
    return [f"the real server held up to {peak:,} requests (at {when:.0f} s), {peak - slots:,} more than its "
            f"{slots:,} running slots: it was overloaded there. On the shared H100 runs the measured time per "
            "output token grew with the requests held beyond the running batch, which pagesim does not price, and "
            "a growing queue multiplies any step error into TTFT and E2E (reports/sim2real.md, 'Over time')"]


def validate(run, progress=None, keep_steps: bool = True, **overrides) -> Validation:
    """Replay `run` and compare (see the module docstring). keep_steps=False: no per-step records
    (nothing will write steps.csv; the comparison is the same)."""
    dp = run.server.data_parallel_size or 1
    cfg, notes = replay_config(run, **overrides)
    if dp > 1:
        result = replay_ranks(cfg, run.to_trace(), dp, keep_steps, progress)
        notes = [f"data parallel {dp}: all {dp} ranks replayed, stepping in lockstep (the MoE all-to-all joins "
                 f"them), behind vLLM's DP balancer (dp-balance: least waiting*4+running, counts read every "
                 f"{DP_STATS_INTERVAL_S:g} s); steps.csv holds rank 0's steps"] + notes
    else:
        staged = overrides.get("concurrency") is None and stage_clients(run)
        sim = staged_replay(cfg, run, run.to_trace(), keep_steps) if staged else \
            Replay(cfg, run.to_trace(), keep_steps=keep_steps)
        sim.on_progress = progress
        result = sim.run()
    records = {r.request_id: r for r in result.metrics.requests}
    real_all, sim_all = Sample(), Sample()
    real_stage: dict[int, Sample] = {}
    sim_stage: dict[int, Sample] = {}
    real_failed = failed_in_replay_only = 0
    for i, r in enumerate(run.requests):
        if not r.ok:
            real_failed += 1
            continue
        rec = records.get(i)  # every request has a record, finished or not
        if rec.status != "finished":
            failed_in_replay_only += 1
            continue
        stage = r.stage or 0
        # (the replay's own arrivals: a closed-loop replay sends when its own requests end)
        real_all.add(r.ttft_s, r.e2e_s, r.generated_len, r.arrival_s)
        sim_all.add(rec.ttft, rec.e2e_latency, r.generated_len, rec.arrival_time)
        real_stage.setdefault(stage, Sample()).add(r.ttft_s, r.e2e_s, r.generated_len, r.arrival_s)
        sim_stage.setdefault(stage, Sample()).add(rec.ttft, rec.e2e_latency, r.generated_len, rec.arrival_time)
    if not real_all.e2e:
        raise ValidateError(f"{run.path}: no request succeeded in both the real run and the replay")
    counts = {"requests": len(run.requests), "compared": len(real_all.e2e), "failed_real": real_failed,
              "failed_in_replay_only": failed_in_replay_only,
              "failed_in_replay": sum(1 for r in result.metrics.requests if r.status != "finished")}
    overall = compare(real_all.stats(), sim_all.stats())
    stages = {k: compare(real_stage[k].stats(), sim_stage[k].stats()) for k in sorted(real_stage)}
    return Validation(run, cfg, notes, overall, stages, counts, result, [r.index for r in run.requests],
                      overload_notes(run, running_slots(run, cfg)))


# ----------------------------------------------------------------------------- fit and held-out error

def fit_errors(run: FitRun, simulated: dict) -> dict:
    """compare() of a fit run's measured requests against a replay's (request id -> (ttft, e2e))."""
    real, sim = Sample(), Sample()
    arrivals = {i: r.arrival_time for i, r in enumerate(run.trace.requests)}
    for m in run.measured:
        if m.request_id in simulated:
            ttft, e2e = simulated[m.request_id]
            real.add(m.ttft_s, m.e2e_s, m.output_len, arrivals.get(m.request_id) or 0.0)
            sim.add(ttft, e2e, m.output_len, arrivals.get(m.request_id) or 0.0)
    return compare(real.stats(), sim.stats())


def leave_one_out(runs: list[FitRun], base, start, progress=None, refine: int = 1) -> dict:
    """For each run: the profile fitted on the others, and that profile's errors on it (a replay
    of the held-out run with the fold's parameters).

    Each fold starts from the windows of a replay of every run at `start` (the fit on all runs,
    so the fold's first solve is linearised around that schedule) and re-solves on its own
    training runs `refine` more times, replaying them at the fold's parameters; the held-out
    run's rows never enter its fold's solve."""
    from pagesim.engine_fit import PARAMS, params_from, replay_with, solve

    shared = [replay_with(run, start, base) for run in runs]
    out = {}
    for i, held in enumerate(runs):
        params = params_from(solve(shared[:i] + shared[i + 1:]))
        for _ in range(refine):
            params = params_from(solve([replay_with(run, params, base) for j, run in enumerate(runs) if j != i]))
        windows = replay_with(held, params, base)
        out[held.name] = {"params": {k: getattr(params, k) for k in PARAMS}, "refine": refine,
                          "errors": fit_errors(held, windows.simulated)}
        if progress is not None:
            progress(held.name, out[held.name])
    return out
