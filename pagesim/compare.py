"""Simulated against real: the same requests, with the same arrivals, on the executor and in the
simulator (cost model `profiled`), and the relative error of the summary metrics.

Both drivers take their requests from pagesim.workload.requests.build_requests with the same
rate, seed and count, run the same core with the same pool and limits, and record the same
metrics schema (pagesim.metrics); only the step durations differ (measured vs. fitted).
The executor part imports torch; the rest of this module does not.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pagesim.core.config import ServingConfig
from pagesim.workload.requests import WORKLOAD_DEFAULTS, WorkloadConfig

# (label, summary key): the quantities the calibration reports
METRICS = (
    ("request throughput (req/s)", "request_throughput"),
    ("output-token throughput (tok/s)", "output_token_throughput"),
    ("mean normalized latency (s/token)", "mean_normalized_latency"),
    ("p50 normalized latency (s/token)", "normalized_latency_p50"),
    ("p99 normalized latency (s/token)", "normalized_latency_p99"),
    ("TTFT p50 (s)", "ttft_p50"),
    ("mean batched requests", "mean_batched_requests"),
    ("preemptions", "num_preemptions"),
)
HEADLINE = ("request_throughput", "mean_normalized_latency", "mean_batched_requests")  # the 5% targets

SYSTEMS = {  # name -> (policy, preemption)
    "paged-recompute": ("paged", "recompute"),
    "paged-recompute-chunked": ("paged", "recompute"),  # with chunked prefill (CHUNKED_SYSTEMS)
    "paged-swap": ("paged", "swap"),
    "paged-auto": ("paged", "auto"),
    "orca-oracle": ("orca-oracle", "recompute"),
    "orca-pow2": ("orca-pow2", "recompute"),
    "orca-max": ("orca-max", "recompute"),
    "static": ("static", "recompute"),
}
CHUNKED_SYSTEMS = ("paged-recompute-chunked",)


def parse_system(name: str) -> tuple[str, str]:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}") from None


@dataclass
class CompareSettings:
    """What both runs share."""

    rate: float | None = WORKLOAD_DEFAULTS.rate
    num_requests: int = WORKLOAD_DEFAULTS.num_requests
    seed: int = WORKLOAD_DEFAULTS.seed
    block_size: int = 16
    num_gpu_blocks: int = 128
    num_cpu_blocks: int = 256
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    max_model_len: int = 1024
    clock: str = "cpu"  # the executor's clock; the profile should use the same
    sim_model: str = "smollm2-135m"  # catalog entry; the simulator only uses it to size the host pool
    cost_model: str = "profiled"  # the simulator's; against an endpoint without a profile, e.g. roofline
    gpu: str = "a100-40gb"  # catalog GPU, for cost models other than profiled
    n: int | None = None  # parallel samples of every request (None: the trace's own)
    prefix_caching: bool = False  # what the server runs (and so the simulator)
    concurrency: int | None = None  # closed-loop clients (both sides; served runs only)

    def serving(self, system: str) -> ServingConfig:
        """The serving system both drivers run for `system` (e.g. paged-swap)."""
        policy, preemption = parse_system(system)
        return ServingConfig(policy=policy, preemption=preemption, block_size=self.block_size,
                             max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                             max_model_len=self.max_model_len, chunked_prefill=system in CHUNKED_SYSTEMS,
                             prefix_caching=self.prefix_caching)

    def workload(self) -> WorkloadConfig:
        return WorkloadConfig(rate=self.rate, num_requests=self.num_requests, seed=self.seed, n=self.n,
                              concurrency=self.concurrency)


@dataclass
class Comparison:
    system: str
    executor: dict
    simulator: dict
    rows: list[dict] = field(default_factory=list)  # label, key, executor, simulator, rel_error
    executor_steps: list = field(default_factory=list)
    simulator_steps: list = field(default_factory=list)
    real: str = "executor"  # what the measured side was: "executor" in-process, "served" over HTTP
    step_fidelity: dict | None = None  # pagesim.fidelity.step_errors of the executor's steps (in-process only)

    def headline_within(self, tolerance: float) -> bool:
        return all(r["rel_error"] is not None and abs(r["rel_error"]) <= tolerance
                   for r in self.rows if r["key"] in HEADLINE)


def scaled_trace(trace, scale: float):
    """The trace with every prompt and output length divided by `scale` (rounded, at least 1), so
    that a CPU run of a ShareGPT-shaped workload takes minutes; the metadata records the scale."""
    from dataclasses import replace

    from pagesim.workload.trace import Trace

    if scale <= 0:
        raise ValueError(f"length scale must be positive, got {scale}")
    if scale == 1:
        return trace
    requests = [replace(r, prompt_len=max(1, round(r.prompt_len / scale)), output_len=max(1, round(r.output_len / scale)),
                        prompt_token_ids=None, shared_prefix_len=None, prefix_group=None) for r in trace.requests]
    return Trace(dict(trace.metadata, length_scale=scale), requests)


def relative_error(simulated, measured) -> float | None:
    if simulated is None or measured is None:
        return None
    if measured == 0:
        return 0.0 if simulated == 0 else None
    return (simulated - measured) / measured


def comparison_rows(executor: dict, simulator: dict) -> list[dict]:
    return [{"label": label, "key": key, "executor": executor.get(key), "simulator": simulator.get(key),
             "rel_error": relative_error(simulator.get(key), executor.get(key))} for label, key in METRICS]


def simulate(trace, system: str, settings: CompareSettings, profile_path: str | None):
    """The simulated run (no torch)."""
    from pagesim.sim.engine import Replay, ReplayConfig
    from pagesim.sim.specs import get_model

    spec = get_model(settings.sim_model)
    # a swap space of exactly num_cpu_blocks blocks as the simulator sizes blocks (Replay divides
    # swap_space_gib * 2**30 by the block's bytes; dividing by 2**30 is exact in floating point)
    block_bytes = spec.kv_bytes_per_token * settings.block_size
    cfg = ReplayConfig(**asdict(settings.serving(system)), **asdict(settings.workload()), model=settings.sim_model,
                       num_gpu_blocks=settings.num_gpu_blocks,
                       swap_space_gib=settings.num_cpu_blocks * block_bytes / 2**30,
                       cost_model=settings.cost_model, gpu=settings.gpu,
                       profile=str(profile_path) if profile_path else None,
                       force_profile=True)  # the profile is of the executor's model; --sim-model only sizes pools
    sim = Replay(cfg, trace)
    if sim.pool.num_host_blocks != settings.num_cpu_blocks:
        raise RuntimeError(f"host pool: simulator {sim.pool.num_host_blocks} blocks, executor {settings.num_cpu_blocks}")
    return sim.run()


def sim_cost_model(settings: CompareSettings, profile_path: str | None):
    """The cost model simulate() runs with (no torch)."""
    from pagesim.sim.cost import make_cost_model

    forced = {"force": True} if settings.cost_model == "profiled" else {}  # as in simulate()
    return make_cost_model(settings.cost_model, settings.sim_model, settings.gpu,
                           profile_path=str(profile_path) if profile_path else None, **forced)


def execute(lm, trace, system: str, settings: CompareSettings, progress=None, step_shapes: list | None = None):
    """The real run (torch): returns (summary, MetricsRecorder); appends each step's (BatchShape,
    seconds) to step_shapes if given."""
    from executor.engine import EngineConfig
    from executor.run import RunConfig, run_trace

    engine_cfg = EngineConfig(**asdict(settings.serving(system)), num_gpu_blocks=settings.num_gpu_blocks,
                              num_cpu_blocks=settings.num_cpu_blocks)
    run_cfg = RunConfig(**asdict(settings.workload()), clock=settings.clock)
    return run_trace(lm, trace, engine_cfg, run_cfg, progress=progress, step_shapes=step_shapes)


def compare(lm, trace, system: str, settings: CompareSettings, profile_path: str, progress=None,
            out_dir: Path | None = None) -> Comparison:
    """Run `system` on both drivers; with out_dir, write each run's metrics under out_dir/system/
    (the executor's step log as executor/step_shapes.csv)."""
    from pagesim.fidelity import step_errors
    from pagesim.sim.cost.step_shapes import write_step_shapes

    sim_result = simulate(trace, system, settings, profile_path)  # first: a bad profile fails fast
    shapes = []
    real_summary, real_metrics = execute(lm, trace, system, settings, progress, shapes)
    sim_summary = sim_result.summary
    result = Comparison(system, real_summary, sim_summary, comparison_rows(real_summary, sim_summary),
                        real_metrics.steps, sim_result.metrics.steps,
                        step_fidelity=step_errors(shapes, sim_cost_model(settings, profile_path)))
    if out_dir is not None:
        real_metrics.write(Path(out_dir) / system / "executor", real_summary)
        write_step_shapes(Path(out_dir) / system / "executor" / "step_shapes.csv", shapes)
        sim_result.metrics.write(Path(out_dir) / system / "simulator", sim_summary)
    return result


def compare_served(trace, system: str, settings: CompareSettings, endpoint: str, profile_path: str | None,
                   model: str | None = None, progress=None, out_dir: Path | None = None) -> Comparison:
    """The simulated run beside the same requests sent to a server over HTTP (`pagesim bench`);
    `system` names what the server runs (its policy and preemption), for the simulator to match."""
    from pagesim.bench.client import BenchConfig, run_bench

    sim_result = simulate(trace, system, settings, profile_path)
    bench_cfg = BenchConfig(endpoint=endpoint, model=model, rate=settings.rate, num_requests=settings.num_requests,
                            seed=settings.seed, concurrency=settings.concurrency)
    served, served_metrics = run_bench(trace, bench_cfg, progress)
    sim_summary = sim_result.summary
    result = Comparison(system, served, sim_summary, comparison_rows(served, sim_summary), [], sim_result.metrics.steps,
                        real="served")
    if out_dir is not None:
        served_metrics.write(Path(out_dir) / system / "served", served, steps=False)
        sim_result.metrics.write(Path(out_dir) / system / "simulator", sim_summary)
    return result


# ----------------------------------------------------------------------------- repeated runs

@dataclass
class RunSpec:
    """One of the runs a repeated comparison makes each round: a label (its folder and table
    name), the system, and the settings both drivers get (n, the rate, the pool ...)."""

    label: str
    system: str
    settings: CompareSettings


@dataclass
class RepeatedComparison:
    """K executor runs of one RunSpec beside the simulator's one (deterministic) run."""

    label: str
    system: str
    settings: CompareSettings
    runs: list[dict]  # per executor run: round, summary, speed (vs the simulator's cost model), wall_s ...
    simulator: dict
    bands: list[dict]  # pagesim.fidelity.band_row, one per METRICS entry
    step_fidelity: dict  # step_errors over the K runs' steps pooled

    def headline_met(self) -> bool:
        return all(r["target_met"] for r in self.bands if r["key"] in HEADLINE)


def profile_round(lm, path: Path, clock: str, block_size: int, grid=None, command: str = "") -> Path:
    """Profile the executor now (executor.profiler, same process and model) and write it to path."""
    from executor.profiler import profile_engine

    data = profile_engine(lm, grid, block_size=block_size, clock=clock, model_spec=lm.name, command=command)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def compare_repeated(lm, trace, specs: list[RunSpec], profile_path: str | None, repeat: int, out_dir: Path,
                     reprofile: bool = False, profile_grid=None, run_progress=None, log=print,
                     round1_profile: str | None = None) -> tuple[list[RepeatedComparison], str]:
    """`repeat` rounds; each round runs every spec once on the executor, in order (interleaved, so
    that slow drift of the machine hits every system alike). With reprofile, each round starts
    with a fresh profile (out_dir/profiles/round<r>.json) and the simulator uses the pooled one
    (pagesim.fidelity.pool_profiles: each shape's median over the rounds, out_dir/profiles/
    pooled.json), i.e. a profile measured over the same period as the runs; without, it uses
    profile_path. round1_profile: with reprofile, a profile the caller has just measured (of the
    same grid), used as round 1's instead of measuring again. run_progress(label, round) ->
    context manager giving a progress callback.
    Returns the comparisons and the profile the simulator used."""
    from contextlib import nullcontext

    from pagesim.fidelity import band_row, pool_profiles, speed_vs_profile, step_errors
    from pagesim.sim.cost.step_shapes import write_step_shapes
    from pagesim.sim.cost.profiled import ProfiledCostModel

    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    if not reprofile and not profile_path:
        raise ValueError("a profile is needed (or reprofile)")
    out_dir = Path(out_dir)
    runs = {s.label: [] for s in specs}
    shapes = {s.label: [] for s in specs}
    round_profiles = []
    settings0 = specs[0].settings
    for r in range(1, repeat + 1):
        if reprofile and r == 1 and round1_profile:
            round_profiles.append(Path(round1_profile))
        elif reprofile:
            started = time.perf_counter()
            round_profiles.append(profile_round(lm, out_dir / "profiles" / f"round{r}.json", settings0.clock,
                                                settings0.block_size, profile_grid, command=f"compare --reprofile, round {r}"))
            log(f"round {r}: profiled in {time.perf_counter() - started:.0f} s")
        round_model = ProfiledCostModel.from_profile(round_profiles[-1]) if reprofile else None  # fitted once a round
        for spec in specs:
            step_log = []
            started = time.perf_counter()
            with (run_progress(spec.label, r) if run_progress else nullcontext(None)) as advance:
                summary, metrics = execute(lm, trace, spec.system, spec.settings, advance, step_log)
            wall = time.perf_counter() - started
            run_dir = out_dir / spec.label / "executor" / f"run{r}"
            metrics.write(run_dir, summary)
            write_step_shapes(run_dir / "step_shapes.csv", step_log)
            own = speed_vs_profile(step_log, round_model) if reprofile else None
            runs[spec.label].append({"round": r, "wall_s": round(wall, 2), "summary": summary,
                                     "speed_vs_round_profile": own})
            shapes[spec.label].append(step_log)
            log(f"round {r}: {spec.label} in {wall:.0f} s")
    if reprofile:
        pooled = pool_profiles([json.loads(p.read_text()) for p in round_profiles])
        used = out_dir / "profiles" / "pooled.json"
        used.write_text(json.dumps(pooled, indent=1) + "\n")
        used = str(used)
    else:
        used = str(profile_path)
    results = []
    for spec in specs:
        cost = sim_cost_model(spec.settings, used)
        sim = simulate(trace, spec.system, spec.settings, used)
        if reprofile:  # name the pooled profile relative to the results, not where they were staged
            sim.summary["cost_model"]["profile"] = str(Path(used).relative_to(out_dir))
        sim.metrics.write(out_dir / spec.label / "simulator", sim.summary)
        for run, step_log in zip(runs[spec.label], shapes[spec.label]):
            run["speed_vs_profile"] = speed_vs_profile(step_log, cost)
            run["step_fidelity"] = step_errors(step_log, cost)
        bands = [band_row(label, key, [run["summary"].get(key) for run in runs[spec.label]], sim.summary.get(key))
                 for label, key in METRICS]
        pooled_steps = [step for step_log in shapes[spec.label] for step in step_log]
        results.append(RepeatedComparison(spec.label, spec.system, spec.settings, runs[spec.label], sim.summary, bands,
                                          step_errors(pooled_steps, cost)))
    return results, used


# ----------------------------------------------------------------------------- output

def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:.4g}"


