"""bench_sim's side-by-side mode with trivial peer commands of known duration: each peer runs
right after its pagesim path in every round (interleaved), the report's median is the median of
the runs it lists, and the ratio is the two medians'. A peer naming a path that is not run is
refused."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLEEP = 0.25


def _bench(tmp_path, *args):
    out = tmp_path / "bench.md"
    run = subprocess.run([sys.executable, "-m", "benchmarks.bench_sim", "--num-requests", "20", "--big-requests", "0",
                          "--skip-in-process", "--out", str(out), *args], cwd=ROOT, capture_output=True, text=True)
    return run, out


def test_peer_commands_run_interleaved_and_are_reported_as_ratios(tmp_path):
    sleeper = f"{sys.executable} -c 'import time; time.sleep({SLEEP})'"
    run, out = _bench(tmp_path, "--repeat", "3", "--paths", "main,main-out", "--peer", f"main={sleeper}",
                      "--peer", f"main-out={sys.executable} -c pass")
    assert run.returncode == 0, run.stderr
    order = [line.split(":")[0] for line in run.stderr.splitlines() if line.startswith("round")]
    assert order == [f"round {r} {what}" for r in (1, 2, 3)
                     for what in ("main", "peer of main", "main-out", "peer of main-out")]
    report = out.read_text()
    rows = [line.split(" | ") for line in report.splitlines() if line.startswith("| main") and sys.executable in line]
    assert len(rows) == 2
    medians = {}
    for cells in rows:
        path, mine, runs, median, ratio = cells[0][2:], float(cells[1]), cells[3], float(cells[4]), float(cells[5])
        values = sorted(float(v) for v in runs.split(" / "))
        assert len(values) == 3 and median == values[1]
        # (the report's medians are rounded to 0.01 s, its ratio to 0.01)
        assert (mine - 0.005) / (median + 0.005) - 0.005 <= ratio <= (mine + 0.005) / (median - 0.005) + 0.005
        medians[path] = median
    assert medians["main"] >= SLEEP and medians["main"] > medians["main-out"]
    # the whole-command table and the target of --out against --json
    assert re.search(r"\| main-out / main <= 1\.2 \| \d+\.\d\d \| \d+\.\d\d \| \*\*(NOT )?met\*\* \|", report)


def test_a_peer_of_a_path_not_run_is_refused(tmp_path):
    run, _ = _bench(tmp_path, "--repeat", "1", "--paths", "main", "--peer", "chunked=true")
    assert run.returncode != 0 and "no path named 'chunked'" in run.stderr
