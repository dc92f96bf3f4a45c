#!/usr/bin/env python
"""Run every figure script in parallel processes and write reports/paper.md.

    python -m pagesim.experiments.run_all [--only fig12 fig13 ...] [--jobs N] [--full | --smoke] [--out-dir reports/figures]
    pagesim figures [...]   (the same, from the CLI)

A figure script is any pagesim/experiments/figNN_<name>.py that defines main(argv) and takes --smoke,
--full and --out-dir (the paper.py parsers give all three); new ones are picked up without a
change here. A script that sets `TAKES_JOBS = True` also gets --jobs N (its own process pool; the
runner's slots are its upper bound). Each runs as its own process (python -m pagesim.experiments.figNN_<name> ...), its output
in <out-dir>/logs/figNN_<name>.log, the slowest first. paper.md (reports/paper.md for the default
<out-dir>, else inside <out-dir>) gets one row per
figure: how many of the paper's numbers ours matches, the ones it does not, and links to the
figure's .png/.csv/.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent
SOURCE = EXPERIMENTS.parents[1]  # the folder holding the pagesim package: a checkout's root, or site-packages

from pagesim.experiments.figures import DEFAULT_OUT_DIR, read_verdicts
from pagesim.children import ending_on_signals, stop
from pagesim.progress import LogProgress
from pagesim.experiments.paper import ARXIV

SCRIPT_RE = re.compile(r"^(fig\d\d[a-z]?)_\w+\.py$")
# Measured wall times at the default settings (s), to start the slowest first (on two slots the
# longest-first order ends the run close to half the total); unknown ones go first. From one run of
# `pagesim figures --jobs 2` pinned to one shared core (issue 19): only the order matters here.
EXPECTED_S = {"fig18": 340, "fig14": 335, "fig12": 243, "fig16": 220, "fig15": 94, "fig13": 85, "fig19": 54,
              "fig02": 17, "fig17": 15, "fig11": 5}
TITLES = {"fig02": "KV cache slot usage", "fig11": "Input and output lengths", "fig12": "Latency vs request rate",
          "fig13": "Mean batched requests", "fig14": "Parallel sampling and beam search",
          "fig15": "Memory saved by sharing", "fig16": "Shared prefix", "fig17": "Chatbot",
          "fig18": "Kernel latency and block size", "fig19": "Swap vs recompute"}


@dataclass
class Figure:
    key: str  # fig12
    script: Path
    log: Path | None = None
    takes_jobs: bool = False
    process: subprocess.Popen | None = None
    started: float = 0.0
    wall_s: float = 0.0
    returncode: int | None = None
    outputs: dict = field(default_factory=dict)

    @property
    def stem(self) -> str:
        return self.script.stem

    @property
    def launch(self) -> list[str]:
        """How python runs it: as a module of this package (python -m pagesim.experiments.figNN_x),
        or by path for a script elsewhere."""
        if self.script.resolve().parent == EXPERIMENTS:
            return ["-m", f"pagesim.experiments.{self.stem}"]
        return [str(self.script)]


def discover(only: list[str] | None = None, directory: Path = EXPERIMENTS) -> list[Figure]:
    """Figure scripts in `directory` (a file with a `def main(` and figNN_ name), optionally only
    those whose key or stem is named in `only`. Unknown names are an error."""
    figures = []
    for path in sorted(directory.glob("fig*.py")):
        m = SCRIPT_RE.match(path.name)
        text = path.read_text()
        if m and re.search(r"^def main\(", text, re.M):
            figures.append(Figure(m.group(1), path, takes_jobs=bool(re.search(r"^TAKES_JOBS = True", text, re.M))))
    if only is not None:
        wanted = {w.strip() for item in only for w in item.split(",") if w.strip()}
        if not wanted:
            raise ValueError(f"--only names no figure; known: {', '.join(sorted(f.key for f in figures))}")
        known = {f.key for f in figures} | {f.stem for f in figures}
        unknown = sorted(wanted - known)
        if unknown:
            raise ValueError(f"no figure script for {', '.join(unknown)}; known: {', '.join(sorted(f.key for f in figures))}")
        figures = [f for f in figures if f.key in wanted or f.stem in wanted]
    return figures


def listed_figures(paper_md: Path) -> set[str]:
    """The figure keys of the table in an existing paper.md (empty if there is none)."""
    if not Path(paper_md).exists():
        return set()
    return {m.group(1) for m in re.finditer(r"^\| (fig\d\d[a-z]?) \|", Path(paper_md).read_text(), re.M)}


def check_default_target(figures: list[Figure], smoke: bool) -> None:
    """ValueError where a run into the default folder (the current folder's reports/figures and
    reports/paper.md: in a checkout, the committed results) would replace results with less: smoke
    results, or fewer figures than paper.md lists. Such runs name a folder of their own
    (--out-dir), which is the way to say so. Where there are no results yet, anything goes."""
    paper_md = default_paper_md(DEFAULT_OUT_DIR)
    if smoke and paper_md.exists():
        raise ValueError(f"--smoke results would replace the figures of {_rel(paper_md, Path.cwd())}: give a scratch "
                         "--out-dir (e.g. --out-dir /tmp/pagesim-smoke)")
    left_out = sorted(listed_figures(paper_md) - {f.key for f in figures})
    if left_out:
        raise ValueError(f"{_rel(paper_md, Path.cwd())} lists {', '.join(left_out)}, which this run leaves out: give --out-dir "
                         "for a partial run (or --out-dir reports/figures to replace paper.md with these figures only)")


def figure_args(full: bool, smoke: bool, out_dir: Path) -> list[str]:
    # relative to the current folder (the scripts' working directory) where it is inside it, so
    # each report's command reads the same on every checkout
    inside = Path(out_dir).resolve().is_relative_to(Path.cwd())
    out = _rel(out_dir, Path.cwd()) if inside else str(out_dir)
    return (["--smoke"] if smoke else []) + (["--full"] if full else []) + ["--out-dir", out]


def run(figures: list[Figure], jobs: int = 2, full: bool = False, smoke: bool = False, out_dir: Path = DEFAULT_OUT_DIR,
        paper_md: Path | None = None, progress: bool = True, python: str = sys.executable) -> Path:
    """Runs the figures, at most `jobs` at a time, then writes paper.md; returns its path.
    progress: a rich bar (a terminal), else a line per figure and one every 10 s (a log)."""
    out_dir = Path(out_dir)
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    queue = sorted(figures, key=lambda f: -EXPECTED_S.get(f.key, 10_000))
    running: list[Figure] = []
    # this pagesim first on the path: the scripts import the same one as the runner
    pythonpath = os.pathsep.join([str(SOURCE), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1",
               PYTHONPATH=pythonpath)
    t0 = time.perf_counter()
    try:
        with ending_on_signals():  # SIGTERM/SIGHUP end this runner like Ctrl-C: through the finally
            ticker = None if progress else LogProgress("figures", "figures done", len(figures), sys.stderr,
                                                    detail=lambda: "running " + ", ".join(f.key for f in running))
            with _progress(progress) as bar, ticker or _NoBar():
                overall = bar.add_task("all figures", total=len(figures)) if bar else None
                tasks = {}
                while queue or running:
                    while queue and len(running) < jobs:
                        f = queue.pop(0)
                        f.log = logs / f"{f.stem}.log"
                        f.started = time.perf_counter()
                        with open(f.log, "w") as log:
                            extra = ["--jobs", str(jobs)] if f.takes_jobs and jobs > 1 else []
                            # a process group of its own, so stopping it stops the script's own workers too
                            f.process = subprocess.Popen([python, *f.launch, *figure_args(full, smoke, out_dir), *extra], cwd=Path.cwd(),
                                                         stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
                        running.append(f)
                        if bar:
                            tasks[f.key] = bar.add_task(f.stem, total=None)
                    time.sleep(0.2)
                    for f in list(running):
                        if f.process.poll() is None:
                            continue
                        f.returncode = f.process.returncode
                        f.wall_s = time.perf_counter() - f.started
                        running.remove(f)
                        if bar:
                            bar.update(tasks[f.key], total=1, completed=1,
                                       description=f"{f.stem} [{'ok' if f.returncode == 0 else 'FAILED'} {f.wall_s:.0f} s]")
                            bar.advance(overall)
                        else:
                            print(f"{f.stem}: {'ok' if f.returncode == 0 else 'FAILED'} in {f.wall_s:.0f} s", flush=True)
                            ticker.update(len(figures) - len(queue) - len(running))
    finally:  # however the runner ends, no figure script outlives it
        stop([f.process for f in running], group=True)
    paper_md = Path(paper_md) if paper_md else default_paper_md(out_dir)
    command = " ".join(["python -m pagesim.experiments.run_all", *(["--only", *[f.key for f in figures]] if figures else []),
                        f"--jobs {jobs}", *(["--full"] if full else []), *(["--smoke"] if smoke else []),
                        f"--out-dir {_rel(out_dir, Path.cwd())}"])
    write_paper_md(paper_md, figures, out_dir, command, time.perf_counter() - t0, jobs)
    return paper_md


def failure_reason(figure: Figure, width: int = 200) -> str:
    """Why a figure script failed: the last line of its log (an exception's message), shortened."""
    try:
        lines = [line.strip() for line in Path(figure.log).read_text(errors="replace").splitlines() if line.strip()]
    except (OSError, TypeError):
        return "no log"
    if not lines:
        return f"exit {figure.returncode}, nothing in its log"
    return lines[-1] if len(lines[-1]) <= width else lines[-1][:width - 3] + "..."


def default_paper_md(out_dir: Path) -> Path:
    """reports/paper.md for the default reports/figures; inside any other --out-dir, so a run
    into a folder of its own writes nothing outside it."""
    out_dir = Path(out_dir)
    return out_dir.parent / "paper.md" if out_dir.resolve() == DEFAULT_OUT_DIR.resolve() else out_dir / "paper.md"


def write_paper_md(path: Path, figures: list[Figure], out_dir: Path, command: str, wall_s: float, jobs: int) -> None:
    lines = [f"# Paper reproduction: Kwon et al., SOSP 2023 ({ARXIV})", "", "Command (one run, all figures below):",
             "", "```", command, "```", "",
             f"{len(figures)} figure scripts, {jobs} at a time, {wall_s:.0f} s in all. Each figure's .md has the exact "
             "command, our number beside the paper's for every number the paper states, a verdict per row and, "
             "where not within, the reason as far as we can tell.", "",
             "| figure | what | run | verdict | not within | files |", "|---|---|---|---|---|---|"]
    for f in sorted(figures, key=lambda f: f.key):
        files = {ext: out_dir / f"{f.stem}.{ext}" for ext in ("png", "csv", "md")}
        links = " · ".join(f"[{ext}]({_rel(p, path.parent)})" for ext, p in files.items() if p.exists())
        status = "ok" if f.returncode == 0 else (f"FAILED (exit {f.returncode}: {failure_reason(f).replace('|', '/')}; "
                                                 f"log {_rel(f.log, path.parent)})")
        verdict, misses = "-", ""
        if f.returncode == 0 and files["md"].exists():
            v = read_verdicts(files["md"])
            verdict = f"{v.num_within} of {v.num_rows} within"
            misses = "; ".join(v.not_within).replace("|", "/")
        lines.append(f"| {f.key} | {TITLES.get(f.key, f.stem)} | {status}, {f.wall_s:.0f} s | {verdict} | {misses} | {links} |")
    notes = path.parent / "paper_notes.md"  # the hand-written analysis of the misses, kept across runs
    if notes.exists():
        lines += ["", f"Why the remaining misses miss, by cause, and what the calibrated cost model moved: [{notes.name}]({notes.name})."]
    path.write_text("\n".join(lines) + "\n")


def _rel(p: Path, base: Path) -> str:
    try:
        return os.path.relpath(Path(p).resolve(), Path(base).resolve())
    except ValueError:
        return str(p)


class _NoBar:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _progress(enabled: bool):
    if not enabled:
        return _NoBar()
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", default=None, help="figure keys or script stems (fig12, fig13_batched_requests)")
    p.add_argument("--jobs", type=int, default=2, help="figure scripts running at once")
    p.add_argument("--full", action="store_true", help="the paper's 3600 s of arrivals")
    p.add_argument("--smoke", action="store_true", help="every script in its seconds-long smoke mode")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="default reports/figures (refused for --smoke and for fewer figures than reports/paper.md lists)")
    p.add_argument("--paper-md", type=Path, default=None,
                   help="default: reports/paper.md for the default --out-dir, else paper.md inside --out-dir")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    try:
        figures = discover(args.only)
        if args.out_dir is None and args.paper_md is None:
            check_default_target(figures, args.smoke)
    except ValueError as e:
        p.error(str(e))
    args.out_dir = args.out_dir or DEFAULT_OUT_DIR
    started = time.perf_counter()
    path = run(figures, args.jobs, args.full, args.smoke, args.out_dir, args.paper_md, progress=not args.no_progress)
    print(f"wrote {path}: {len(figures)} figure scripts, {args.jobs} at a time, {time.perf_counter() - started:.0f} s wall in all")
    return path


if __name__ == "__main__":
    main()
