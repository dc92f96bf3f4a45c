"""A trace stamped in Unix time (allowed by the trace format) with --rate 0: every driver starts at
its first arrival (no sleeping until t = 1.7e9 s) and counts --warmup from it (issue 26, item 3).
Each driver runs in a subprocess with a timeout, so a regression fails instead of hanging."""

from __future__ import annotations

import csv
import subprocess
import sys
import time

import pytest

from pagesim.workload.trace import Trace, TraceRequest, save_trace

from .conftest import ROOT, strict_json
from .fake_server import FakeServer

T0 = 1_700_000_000.0
OFFSETS = [0.0, 0.1, 0.3]  # arrivals, from the first; --warmup 0.2 leaves the first two out


@pytest.fixture
def unix_trace(tmp_path):
    path = tmp_path / "unix.json"
    save_trace(Trace({"source": "tests/bench", "count": 3},
                     [TraceRequest(6, 3, arrival_time=T0 + dt) for dt in OFFSETS]), path)
    return path


def pagesim(*args: str, timeout: float = 120):
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pagesim.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return done, time.monotonic() - started


def test_bench_starts_at_the_first_arrival(unix_trace, tmp_path):
    with FakeServer() as server:
        done, wall = pagesim("bench", str(unix_trace), "--endpoint", server.base, "--rate", "0", "--warmup", "0.2",
                             "--num-requests", "3", "--vocab-size", "100", "--out", str(tmp_path / "out"), "--json",
                             timeout=60)
    assert done.returncode == 0, done.stderr
    summary = strict_json(done.stdout)
    assert summary["num_finished"] == 3 and summary["num_measured"] == 1 and summary["warmup_s"] == 0.2
    assert 0.3 <= summary["duration_s"] < wall
    with open(tmp_path / "out" / "requests.csv") as f:
        arrivals = [float(r["arrival_time"]) for r in csv.DictReader(f)]
    assert arrivals == pytest.approx([T0 + dt for dt in OFFSETS], abs=1e-6)  # the trace's own stamps, as replay's


def test_replay_counts_the_warmup_from_the_first_arrival(unix_trace):
    done, _ = pagesim("replay", str(unix_trace), "--rate", "0", "--warmup", "0.2", "--num-requests", "3", "--json")
    assert done.returncode == 0, done.stderr
    summary = strict_json(done.stdout)
    assert summary["num_finished"] == 3 and summary["num_measured"] == 1


@pytest.mark.slow
def test_run_starts_at_the_first_arrival(unix_trace):
    done, _ = pagesim("run", str(unix_trace), "--model", "random:llama-tiny", "--rate", "0", "--warmup", "0.2",
                      "--num-requests", "3", "--num-gpu-blocks", "32", "--num-cpu-blocks", "8", "--json", timeout=240)
    assert done.returncode == 0, done.stderr
    summary = strict_json(done.stdout)
    assert summary["num_finished"] == 3 and summary["num_measured"] == 1
    assert summary["duration_s"] >= 0.3  # the arrivals' own spacing was kept
