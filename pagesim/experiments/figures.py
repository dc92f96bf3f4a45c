"""What every figure script shares: the compared rows and their verdicts, the .md report with the
exact command, CSV and plot output, argument parsers, and the executor device. The paper's
numbers themselves live in pagesim/experiments/paper.py."""

from __future__ import annotations

import argparse
import csv
import shlex
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from pagesim.experiments.paper import ARXIV, SHARING_RATIO_REL_TOL

# The current folder's reports/figures: in a checkout's root the committed results (which a smoke
# run must not replace: run_all.check_default_target), after a pip install a folder of the user's.
DEFAULT_OUT_DIR = Path("reports") / "figures"
CHECKOUT_TRACES = Path(__file__).resolve().parents[2] / "traces"  # a source checkout's traces/ (all of them)


def trace_file(name: str) -> Path:
    """traces/<name>.json: the checkout's, else the current folder's or the copy pagesim ships
    (pagesim.workload.trace.find_trace); FileNotFoundError saying so where there is none."""
    from pagesim.workload.trace import PACKAGED_TRACES, find_trace

    checkout = CHECKOUT_TRACES / f"{name}.json"
    if checkout.is_file():
        return checkout
    found = find_trace(Path("traces") / f"{name}.json")
    if found.is_file():
        return found
    shipped = ", ".join(sorted(p.stem for p in PACKAGED_TRACES.glob("*.json")))
    raise FileNotFoundError(f"traces/{name}.json: not in this folder and not shipped with pagesim (which holds "
                            f"{shipped}); run from a source checkout, or build it there with `pagesim trace build`")


@lru_cache(maxsize=None)
def named_trace(name: str):
    """traces/<name>.json, loaded once per process: every search and probe of a figure (and
    every task a process-pool worker takes) shares it. Replays only read a trace."""
    from pagesim.workload.trace import load_trace

    return load_trace(trace_file(name))


@dataclass
class Row:
    """One number the paper states, ours beside it, and whether they agree."""
    quantity: str
    paper: float
    ours: float
    tolerance: str  # how "agree" is decided, in words
    ok: bool
    reason: str = ""  # where not ok: why, as far as we can tell; where ok: optional note
    source: str = ""
    paper_hi: float | None = None  # the paper states a band [paper, paper_hi] rather than one number

    @property
    def verdict(self) -> str:
        return "within" if self.ok else "NOT within"


def within(ours: float, paper: float, *, rel: float | None = None, abs_: float | None = None) -> bool:
    """True when |ours - paper| <= rel * |paper| or <= abs_ (whichever are given)."""
    diff = abs(ours - paper)
    return (rel is not None and diff <= rel * abs(paper) + 1e-12) or (abs_ is not None and diff <= abs_ + 1e-12)


def _fmt(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def rows_markdown(rows: list[Row], digits: int = 2) -> str:
    lines = ["| quantity | paper | ours | tolerance | verdict | reason / note | paper source |",
             "|---|---:|---:|---|---|---|---|"]
    for r in rows:
        paper = _fmt(r.paper, digits) if r.paper_hi is None else f"{_fmt(r.paper, digits)}-{_fmt(r.paper_hi, digits)}"
        cells = [r.quantity, paper, _fmt(r.ours, digits), r.tolerance, f"**{r.verdict}**",
                 r.reason.replace("|", "/").replace("\n", " "), r.source]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def command_line(script: str, argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", "-m", f"pagesim.experiments.{Path(script).stem}", *map(shlex.quote, args)])


def write_report(path: Path, title: str, command: str, rows: list[Row], sections: list[tuple[str, str]] = (),
                 digits: int = 2) -> None:
    """The .md: the exact command first, then the verdict table, then free sections (heading, body)."""
    n_ok = sum(r.ok for r in rows)
    parts = [f"# {title}", "", "Command:", "", "```", command, "```", "",
             f"Paper: Kwon et al., SOSP 2023 ({ARXIV}). {n_ok} of {len(rows)} numbers within tolerance.", "",
             "## Ours vs the paper", "", rows_markdown(rows, digits), ""]
    for heading, body in sections:
        parts += [f"## {heading}", "", body.rstrip(), ""]
    path.write_text("\n".join(parts))


@dataclass
class Verdicts:
    num_within: int
    num_rows: int
    not_within: list  # the quantities of the rows not within


def read_verdicts(path: Path) -> Verdicts:
    """The verdict rows of a report written by write_report (for the summary in reports/paper.md)."""
    within_n, rows, misses = 0, 0, []
    for line in Path(path).read_text().splitlines():
        if line.startswith("| ") and ("| **within** |" in line or "| **NOT within** |" in line):
            rows += 1
            if "| **within** |" in line:
                within_n += 1
            else:
                misses.append(line.split(" | ")[0].lstrip("| ").strip())
    return Verdicts(within_n, rows, misses)


def write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), lineterminator="\n")
        w.writeheader()
        for row in rows:
            w.writerow({k: row.get(k, "") for k in columns})


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def rate_axes(ax, thresholds, ymax: float, title: str) -> None:
    """A latency-against-rate panel: log rate axis with plain tick labels, the thresholds as
    dashed lines, latency cut at ymax (curves shoot up past the knee)."""
    from pagesim.plots import log_axis

    for t in thresholds:
        ax.axhline(t, color="k", lw=0.6, ls="--")
    log_axis(ax.xaxis)
    ax.set_ylim(0, ymax)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("Request rate (req/s)")


