"""`pagesim trace build|inspect`: make the project's traces and look at them.

Heavy libraries (transformers, matplotlib) are imported inside the commands so `pagesim --help`
stays fast.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import OUT_FILE, POSITIVE_INT, POSITIVE_SECONDS, SCALE, SEED, fail, load_trace_file

trace_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None, help="Build and inspect workload traces (docs/traces.md).")
app.add_typer(trace_app, name="trace")


def trace_kind(value: str) -> str:
    """A builder's name (pagesim.workload.builders.BUILDERS); the list is the help's, not a choice
    list, which would no longer fit an 80-column help screen."""
    from pagesim.workload.builders import BUILDERS

    if value not in BUILDERS:
        raise typer.BadParameter(f"unknown trace {value!r}; choose from {', '.join(BUILDERS)}")
    return value


def _window(value: str | None) -> tuple[float, float] | None:
    """--window START:END, seconds of the source's hour."""
    if value is None:
        return None
    start, sep, end = str(value).partition(":")
    try:
        window = (float(start), float(end))
    except ValueError:
        raise typer.BadParameter(f"must be START:END in seconds (e.g. 600:1200), got {value!r}") from None
    if not sep or not 0 <= window[0] < window[1] < float("inf"):
        raise typer.BadParameter(f"must be START:END with 0 <= START < END, got {value!r}")
    return window


def _recorded_out(out: Path) -> str:
    """--out as it goes into the metadata: relative to the repo root when inside it, so the
    committed traces never carry a machine's absolute path."""
    from pagesim.workload.builders import repo_root

    if out.is_absolute():
        try:
            return out.resolve().relative_to(repo_root()).as_posix()
        except ValueError:
            return str(out)
    return out.as_posix()


