"""Where a replay's wall time goes, per event: the simulator's inner loop, function by function.

Usage:  python -m benchmarks.profile_sim --out reports/profile_sim.md

Replays the issue-19 workload in-process (trace loaded and Replay built beforehand): once as is,
for the plain replay time, then with a perf_counter wrapper around each of the inner loop's
functions (the wrappers add about a microsecond a call, so the shares are of the wrapped run).
Indented rows are inside the row above them. cProfile would multiply the cost of every Python
call several times over, which is exactly what this loop is made of, so it is not used here.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import platform
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Profiled on the sources: the functions this wraps cannot be wrapped in a module compiled by
# mypyc (scripts/compile.py), whose calls go straight to one another.
os.environ["PAGESIM_PURE_PYTHON"] = "1"

from pagesim.core import decode_runs  # noqa: E402
from pagesim.core.scheduler import Scheduler  # noqa: E402
from pagesim.metrics import MetricsRecorder  # noqa: E402
from pagesim.sim import engine  # noqa: E402
from pagesim.workload.trace import load_trace  # noqa: E402

# (label, owner, attribute, depth): depth 1 rows are called from the depth 0 row above them
TIMED = [
    ("plan_decode", engine, "plan_decode", 0),
    ("  _queued_group_could_start", decode_runs, "_queued_group_could_start", 1),
    ("advance_decode", engine, "advance_decode", 0),
    ("run_times", engine, "run_times", 0),
    ("MetricsRecorder.record_decode_run", MetricsRecorder, "record_decode_run", 0),
    ("Scheduler.schedule", Scheduler, "schedule", 0),
    ("Scheduler.update", Scheduler, "update", 0),
    ("MetricsRecorder.record_step", MetricsRecorder, "record_step", 0),
    ("Replay._done (request records)", engine.Replay, "_done", 0),
]


def wrap_timed(owner, name: str, label: str, total: Counter, calls: Counter) -> None:
    func = getattr(owner, name)

    @functools.wraps(func)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        result = func(*args, **kwargs)
        total[label] += time.perf_counter() - start
        calls[label] += 1
        return result

    setattr(owner, name, timed)


@contextlib.contextmanager
def timers(timed: list, total: Counter, calls: Counter):
    """wrap_timed on each (label, owner, attribute, depth) of timed while the context is open; the
    functions are put back after."""
    originals = [(owner, name, getattr(owner, name)) for _, owner, name, _ in timed]
    for label, owner, name, _depth in timed:
        wrap_timed(owner, name, label, total, calls)
    try:
        yield
    finally:
        for owner, name, func in originals:
            setattr(owner, name, func)


def timed_run(sim):
    """(seconds, result) of one replay built beforehand."""
    start = time.perf_counter()
    result = sim.run()
    return time.perf_counter() - start, result


def _replay(trace, num_requests: int, rate: float):
    return timed_run(engine.Replay(engine.ReplayConfig(num_requests=num_requests, rate=rate), trace, keep_steps=False))


def parse_args(doc: str, report: str) -> argparse.Namespace:
    """The profiles' options: where the report goes (reports/REPORT by default) and the run's size."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / report)
    ap.add_argument("--num-requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=2.0)
    return ap.parse_args()


def machine_line() -> str:
    return (f"Machine: {os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}; load average at "
            f"the end {' / '.join(f'{x:.2f}' for x in os.getloadavg())} (1 / 5 / 15 min)")


def write_report(path: Path, lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(text)


def main() -> None:
    args = parse_args(__doc__, "profile_sim.md")

    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    plain, _ = _replay(trace, args.num_requests, args.rate)
    total, calls = Counter(), Counter()
    with timers(TIMED, total, calls):
        wrapped, result = _replay(trace, args.num_requests, args.rate)

    # events: the engine's trips round its loop (a prefill or other single step, or a decode run)
    events = calls["Scheduler.schedule"] + calls["advance_decode"]
    outside = wrapped - sum(total[label] for label, _, _, depth in TIMED if depth == 0)
    command = f"python -m benchmarks.profile_sim --num-requests {args.num_requests} --rate {args.rate}"
    lines = [
        "# Where the replay's time goes (benchmarks/profile_sim.py)",
        "",
        f"Command: `{command}`",
        "",
        machine_line() + ": a shared machine inflates every row alike.",
        "",
        f"ShareGPT, {args.num_requests:,} requests at {args.rate} req/s, OPT-13B on A100-40GB, paged, calibrated cost model, "
        f"no step records: {result.summary['num_steps']:,} iterations in {events:,} events "
        f"({calls['Scheduler.schedule']:,} single steps, {calls['advance_decode']:,} decode runs).",
        "",
        f"Replay time {plain:.3f} s unwrapped ({plain / events * 1e6:.1f} us per event); {wrapped:.3f} s with the "
        "wrappers below.",
        "",
        "| function | calls | total (s) | per call (us) | share of the wrapped run |",
        "|---|---|---|---|---|",
    ]
    for label, _, _, _ in TIMED:
        t, n = total[label], calls[label]
        lines.append(f"| `{label}` | {n:,} | {t:.3f} | {t / n * 1e6 if n else 0:.1f} | {t / wrapped:.0%} |")
    lines.append(f"| everything else (engine loop, SimPy events, arrivals, cost model for single steps) | | "
                 f"{outside:.3f} | {outside / events * 1e6:.1f} per event | {outside / wrapped:.0%} |")
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
