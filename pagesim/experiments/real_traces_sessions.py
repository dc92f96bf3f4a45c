"""The sessions section of reports/real_traces.md: what reusing a session's own KV buys on
traces/sharegpt_sessions.json (pagesim.sim.session_reuse), on the report's hardware."""

from __future__ import annotations

from pathlib import Path

from pagesim.sim.session_reuse import ReuseRun, session_reuse
from pagesim.workload.trace import load_trace

TRACE = "traces/sharegpt_sessions.json"
SESSION_RATE = 1.0  # sessions started per second (Poisson): --rate counts sessions on a session trace
SMALL_POOL = 1_000  # blocks: a what-if pool far below the GPU's, where histories are evicted between turns


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def sessions_section(root: Path, setup: dict) -> tuple[str, list[dict]]:
    """The section's markdown (its heading excluded) and its numbers."""
    trace = load_trace(root / TRACE)
    runs: list[ReuseRun] = session_reuse(trace, (None, SMALL_POOL), **setup, rate=SESSION_RATE)
    sessions = len({r.session_id for r in trace.requests})
    out = [f"{TRACE}: {sessions} ShareGPT conversations, {len(trace)} turns (real OPT token ids; turn k + 1 sent "
           "its think time after turn k's reply ends, its prompt turn k's prompt, the reply, then the next message). "
           f"Replayed on {setup['model']} on one {setup['gpu']} (calibrated cost model, block {setup['block_size']}), "
           f"sessions starting at {SESSION_RATE:g} per second (Poisson), with prefix caching off and on, on the pool "
           f"the GPU holds and on a {SMALL_POOL:,}-block what-if pool (pagesim.sim.session_reuse).", "",
           "| prefix caching | KV blocks | first turns | TTFT mean / p50 / p99 (s) | later turns | "
           "TTFT mean / p50 / p99 (s) | later turns' prompt tokens from cache | prefix hit rate (all) | rejected |",
           "|---|---:|---:|---|---:|---|---:|---:|---:|"]
    for r in runs:
        f, later = r.first_turns, r.later_turns
        hit = "n/a (off)" if r.prefix_hit_rate is None else f"{100 * r.prefix_hit_rate:.1f}%"
        out.append(f"| {'on' if r.prefix_caching else 'off'} | {r.num_gpu_blocks:,} | {f.count} | "
                   f"{_s(f.ttft_mean)} / {_s(f.ttft_p50)} / {_s(f.ttft_p99)} | {later.count} | "
                   f"{_s(later.ttft_mean)} / {_s(later.ttft_p50)} / {_s(later.ttft_p99)} | "
                   f"{100 * r.later_turns_cached_share:.1f}% | {hit} | {r.num_rejected} |")
    off, on = runs[0].later_turns, runs[1].later_turns
    if off.ttft_mean and on.ttft_mean is not None:
        out += ["", f"With caching on the GPU's pool, later turns' mean TTFT is {on.ttft_mean / off.ttft_mean:.2f}x "
                "what it is without: a later turn's prompt is mostly its own history, which the previous turn left "
                "cached; first turns, which share little more than the chat template, change little. On the small pool the histories of sessions thinking "
                "between turns are evicted by the others' and the share served falls."]
    return "\n".join(out), [r.to_dict() for r in runs]
