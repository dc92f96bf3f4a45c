#!/usr/bin/env python
"""reports/real_traces.md: what the production traces look like, and what prefix caching buys on them.

    python -m pagesim.experiments.real_traces [--smoke] [--out reports/real_traces.md]

Per committed trace (traces/azure_code.json, azure_conv.json, mooncake_conversation.json,
mooncake_synthetic.json): arrival burstiness (coefficient of variation of the gaps), length
distributions, and, replayed on Llama-3.1-8B on one H100-80GB (calibrated cost model, block 16),
TTFT with prefix caching off and on over KV pool sizes: the pool the GPU's memory holds, 4x and
16x it, and an unbounded one (a what-if: more blocks than any GPU holds, so nothing is evicted).
The Mooncake traces carry prefix-block hash ids, so the cache sees their real reuse; the Azure
traces carry no content, so no prefix can be recognised there and caching is only run off.

At their own timestamps the Mooncake traces overload one GPU (Kimi served them on a cluster):
the conversation hour brings 40 K prompt tokens/s. Their replays therefore stretch the gaps
(arrival times multiplied by LOAD_STRETCH, what `pagesim trace build ... --time-scale 1/x`
writes), stated per row. The Mooncake paper's own numbers about its traces are set beside ours.
Writes the .md, a .json of every number, and figures under reports/real_traces/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

from pagesim.experiments.figures import command_line, pyplot, write_csv
from pagesim.experiments.real_traces_sessions import sessions_section
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.builders.mooncake import prefix_block_reuse
from pagesim.workload.builders.timeline import arrival_stats
from pagesim.workload.trace import Trace, load_trace

ROOT = Path(__file__).resolve().parents[2]
TRACES = ("azure_code", "azure_conv", "mooncake_conversation", "mooncake_synthetic")
# whole prompts with caching off and on alike (the v0 default would chunk the off runs only)
SETUP = dict(model="llama-3.1-8b", gpu="h100-80gb", block_size=16, chunked_prefill=False)
POOL_FACTORS = (1, 4, 16)  # x the GPU's pool; plus an unbounded pool
LOAD_STRETCH = {"mooncake_conversation": 4.0, "mooncake_synthetic": 8.0}  # arrival times x this
# Qin et al., "Mooncake: Trading More Storage for Less Computation", FAST 2025, Table 2 (Workload
# Statistics) and section 5.1; read from the paper's PDF in kvcache-ai/Mooncake @ 3b5a594,
# FAST25-release/Mooncake-FAST25.pdf.
MOONCAKE_PAPER = {
    "mooncake_conversation": {"requests": 12031, "mean_input": 12035, "mean_output": 343, "cache_ratio": 0.40,
                              "arrivals": "timestamp"},
    "mooncake_synthetic": {"requests": 3993, "mean_input": 15325, "mean_output": 149, "cache_ratio": 0.66,
                           "arrivals": "Poisson"},
}
MOONCAKE_SOURCE = "Qin et al., FAST 2025, Table 2 (Workload Statistics)"
# the Sessions section (pagesim.experiments.real_traces_sessions) follows this line
SESSIONS_MARK = "<!-- sessions: helper B's section (TTFT of later turns with and without reuse) goes here -->"


def stretched(trace: Trace, factor: float) -> Trace:
    """The trace with every arrival time multiplied by factor (gaps x factor, the rate / factor)."""
    reqs = [dataclasses.replace(r, arrival_time=round(r.arrival_time * factor, 7)) for r in trace.requests]
    return Trace(dict(trace.metadata), reqs)


def describe(name: str, trace: Trace) -> dict:
    stats = trace.metadata["stats"]
    row = {"trace": name, "requests": len(trace), **{f"arrival_{k}": v for k, v in arrival_stats(
        [r.arrival_time for r in trace.requests]).items()}}
    for what in ("prompt_len", "output_len"):
        for k in ("mean", "p50", "p90", "p99", "max"):
            row[f"{what}_{k}"] = stats[what][k]
    if "hash_block_tokens" in trace.metadata:  # (recomputed: a smoke run keeps only the first requests)
        reuse = prefix_block_reuse(trace.requests, trace.metadata["hash_block_tokens"])
        row["hash_id_reuse"] = reuse["token_ratio"]
    return row


def run(name: str, trace: Trace, caching: bool, blocks: int | None, log, unbounded: bool = False) -> dict:
    cfg = ReplayConfig(**SETUP, rate=None, num_requests=None, prefix_caching=caching, num_gpu_blocks=blocks)
    started = time.perf_counter()
    sim = Replay(cfg, trace, keep_steps=False)
    s = sim.run().summary
    wall = time.perf_counter() - started
    # over every prompt token of the trace: a rejected request is served nothing from the cache
    total = sum(trace.prompt_lens)
    saved = s["prefill_tokens_saved"] / total
    rejected_share = sum(r.prompt_len for r in sim.metrics.requests if r.status == "rejected") / total
    row = {"trace": name, "prefix_caching": caching, "kv_blocks": s["num_kv_blocks"], "unbounded": unbounded,
           "evictions": sim.scheduler.kv.device.num_evictions if caching else None, "requests": s["num_requests"],
           "rejected": s["num_rejected"], "rejected_prompt_share": round(rejected_share, 4),
           "prompt_tokens_saved": round(saved, 4),
           "ttft_mean_s": round(s["ttft_mean"], 3), "ttft_p50_s": round(s["ttft_p50"], 3),
           "ttft_p99_s": round(s["ttft_p99"], 3), "preemptions": s["num_preemptions"], "wall_s": round(wall, 1)}
    log(f"  {name} caching={caching} blocks={s['num_kv_blocks']:,}: saved {saved:.2%}, TTFT mean {s['ttft_mean']:.2f} s "
        f"({wall:.0f} s wall)")
    return row


def run_unbounded(name: str, trace: Trace, log) -> dict:
    """A pool that never evicts: room for every prompt block no earlier request holds, plus a
    full batch of average requests; doubled until the replay evicts nothing (checked, not assumed)."""
    block = SETUP["block_size"]
    reuse = prefix_block_reuse(trace.requests, trace.metadata["hash_block_tokens"])
    mean_blocks = -(-(sum(trace.prompt_lens) + sum(trace.output_lens)) // (block * len(trace)))
    blocks = (reuse["prompt_tokens"] - reuse["prompt_tokens_reused"]) // block + len(trace) + 2 * 256 * mean_blocks
    while True:
        row = run(name, trace, True, blocks, log, unbounded=True)
        if row["evictions"] == 0:
            return row
        blocks *= 2


def figures(out_dir: Path, traces: dict[str, Trace], runs: list[dict]) -> list[str]:
    plt = pyplot()
    names = []
    fig, axes = plt.subplots(len(traces), 3, figsize=(12, 2.6 * len(traces)))
    for ax_row, (name, trace) in zip(axes, traces.items()):
        times = [r.arrival_time for r in trace.requests]
        ax_row[0].hist(times, bins=60, color="tab:gray")
        ax_row[0].set_title(f"{name}: arrivals per {times[-1] / 60:.0f} s bin", fontsize=8)
        for ax, what, color in ((ax_row[1], "prompt_len", "tab:blue"), (ax_row[2], "output_len", "tab:orange")):
            ax.hist([getattr(r, what) for r in trace.requests], bins=60, color=color)
            ax.set_yscale("log")
            ax.set_title(f"{name}: {what} (tokens)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "traces.png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    names.append("traces.png")

    cached = [r for r in runs if r["trace"] in LOAD_STRETCH]
    if cached:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
        for name in LOAD_STRETCH:
            rows = sorted((r for r in cached if r["trace"] == name and r["prefix_caching"]), key=lambda r: r["kv_blocks"])
            off = [r for r in cached if r["trace"] == name and not r["prefix_caching"]]
            if not rows:
                continue
            x = [r["kv_blocks"] for r in rows]
            axes[0].plot(x, [100 * r["prompt_tokens_saved"] for r in rows], "o-", label=name)
            line, = axes[1].plot(x, [r["ttft_mean_s"] for r in rows], "o-", label=f"{name}, caching on")
            if off:
                axes[1].axhline(off[0]["ttft_mean_s"], color=line.get_color(), ls="--", lw=0.8,
                                label=f"{name}, caching off")
        for ax, label in ((axes[0], "prompt tokens from the cache (%)"), (axes[1], "mean TTFT (s)")):
            ax.set_xscale("log")
            ax.set_xlabel("KV pool (16-token blocks)")
            ax.set_ylabel(label)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "prefix_caching.png", dpi=100, metadata={"Software": None})
        plt.close(fig)
        names.append("prefix_caching.png")
    return names


def markdown(command: str, described: list[dict], runs: list[dict], timing: dict, figs: list[str], smoke: bool) -> str:
    out = ["# Production traces: burstiness, lengths, and what prefix caching buys", "",
           f"Command: `{command}`" + (" (smoke: the first 400 requests of each trace)" if smoke else ""), "",
           f"Replays: {SETUP['model']} on 1 x {SETUP['gpu']}, calibrated cost model (engine vllm-0.19), block "
           f"{SETUP['block_size']}, FCFS, no chunked prefill; arrival times from the traces (Mooncake's stretched, see "
           "below). Prefix-cache hit rate here = prompt tokens served from the cache / all prompt tokens.", "",
           "## The traces", "",
           "| trace | requests | span (s) | rate (req/s) | CV of gaps | prompt mean / p50 / p99 / max | output mean / p50 / p99 / max | reuse from hash ids |",
           "|---|---:|---:|---:|---:|---|---|---:|"]
    for d in described:
        reuse = f"{100 * d['hash_id_reuse']:.2f}%" if "hash_id_reuse" in d else "n/a (no content)"
        out.append(f"| {d['trace']} | {d['requests']:,} | {d['arrival_span_s']:,.0f} | {d['arrival_mean_rate_per_s']} | "
                   f"{d['arrival_gap_cv']} | {d['prompt_len_mean']:,.0f} / {d['prompt_len_p50']:,} / {d['prompt_len_p99']:,} / "
                   f"{d['prompt_len_max']:,} | {d['output_len_mean']:,.0f} / {d['output_len_p50']:,} / "
                   f"{d['output_len_p99']:,} / {d['output_len_max']:,} | {reuse} |")
    out += ["", "CV of gaps: 1 for Poisson arrivals; Azure's code service (many requests in the same 100 ns tick "
            "and long lulls) is far burstier than its conversation service. Reuse from hash ids: the share of prompt "
            "tokens whose whole prefix (512-token blocks, chained) an earlier request held, i.e. what an unbounded "
            "cache could serve if every block were cached the moment its request arrived.", "",
            f"## Beside the Mooncake paper ({MOONCAKE_SOURCE})", "",
            "| trace | quantity | paper | ours |", "|---|---|---:|---:|"]
    by_name = {d["trace"]: d for d in described}
    for name, paper in MOONCAKE_PAPER.items():
        d = by_name.get(name)
        if d is None:
            continue
        out += [f"| {name} | requests | {paper['requests']:,} | {d['requests']:,} |",
                f"| {name} | mean input length | {paper['mean_input']:,} | {d['prompt_len_mean']:,.2f} |",
                f"| {name} | mean output length | {paper['mean_output']} | {d['output_len_mean']:,.2f} |",
                f"| {name} | cache ratio | {paper['cache_ratio']:.0%} | {100 * d['hash_id_reuse']:.2f}% (hash ids) |"]
        unbounded = [r for r in runs if r["trace"] == name and r["unbounded"]]
        if unbounded:
            out.append(f"| {name} | cache ratio, replayed (unbounded cache) | {paper['cache_ratio']:.0%} | "
                       f"{100 * unbounded[0]['prompt_tokens_saved']:.2f}% |")
    out += ["", "The paper does not define its cache ratio beyond \"prefix caching ratio\"; ours counts prompt "
            "tokens. Its traces are the ones released (same counts and means), so the few points between its ratio "
            "and ours are a difference of definition (say, counting blocks, or the hashes before remapping), not of "
            "data. The paper also says (section 5.3) that a local DRAM cache reaches only up to 50% of the "
            "theoretical hit rate; the pool sizes below show the same effect of capacity on one GPU.", "",
            "## Prefix caching off and on, over KV pool sizes", "",
            "| trace | arrivals | caching | KV blocks | rejected | prompt tokens from cache | TTFT mean (s) | p50 | p99 | preemptions |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        arrivals = f"x{LOAD_STRETCH[r['trace']]:g} gaps" if r["trace"] in LOAD_STRETCH else "own times"
        blocks = f"{r['kv_blocks']:,}" + (" (unbounded what-if: 0 evictions)" if r["unbounded"] else "")
        out.append(f"| {r['trace']} | {arrivals} | {'on' if r['prefix_caching'] else 'off'} | {blocks} | {r['rejected']} | "
                   f"{100 * r['prompt_tokens_saved']:.2f}% | {r['ttft_mean_s']:,.2f} | {r['ttft_p50_s']:,.2f} | "
                   f"{r['ttft_p99_s']:,.2f} | {r['preemptions']} |")
    rejected = {r["trace"]: r["rejected_prompt_share"] for r in runs if r["rejected"]}
    out += ["", "Rejected: requests longer than the model's 131,072-token context (pagesim rejects them with the "
            "reason; build with `--max-context 131072` to truncate them instead). They count as served nothing "
            "from the cache" + "".join(f"; in {name} they hold {100 * share:.2f}% of the prompt tokens"
                                       for name, share in rejected.items()) + ". Beyond that, the unbounded replay's "
            "share sits just under the reuse from hash ids: a request admitted while the request that brought its "
            "prefix is still computing it cannot hit (tests/sim/test_mooncake_reuse.py checks that every shortfall "
            "is such a case), and a hit always leaves the last prompt token and a partial 16-token block to compute.",
            ""]
    if timing:
        out += ["## Speed", "",
                f"Replaying the whole Mooncake conversation hour at its own timestamps with prefix caching (GPU pool, "
                f"{timing['requests']:,} requests, {timing['prompt_tokens'] / 1e6:.0f} M prompt tokens): "
                f"{timing['wall_s']:.1f} s in-process on this machine (load average {timing['load']:.1f} on "
                f"{os.cpu_count()} cores while it ran: a noisy number).", ""]
    out += ["## Figures", ""] + [f"![{f}](real_traces/{f})" for f in figs] + [
        "", "## Sessions", "", SESSIONS_MARK, ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="the first 400 requests of each trace (a quick check)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "real_traces.md")
    ap.add_argument("--sessions-only", action="store_true", help="rewrite only the report's Sessions section "
                    "(from its heading to the end; the rest of --out kept as it is)")
    args = ap.parse_args(argv)
    log = print
    sessions_md, sessions = sessions_section(ROOT, SETUP)
    if args.sessions_only:
        text = args.out.read_text()
        head = text.split("\n## Sessions\n", 1)[0]
        args.out.write_text(f"{head}\n## Sessions\n\n{SESSIONS_MARK}\n{sessions_md}\n\n(This section was regenerated "
                            "alone, by `python -m pagesim.experiments.real_traces --sessions-only`.)\n")
        data_path = args.out.with_suffix(".json")
        data = json.loads(data_path.read_text())
        data["sessions"] = sessions
        data_path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        log(f"wrote the Sessions section of {args.out}")
        return
    fig_dir = args.out.parent / "real_traces"
    fig_dir.mkdir(parents=True, exist_ok=True)

    traces = {}
    for name in TRACES:
        trace = load_trace(ROOT / "traces" / f"{name}.json")
        if args.smoke:
            trace = Trace(dict(trace.metadata, count=400), trace.requests[:400])
        traces[name] = trace
    described = [describe(name, t) for name, t in traces.items()]

    runs, timing = [], {}
    for name, trace in traces.items():
        if name not in LOAD_STRETCH:  # no content: prefix caching cannot recognise anything
            runs.append(run(name, trace, False, None, log))
            continue
        if name == "mooncake_conversation" and not args.smoke:
            started, load = time.perf_counter(), os.getloadavg()[0]
            Replay(ReplayConfig(**SETUP, rate=None, num_requests=None, prefix_caching=True), trace, keep_steps=False).run()
            timing = {"wall_s": time.perf_counter() - started, "load": max(load, os.getloadavg()[0]),
                      "requests": len(trace), "prompt_tokens": sum(trace.prompt_lens)}
        slow = stretched(trace, LOAD_STRETCH[name])
        off = run(name, slow, False, None, log)
        runs.append(off)
        for factor in POOL_FACTORS:
            runs.append(run(name, slow, True, off["kv_blocks"] * factor, log))
        runs.append(run_unbounded(name, slow, log))

    figs = figures(fig_dir, traces, runs)
    write_csv(fig_dir / "runs.csv", list(runs[0]), runs)
    write_csv(fig_dir / "traces.csv", sorted({k for d in described for k in d}), described)
    command = command_line(__file__, argv)
    text = markdown(command, described, runs, timing, figs, args.smoke)
    args.out.write_text(text.replace(SESSIONS_MARK, f"{SESSIONS_MARK}\n{sessions_md}"))
    args.out.with_suffix(".json").write_text(json.dumps({"traces": described, "runs": runs, "timing": timing,
                                                         "sessions": sessions},
                                                        indent=1, sort_keys=True) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