def _pct(e) -> str:
    return "-" if e is None else f"{e * 100:+.1f} %"


def markdown_table(results: list[Comparison]) -> str:
    real = results[0].real if results else "executor"
    lines = [f"| system | metric | {real} | simulator | rel. error |", "|---|---|---:|---:|---:|"]
    for r in results:
        for row in r.rows:
            label = f"**{row['label']}**" if row["key"] in HEADLINE else row["label"]
            lines.append(f"| {r.system} | {label} | {_fmt(row['executor'])} | {_fmt(row['simulator'])} | "
                         f"{_pct(row['rel_error'])} |")
    return "\n".join(lines) + "\n"


def print_table(results: list[Comparison], console, title: str) -> None:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    real = results[0].real if results else "executor"
    for col, justify in (("system", "left"), ("metric", "left"), (real, "right"), ("simulator", "right"),
                         ("rel. error", "right")):
        table.add_column(col, justify=justify)
    for r in results:
        for row in r.rows:
            err = row["rel_error"]
            style = "bold" if row["key"] in HEADLINE else None
            table.add_row(r.system, row["label"], _fmt(row["executor"]), _fmt(row["simulator"]), _pct(err), style=style)
        table.add_section()
    console.print(table)


def plot(results: list[Comparison], path: Path, title: str = "") -> None:
    """Batch size (running requests) and KV usage over time, executor vs. simulator, one row per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(11, 2.8 * len(results)), squeeze=False)
    for row, r in zip(axes, results):
        for steps, label, style in ((r.executor_steps, r.real, "-"), (r.simulator_steps, "simulator", "--")):
            t = [s.time for s in steps]
            row[0].plot(t, [s.num_running_requests for s in steps], style, lw=1, label=label, drawstyle="steps-post")
            row[1].plot(t, [s.kv_utilization * 100 for s in steps], style, lw=1, label=label, drawstyle="steps-post")
        row[0].set_ylabel(f"{r.system}\nrunning requests")
        row[1].set_ylabel("KV blocks used (%)")
        row[0].legend(loc="upper right", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("time (s)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(results: list[Comparison], out_dir: Path, meta: dict) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "systems": {r.system: {"rows": r.rows, "executor": r.executor, "simulator": r.simulator,
                                                 "measured_by": r.real, "step_fidelity": r.step_fidelity}
                                      for r in results}}
    (out_dir / "compare.json").write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    md = markdown_table(results)
    with_steps = [(r.system, r.step_fidelity) for r in results if r.step_fidelity]
    if with_steps:
        md += "\n" + step_fidelity_table(with_steps)
    (out_dir / "compare.md").write_text(md)


STEP_TARGET = (0.05, 0.10)  # the step-level targets: median and p90 of |relative error|


def step_fidelity_table(rows: list[tuple[str, dict]]) -> str:
    """Markdown: the cost model's error on the executor's own steps, by step kind, per system
    (rows of (label, pagesim.fidelity.step_errors))."""
    from pagesim.core.step import STEP_KINDS

    lines = ["Step-level error of the cost model on the executor's own steps, (predicted - measured) / measured; "
             "a step that swaps counts as *with swap* whatever else it computes, one that copies (and does not "
             f"swap) as *with copy*. Target: median |error| <= {STEP_TARGET[0]:.0%}, p90 <= {STEP_TARGET[1]:.0%}.",
             "", "| system | step kind | steps | median abs. | p90 abs. | bias (mean) | target |",
             "|---|---|---:|---:|---:|---:|---|"]
    for label, kinds in rows:
        for kind in (*STEP_KINDS, "all"):
            e = kinds[kind]
            if not e["count"]:
                lines.append(f"| {label} | {kind} | 0 | - | - | - | - |")
                continue
            met = e["median_abs"] <= STEP_TARGET[0] and e["p90_abs"] <= STEP_TARGET[1]
            lines.append(f"| {label} | {kind} | {e['count']:,} | {e['median_abs'] * 100:.1f} % | "
                         f"{e['p90_abs'] * 100:.1f} % | {_pct(e['bias'])} | {'met' if met else 'missed'} |")
    return "\n".join(lines) + "\n"


def band_table(results: list[RepeatedComparison]) -> str:
    """Markdown: per system and metric, the executor's mean and 95 % band over its runs, the
    simulator's value, and whether it meets the target (inside the band or within 5 % of the mean)."""
    lines = ["| system | metric | runs | executor mean | 95 % band | simulator | vs mean | in band | target |",
             "|---|---|---:|---:|---|---:|---:|---|---|"]
    for r in results:
        for b in r.bands:
            label = f"**{b['label']}**" if b["key"] in HEADLINE else b["label"]
            band = "-" if b["low"] is None else f"{_fmt(b['low'])} - {_fmt(b['high'])}"
            band += " *clipped*" if "clipped" in (b.get("band_method") or "") else ""
            inside = "-" if b["inside_band"] is None else ("yes" if b["inside_band"] else "no")
            target = "-" if b["target_met"] is None else ("met" if b["target_met"] else "**missed**")
            lines.append(f"| {r.label} | {label} | {b['runs']} | {_fmt(b['mean'])} | {band} | {_fmt(b['simulator'])} | "
                         f"{_pct(b['rel_to_mean'])} | {inside} | {target} |")
    return "\n".join(lines) + "\n"


