"""Simulated against real: the same requests, with the same arrivals, on the executor and in the
simulator (cost model `profiled`), and the relative error of the summary metrics.

Both drivers take their requests from pagesim.workload.requests.build_requests with the same
rate, seed and count, run the same core with the same pool and limits, and record the same
metrics schema (pagesim.metrics); only the step durations differ (measured vs. fitted).
The executor part imports torch; the rest of this module does not.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pagesim.core.config import ServingConfig
from pagesim.workload.requests import WorkloadConfig

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
    "paged-swap": ("paged", "swap"),
    "paged-auto": ("paged", "auto"),
    "orca-oracle": ("orca-oracle", "recompute"),
    "orca-pow2": ("orca-pow2", "recompute"),
    "orca-max": ("orca-max", "recompute"),
    "static": ("static", "recompute"),
}


def parse_system(name: str) -> tuple[str, str]:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}") from None


@dataclass
class CompareSettings:
    """What both runs share."""

    rate: float | None = 1.0
    num_requests: int = 200
    seed: int = 0
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

    def serving(self, system: str) -> ServingConfig:
        """The serving system both drivers run for `system` (e.g. paged-swap)."""
        policy, preemption = parse_system(system)
        return ServingConfig(policy=policy, preemption=preemption, block_size=self.block_size,
                             max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                             max_model_len=self.max_model_len)

    def workload(self) -> WorkloadConfig:
        return WorkloadConfig(rate=self.rate, num_requests=self.num_requests, seed=self.seed)


@dataclass
class Comparison:
    system: str
    executor: dict
    simulator: dict
    rows: list[dict] = field(default_factory=list)  # label, key, executor, simulator, rel_error
    executor_steps: list = field(default_factory=list)
    simulator_steps: list = field(default_factory=list)
    real: str = "executor"  # what the measured side was: "executor" in-process, "served" over HTTP

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
                       profile=str(profile_path) if profile_path else None)
    sim = Replay(cfg, trace)
    if sim.pool.num_host_blocks != settings.num_cpu_blocks:
        raise RuntimeError(f"host pool: simulator {sim.pool.num_host_blocks} blocks, executor {settings.num_cpu_blocks}")
    return sim.run()


def execute(lm, trace, system: str, settings: CompareSettings, progress=None):
    """The real run (torch): returns (summary, MetricsRecorder)."""
    from executor.engine import EngineConfig
    from executor.run import RunConfig, run_trace

    engine_cfg = EngineConfig(**asdict(settings.serving(system)), num_gpu_blocks=settings.num_gpu_blocks,
                              num_cpu_blocks=settings.num_cpu_blocks)
    run_cfg = RunConfig(**asdict(settings.workload()), clock=settings.clock)
    return run_trace(lm, trace, engine_cfg, run_cfg, progress=progress)


def compare(lm, trace, system: str, settings: CompareSettings, profile_path: str, progress=None,
            out_dir: Path | None = None) -> Comparison:
    """Run `system` on both drivers; with out_dir, write each run's metrics under out_dir/system/."""
    sim_result = simulate(trace, system, settings, profile_path)  # first: a bad profile fails fast
    real_summary, real_metrics = execute(lm, trace, system, settings, progress)
    sim_summary = sim_result.summary
    result = Comparison(system, real_summary, sim_summary, comparison_rows(real_summary, sim_summary),
                        real_metrics.steps, sim_result.metrics.steps)
    if out_dir is not None:
        real_metrics.write(Path(out_dir) / system / "executor", real_summary)
        sim_result.metrics.write(Path(out_dir) / system / "simulator", sim_summary)
    return result


def compare_served(trace, system: str, settings: CompareSettings, endpoint: str, profile_path: str | None,
                   model: str | None = None, progress=None, out_dir: Path | None = None) -> Comparison:
    """The simulated run beside the same requests sent to a server over HTTP (`pagesim bench`);
    `system` names what the server runs (its policy and preemption), for the simulator to match."""
    from pagesim.bench.client import BenchConfig, run_bench

    sim_result = simulate(trace, system, settings, profile_path)
    bench_cfg = BenchConfig(endpoint=endpoint, model=model, rate=settings.rate, num_requests=settings.num_requests,
                            seed=settings.seed)
    served, served_metrics = run_bench(trace, bench_cfg, progress)
    sim_summary = sim_result.summary
    result = Comparison(system, served, sim_summary, comparison_rows(served, sim_summary), [], sim_result.metrics.steps,
                        real="served")
    if out_dir is not None:
        served_metrics.write(Path(out_dir) / system / "served", served, steps=False)
        sim_result.metrics.write(Path(out_dir) / system / "simulator", sim_summary)
    return result


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
                                                 "measured_by": r.real}
                                      for r in results}}
    (out_dir / "compare.json").write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    (out_dir / "compare.md").write_text(markdown_table(results))