@trace_app.command("build")
def build(
    kind: str = typer.Argument(..., metavar="KIND", parser=trace_kind, help="which trace: sharegpt, alpaca, sharegpt-chat, translation-1shot, "
                                "translation-5shot, azure-code, azure-conv, mooncake-conversation, mooncake-synthetic, "
                                "or sessions: sharegpt-sessions, mooncake-sessions, agent-sessions"),
    out: Path = typer.Option(..., "--out", parser=OUT_FILE, help="trace file to write"),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="public data folder (default: $PAGESIM_DATA_DIR, else ../shared/data beside the repo)"
    ),
    num: Optional[int] = typer.Option(
        None, "--num", parser=POSITIVE_INT, help="requests to keep (sharegpt: 10000; alpaca: all; translation-*: 2000; "
        "azure-*, mooncake-conversation/-synthetic: all, else the first N), or conversations (sharegpt-chat: 850), or "
        "sessions (sharegpt-sessions: 200; mooncake-sessions: 20; agent-sessions: 100)"
    ),
    seed: int = typer.Option(0, "--seed", parser=SEED, help="seed of the shuffle that picks the requests (not azure-*, mooncake-*)"),
    window: Optional[str] = typer.Option(None, "--window", metavar="START:END", parser=_window,
                                         help="azure-*, mooncake-*: keep arrivals in [START, END) seconds of the hour, "
                                         "re-based to START"),
    time_scale: float = typer.Option(1.0, "--time-scale", parser=SCALE, help="azure-*, mooncake-*: arrival gaps divided "
                                     "by this (2: twice the rate, half the span)"),
    duration: Optional[float] = typer.Option(None, "--duration", parser=POSITIVE_SECONDS, help="azure-*, mooncake-*: keep "
                                             "arrivals before S seconds (after --window and --time-scale)"),
    max_context: Optional[int] = typer.Option(None, "--max-context", parser=POSITIVE_INT, help="azure-*, mooncake-*: "
                                              "prompt + output tokens at most (a model's max length): longer prompts "
                                              "are truncated, keeping their start; a request whose output alone "
                                              "reaches it is dropped"),
) -> None:
    """Build a trace from the public data; the same command always writes the same bytes."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from pagesim.results import results_file
    from pagesim.workload import builders
    from pagesim.workload.trace import save_trace

    console = Console()
    data = data_dir if data_dir is not None else builders.default_data_dir()
    production = kind in builders.PRODUCTION_KINDS
    shaping_given = window is not None or time_scale != 1.0 or duration is not None or max_context is not None
    if shaping_given and not production:
        fail(f"--window, --time-scale, --duration and --max-context shape production traces; {kind} has no "
             "recorded arrivals")
    extra = {}
    if production:
        try:
            shaping = builders.Shaping(window=window, time_scale=time_scale, duration=duration, num=num,
                                       max_context=max_context)
        except ValueError as exc:
            fail(str(exc))
        command = builders.production_command(kind, shaping, _recorded_out(out))
        extra = {"shaping": shaping}
        num = None  # (in the shaping)
    else:
        if num is None:
            num = builders.DEFAULT_NUM[kind]
        command = builders.build_command(kind, num, seed, _recorded_out(out))

    started = time.perf_counter()
    try:
        if kind in ("sharegpt-chat", "sharegpt-sessions"):
            build_chat = builders.BUILDERS[kind]
            with Progress(TextColumn("tokenizing messages"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=console) as bar:
                task = bar.add_task("tok", total=None)
                trace = build_chat(
                    data, num=num, seed=seed, command=command, progress=lambda done, total: bar.update(task, completed=done, total=total)
                )
        else:
            with console.status(f"building {kind} trace"):
                trace = builders.BUILDERS[kind](data, num=num, seed=seed, command=command, **extra)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    with results_file(out) as tmp:
        save_trace(trace, tmp)
    elapsed = time.perf_counter() - started

    meta = trace.metadata
    stats = meta["stats"]
    console.print(
        f"wrote [bold]{escape(str(out))}[/bold]: {meta['count']} requests, {out.stat().st_size / 1e6:.2f} MB, built in {elapsed:.1f} s"
    )
    console.print(f"  mean prompt_len {stats['prompt_len']['mean']:.2f}, mean output_len {stats['output_len']['mean']:.2f}")
    if "pool" in meta:
        pool = meta["pool"]
        console.print(
            f"  filtered pool: {pool['prompt_len']['count']} pairs, means {pool['prompt_len']['mean']:.2f} / {pool['output_len']['mean']:.2f}"
        )
    paper = meta.get("paper", {}).get("mean")
    if paper:
        console.print(f"  paper ({meta['paper']['figure']}): {paper['prompt_len']} / {paper['output_len']}")
    for rule in meta.get("filters", []):
        if rule.get("dropped"):
            console.print(f"  filter '{rule['rule']}': dropped {rule['dropped']}", markup=False)
    if "context_cap" in meta:
        console.print(f"  context cap: {meta['context_cap']['note']}", markup=False)
    arrivals = stats.get("arrivals")
    if arrivals:
        console.print(f"  arrivals over {arrivals['span_s']:.1f} s, {arrivals['mean_rate_per_s']} req/s, "
                      f"CV of gaps {arrivals.get('gap_cv')}")
    if "prefix_block_reuse" in meta:
        reuse = meta["prefix_block_reuse"]
        console.print(f"  reuse an unbounded cache could serve: {reuse['token_ratio']:.2%} of prompt tokens "
                      f"({reuse['ratio']:.2%} of {reuse['blocks']} blocks of {meta['hash_block_tokens']} tokens)")
    src = meta.get("source", {})
    if "conversations_recovered" in src:
        style = "yellow" if src["truncated_file"] else "green"
        console.print(
            f"  [{style}]ShareGPT file: recovered {src['conversations_recovered']} complete conversations; reading stopped at "
            f"byte {src['read_stopped_at_byte']:,} of {src['file_bytes']:,} ({src['read_stop_reason']})[/{style}]"
        )
        if "conversations" in meta:
            console.print(f"  {meta['conversations']} conversations sampled, {meta['count']} turns")
    if "mean_turns_per_session" in meta:
        console.print(f"  {meta['sessions']} sessions, {meta['turns']} turns ({meta['mean_turns_per_session']} per session)")
    console.print(f"  command: {meta['command']}", markup=False)


@trace_app.command("inspect")
def inspect(
    file: Path = typer.Argument(..., help="trace file"),
    plot: Optional[Path] = typer.Option(None, "--plot", parser=OUT_FILE, help="write the input/output length histograms (Fig. 11) to this PNG"),
    as_json: bool = typer.Option(False, "--json", help="print the statistics as JSON instead of a table"),
) -> None:
    """Print count, mean and percentiles of prompt and output lengths; optionally plot them."""
    from rich.console import Console
    from rich.table import Table

    from pagesim.workload.builders import trace_stats

    console = Console()
    trace = load_trace_file(file)
    stats = trace_stats(trace.requests)
    meta = trace.metadata

    if as_json:
        print(json.dumps({"file": str(file), "stats": stats}, indent=2, sort_keys=True))
    else:
        table = Table(title=f"{file} ({meta.get('name', 'trace')})")
        table.add_column("length")
        for col in ("count", "mean", "p50", "p90", "p99", "max"):
            table.add_column(col, justify="right")
        paper = meta.get("paper", {}).get("mean", {})
        if paper:
            table.add_column("paper mean", justify="right")
        for name in ("prompt_len", "output_len"):
            s = stats[name]
            row = [name, str(s["count"]), f"{s['mean']:.2f}", str(s["p50"]), str(s["p90"]), str(s["p99"]), str(s["max"])]
            if paper:
                row.append(f"{paper[name]:.2f}")
            table.add_row(*row)
        console.print(table)
        pool = meta.get("pool")
        if pool:
            # The paper's means are over the whole filtered pool, not over this sample.
            console.print(
                f"  filtered pool ({pool['prompt_len']['count']} pairs): means "
                f"{pool['prompt_len']['mean']:.2f} / {pool['output_len']['mean']:.2f}"
            )
        extras = []
        if any(r.prompt_token_ids is not None for r in trace.requests):
            extras.append("prompt_token_ids present")
        if any(r.hash_ids is not None for r in trace.requests):
            extras.append(f"hash_ids present (blocks of {meta['hash_block_tokens']} tokens)")
        groups = {r.prefix_group for r in trace.requests if r.prefix_group is not None}
        if groups:
            extras.append(f"{len(groups)} prefix groups")
        if any(r.arrival_time is not None for r in trace.requests):
            extras.append(f"arrival times over {trace.requests[-1].arrival_time:.1f} s")
        if any(r.num_seqs > 1 for r in trace.requests):
            extras.append("parallel sampling / beam search requests present")
        if extras:
            console.print("  " + "; ".join(extras))
        if meta.get("command"):
            console.print(f"  built by: {meta['command']}", markup=False)

    if plot is not None:
        _plot_lengths(trace, stats, plot, title=str(meta.get("name", file.name)))
        if not as_json:
            console.print(f"  wrote {plot}", markup=False)


def _plot_lengths(trace, stats, path: Path, title: str) -> None:
    """The paper's Fig. 11 for one trace: histograms of input and output lengths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for ax, name, label, color in (
        (axes[0], "prompt_len", "input (prompt) length, tokens", "tab:blue"),
        (axes[1], "output_len", "output length, tokens", "tab:orange"),
    ):
        values = [getattr(r, name) for r in trace.requests]
        ax.hist(values, bins=min(60, max(10, len(set(values)))), density=True, color=color, alpha=0.85)
        mean = stats[name]["mean"]
        ax.axvline(mean, color="black", linestyle="--", linewidth=1)
        ax.set_title(f"{label}\nmean {mean:.2f}, p50 {stats[name]['p50']}, max {stats[name]['max']}", fontsize=9)
        ax.set_xlabel("tokens")
        ax.set_ylabel("density")
    fig.suptitle(f"{title}: {len(trace.requests)} requests", fontsize=10)
    fig.tight_layout()
    from pagesim.results import results_file

    # A fixed metadata block keeps the PNG free of a creation timestamp.
    with results_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, metadata={"Software": None})
    plt.close(fig)
