"""The paper's numbers, in one place, and the helpers every figure script shares.

Paper: Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023, arXiv 2309.06180. Each constant names the figure it is read from
(see also /work/shared/DESIGN.md section 9). Figure scripts import these; they never retype a
paper number.

Helpers: `Row` (one compared number), `verdict_rows_markdown` / `write_report` (the .md with the
exact command, ours beside the paper's, a verdict and a reason per row), `write_csv`,
`pyplot()` (matplotlib on the Agg backend) and `base_parser()` (--smoke / --full / --out-dir).
"""

from __future__ import annotations

import argparse
import csv
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

ARXIV = "arXiv 2309.06180"
DEFAULT_OUT_DIR = Path(__file__).resolve().parent.parent / "reports" / "figures"
TRACES_DIR = Path(__file__).resolve().parent.parent / "traces"

# Policies in the order the paper draws them, with the paper's labels.
POLICIES = ("orca-max", "orca-pow2", "orca-oracle", "paged")
POLICY_LABELS = {"orca-max": "Orca (Max)", "orca-pow2": "Orca (Pow2)", "orca-oracle": "Orca (Oracle)", "paged": "vLLM"}

# Setup shared by Fig. 2 and Fig. 13 (paper section 6.1 / Fig. 2 caption): OPT-13B on one A100-40GB.
SETUP_OPT13B = {"model": "opt-13b", "gpu": "a100-40gb", "tp": 1}


@dataclass(frozen=True)
class LengthMeans:
    """Fig. 11: mean input (prompt) and output lengths of a dataset, in OPT tokens."""
    prompt_len: float
    output_len: float
    source: str


FIG11_MEANS = {
    "sharegpt": LengthMeans(161.31, 337.99, "Fig. 11a, ShareGPT (pairs with input + output <= 2048); " + ARXIV),
    "alpaca": LengthMeans(19.31, 58.45, "Fig. 11b, Alpaca; " + ARXIV),
}


@dataclass(frozen=True)
class BatchedRequests:
    """Fig. 13: mean number of batched requests per policy at one request rate."""
    trace: str
    rate: float  # req/s, Poisson
    values: dict  # policy -> mean batched requests
    source: str


FIG13_BATCHED = {
    "sharegpt": BatchedRequests("sharegpt", 2.0, {"orca-max": 7.00, "orca-pow2": 9.81, "orca-oracle": 13.62, "paged": 30.42},
                                "Fig. 13a, OPT-13B ShareGPT at 2 req/s; " + ARXIV),
    "alpaca": BatchedRequests("alpaca", 30.0, {"orca-max": 7.00, "orca-pow2": 43.24, "orca-oracle": 72.75, "paged": 132.44},
                              "Fig. 13b, OPT-13B Alpaca at 30 req/s; " + ARXIV),
}

# Fig. 2: share of KV cache slots (percent), OPT-13B ShareGPT at 4 req/s. None: the paper draws
# no such segment (Oracle has no internal fragmentation; for vLLM it states only token states).
FIG02_CATEGORIES = ("token_states", "reserved", "internal_fragmentation", "external_and_other")
FIG02_CATEGORY_LABELS = {"token_states": "Token states", "reserved": "Reservation",
                         "internal_fragmentation": "Internal fragmentation",
                         "external_and_other": "External fragmentation & others"}
FIG02_TRACE = "sharegpt"
FIG02_RATE = 4.0
FIG02_WINDOW_S = (300.0, 900.0)
FIG02_SHARES = {
    "orca-max": {"token_states": 20.4, "reserved": 13.3, "internal_fragmentation": 57.3, "external_and_other": 8.9},
    "orca-pow2": {"token_states": 26.8, "reserved": 17.9, "internal_fragmentation": 13.6, "external_and_other": 41.6},
    "orca-oracle": {"token_states": 38.2, "reserved": 25.2, "internal_fragmentation": None, "external_and_other": 36.6},
    "paged": {"token_states": 96.3, "reserved": None, "internal_fragmentation": None, "external_and_other": None},
}
FIG02_SOURCE = "Fig. 2, OPT-13B ShareGPT at 4 req/s, average KV slot shares; " + ARXIV


# -- comparison rows and the markdown report -----------------------------------------------------

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
        cells = [r.quantity, _fmt(r.paper, digits), _fmt(r.ours, digits), r.tolerance, f"**{r.verdict}**",
                 r.reason.replace("|", "/").replace("\n", " "), r.source]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def command_line(script: str, argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", f"experiments/{Path(script).name}", *map(shlex.quote, args)])


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


def arrival_duration(args, smoke_duration: float) -> float:
    return args.duration or (smoke_duration if args.smoke else FULL_DURATION_S if args.full else DEFAULT_DURATION_S)


def save_figure(fig, path) -> None:
    fig.tight_layout()
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