def drift_table(results: list[RepeatedComparison]) -> str:
    """Markdown: each executor run's speed against the profile (median measured / predicted time
    of its decode steps; > 1: slower than the profile) and its headline metrics."""
    own = any(run["speed_vs_round_profile"] is not None for r in results for run in r.runs)
    head = "| round | system | wall s | speed vs profile used |" + (" speed vs its round's profile |" if own else "")
    lines = [head + " req/s | mean norm. latency | mean batched | preemptions |",
             "|---:|---|---:|---:|" + ("---:|" if own else "") + "---:|---:|---:|---:|"]
    by_round = sorted(((run["round"], i, r, run) for i, r in enumerate(results) for run in r.runs),
                      key=lambda t: (t[0], t[1]))
    for rnd, _, r, run in by_round:
        s = run["summary"]
        cells = [str(rnd), r.label, f"{run['wall_s']:.0f}", _fmt(run["speed_vs_profile"])]
        if own:
            cells.append(_fmt(run["speed_vs_round_profile"]))
        cells += [_fmt(s.get("request_throughput")), _fmt(s.get("mean_normalized_latency")),
                  _fmt(s.get("mean_batched_requests")), _fmt(s.get("num_preemptions"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def repeated_markdown(results: list[RepeatedComparison]) -> str:
    return ("## Step-level fidelity (all runs pooled)\n\n"
            + step_fidelity_table([(r.label, r.step_fidelity) for r in results])
            + "\n## End to end: the executor's 95 % band against the simulator\n\n"
            + "Executor: mean of the runs and a 95 % interval for it (every metric here is positive: the Student t "
            + "interval of the logs, exponentiated, so a band never goes below 0; where a run measured 0, the t "
            + "interval clipped at 0, marked *clipped*); simulator: one deterministic run. "
            + "Target (bold metrics): the simulator inside the band or within 5 % of the mean.\n\n"
            + band_table(results)
            + "\n## Each run's speed against the profile (drift)\n\n" + drift_table(results))


def write_repeated_results(results: list[RepeatedComparison], out_dir: Path, meta: dict) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "systems": {r.label: {"system": r.system, "settings": asdict(r.settings), "runs": r.runs,
                                                "simulator": r.simulator, "bands": r.bands,
                                                "step_fidelity": r.step_fidelity,
                                                "headline_target_met": r.headline_met()}
                                      for r in results}}
    (out_dir / "compare.json").write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    (out_dir / "compare.md").write_text(repeated_markdown(results))