def executor_device(requested: str | None) -> str:
    """The device an executor measurement runs on: the one asked for, else cuda if present; torch
    on one thread (a shared CPU gives steadier timings with one)."""
    import torch

    torch.set_num_threads(1)
    return requested or ("cuda" if torch.cuda.is_available() else "cpu")


def device_name(dev) -> str:
    """What the executor measurements ran on, for the reports."""
    import torch

    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"cpu ({torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''})"


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--smoke", action="store_true", help="a few requests, seconds; same code path and output files")
    p.add_argument("--full", action="store_true", help="the long run (3600 s of arrivals where it applies)")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="where the .png/.csv/.md go")
    return p


# The paper's artifact replays 600 s of arrivals; the paper's own runs are an hour long.
DEFAULT_DURATION_S = 600.0
FULL_DURATION_S = 3600.0


def replay_parser(description: str) -> argparse.ArgumentParser:
    """base_parser plus the arrival window and seed of the figures that replay traces."""
    p = base_parser(description)
    p.add_argument("--duration", type=float, default=None,
                   help=f"seconds of arrivals (default {DEFAULT_DURATION_S:g}; --full {FULL_DURATION_S:g})")
    p.add_argument("--seed", type=int, default=0)
    return p


def executor_replay_parser(description: str) -> argparse.ArgumentParser:
    """replay_parser plus the device of the figures that also measure on the executor."""
    p = replay_parser(description)
    p.add_argument("--device", default=None, help="executor device for (a) (default: cuda if present, else cpu)")
    return p


def arrival_duration(args, smoke_duration: float) -> float:
    return args.duration or (smoke_duration if args.smoke else FULL_DURATION_S if args.full else DEFAULT_DURATION_S)


# The rate-sweep figures (12, 18, 19) leave requests arriving in the first minute out of the
# latency: the system starts empty, which is not the steady state the paper reports.
WARMUP_S = 60.0
SMOKE_WARMUP_S = 1.0


def replay_window(args, smoke_duration: float) -> tuple[float, float]:
    """Seconds of arrivals and of warm-up of a rate-sweep figure."""
    return arrival_duration(args, smoke_duration), SMOKE_WARMUP_S if args.smoke else WARMUP_S


def save_figure(fig, path, rect=(0, 0, 1, 1)) -> None:
    """rect: the part of the figure the panels fill (the rest holds a figure-level legend)."""
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=150)
    pyplot().close(fig)


def outputs(out_dir: Path, stem: str) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return {ext: out_dir / f"{stem}.{ext}" for ext in ("png", "csv", "md")}


@dataclass
class Timer:
    started: float = field(default_factory=lambda: __import__("time").perf_counter())

    def elapsed(self) -> float:
        import time
        return time.perf_counter() - self.started


def start_figure(parser: argparse.ArgumentParser, argv: list[str] | None, stem: str):
    """How every figure's main begins: its arguments, a wall clock started now (for the report)
    and its output paths (.png, .csv, .md) in a folder that exists."""
    args = parser.parse_args(argv)
    return args, Timer(), outputs(args.out_dir, stem)


def sharing_ratio_band(paper_ratio: float) -> tuple[float, float]:
    return paper_ratio * (1 - SHARING_RATIO_REL_TOL), paper_ratio * (1 + SHARING_RATIO_REL_TOL)
