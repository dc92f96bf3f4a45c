"""The end-of-run tables `replay`, `run` and `bench` print: the run's counts and rates, then its
latencies (mean / p50 / p99, one unit per row). Every value keeps its unit in its own cell and
no cell wraps, so both tables read whole at 80 columns; a replay's times are said to be
simulated."""

from __future__ import annotations


def _fmt(value, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value:,}{unit}"


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else fraction * 100


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def simulated(summary: dict) -> bool:
    """A replay's summary names its cost model: its times are simulated, a run's or bench's measured."""
    return "cost_model" in summary


def counts_rows(s: dict) -> list[tuple[str, str, str, str]]:
    """(label, value, label, value) rows of the first table."""
    rows = [
        ("finished", f"{s['num_finished']:,} of {s['num_requests']:,}", "rejected", _fmt(s["num_rejected"])),
        ("simulated time" if simulated(s) else "measured time", _fmt(s["duration_s"], " s", 1), "steps",
         _fmt(s["num_steps"])),
    ]
    longest = s.get("longest_output_tokens")
    output = _fmt(s["output_token_throughput"], " tok/s", 1)
    if longest is None or longest == s.get("total_output_tokens"):
        rows.append(("throughput", _fmt(s["request_throughput"], " req/s"), "output", output))
    else:  # parallel samples or beams: every sample's tokens (as vLLM counts them), and one per request
        rows += [("throughput", _fmt(s["request_throughput"], " req/s"), "output, all samples", output),
                 ("", "", "output, one per req.", _fmt(s.get("longest_output_throughput"), " tok/s", 1))]
    rows += [
        ("tokens in", _fmt(s.get("total_input_tokens")), "tokens out", _fmt(s.get("total_output_tokens"))),
        ("batched (mean)", _fmt(s["mean_batched_requests"], "", 2), "preemptions", _fmt(s["num_preemptions"])),
        ("KV use, mean", _fmt(_pct(s["mean_kv_utilization"]), " %", 1), "KV use, peak",
         _fmt(_pct(s["peak_kv_utilization"]), " %", 1)),
        ("swapped blocks", _fmt(s["num_swapped_blocks"]), "copied blocks", _fmt(s["num_copied_blocks"])),
    ]
    if s.get("memory_saving") is not None:
        rows.append(("memory saving", _fmt(s["memory_saving"] * 100, " %", 2), "", ""))
    if s.get("prefix_hit_rate") is not None:
        rows.append(("prefix hit rate", _fmt(s["prefix_hit_rate"] * 100, " %", 1), "prefill saved",
                     _fmt(s["prefill_tokens_saved"], " tok")))
    return rows


def latency_rows(s: dict) -> list[tuple[str, str, str, str]]:
    """(latency and its unit, mean, p50, p99) rows of the second table."""
    def row(label, keys, factor, digits):
        return (label, *(_fmt(_scaled(s.get(k), factor), "", digits) for k in keys))

    return [
        row("TTFT (s)", ("ttft_mean", "ttft_p50", "ttft_p99"), 1, 3),
        row("TPOT (ms)", ("tpot_mean", "tpot_p50", "tpot_p99"), 1e3, 2),
        row("ITL (ms)", ("mean_itl_ms", "median_itl_ms", "p99_itl_ms"), 1, 2),
        row("end-to-end (s)", ("e2e_mean", "e2e_p50", "e2e_p99"), 1, 2),
        row("normalized (s/token)", ("mean_normalized_latency", "normalized_latency_p50", "normalized_latency_p99"), 1, 4),
    ]


def print_summary(s: dict, console, title: str) -> None:
    """The end-of-run tables both `pagesim replay` and `pagesim run` print (and bench)."""
    from rich.markup import escape
    from rich.table import Table

    if s.get("num_kv_blocks") is not None:  # None: measured over HTTP, the pool is the server's
        title += f" · {s['num_kv_blocks']:,} KV blocks ({s['kv_token_slots']:,} token slots)"
    table = Table(title=escape(title), show_header=False, title_justify="left")  # a model path may hold "[/bold]"
    for style, justify in (("bold", "left"), (None, "right"), ("bold", "left"), (None, "right")):
        table.add_column(style=style, justify=justify, no_wrap=True)
    for row in counts_rows(s):
        table.add_row(*row)
    console.print(table)
    clock = "simulated time" if simulated(s) else "measured"
    latency = Table(title=f"latency ({clock}), over {_fmt(s.get('num_measured'))} requests", title_justify="left")
    for name in ("", "mean", "p50", "p99"):
        latency.add_column(name, justify="left" if not name else "right", no_wrap=True, style="bold" if not name else None)
    for row in latency_rows(s):
        latency.add_row(*row)
    console.print(latency)
    for note in s.get("notes", []):
        console.print(f"note: {note}", markup=False)
    for reason, count in s.get("reject_reasons", {}).items():
        console.print(f"rejected {count}: {reason}", markup=False)
