"""The plan cache is keyed by content and re-simulates entries it cannot use; the plan's worker
processes need no main guard in the caller's script, fail the plan when they die, and end with
their parent on SIGTERM and SIGHUP (issues 25 and 26)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from pagesim.plan.cache import RunCache, run_key, trace_hash
from pagesim.plan.grid import GridPoint
from pagesim.plan.run import RateEvaluator, record_problem
from pagesim.plan.slo import parse_slos
from pagesim.plan.workers import WorkerDied, run_in_workers
from pagesim.sim.specs import get_model

from tests.plan.common import ROOT, SMALL_TRACE, TINY_RUNS

POINT = GridPoint("a100-80gb", 1, 16, "recompute", 256)
SLOS = parse_slos("ttft_p99=2")
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def write_config(path: Path, num_layers: int) -> None:
    """A LLaMA-family config.json (Llama-2-7B's shape, the layer count varied)."""
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                                "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": num_layers,
                                "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 4096,
                                "torch_dtype": "float16"}))


def test_the_key_follows_the_model_content_not_its_path(tmp_path):
    config = tmp_path / "config.json"
    write_config(config, 32)
    assert get_model(str(config)).num_layers == 32
    settings = replace(TINY_RUNS, model=str(config))
    digest = trace_hash(SMALL_TRACE)
    before = run_key(settings.replay_config(POINT, 2.0), digest)
    write_config(config, 80)  # the same path, another model (one that leaves far less KV memory)
    after = run_key(settings.replay_config(POINT, 2.0), digest)
    assert before != after
    write_config(config, 32)  # and back: the first key again (content, not modification time)
    assert run_key(settings.replay_config(POINT, 2.0), digest) == before


@pytest.mark.parametrize("stored", [
    "not json at all",
    json.dumps([1, 2, 3]),
    json.dumps({"rate": 2.0, "error": None}),  # another shape: fields missing
    json.dumps({"rate": 3.0, "error": "from another rate"}),
])
def test_an_entry_it_cannot_use_is_simulated_again(tmp_path, stored):
    cache = RunCache(tmp_path)
    digest = trace_hash(SMALL_TRACE)
    key = run_key(TINY_RUNS.replay_config(POINT, 2.0), digest)
    path = cache._path(key)
    path.parent.mkdir(parents=True)
    path.write_text(stored)
    evaluate = RateEvaluator(TINY_RUNS, POINT, SMALL_TRACE, digest, SLOS, cache)
    fresh = evaluate.single(2.0, TINY_RUNS.num_requests)  # one run, whose cache entry is the bad one
    assert (evaluate.num_simulated, evaluate.num_cached) == (1, 0)
    assert fresh.error is None and fresh.stats["num_finished"] == TINY_RUNS.num_requests
    record = json.loads(path.read_text())  # overwritten with a good record, used from now on
    assert record_problem(record, 2.0) is None
    again = RateEvaluator(TINY_RUNS, POINT, SMALL_TRACE, digest, SLOS, cache)
    assert again.single(2.0, TINY_RUNS.num_requests).to_dict() == fresh.to_dict() and again.num_cached == 1


SCRIPT = """
import pagesim

# no `if __name__ == "__main__":` guard, as in docs/api.md
plan = pagesim.plan(model="llama-2-7b", trace={trace!r}, target_rate=5, slo="ttft_p99=2",
                    gpus=["a100-80gb", "h100-80gb"], num_requests=40, min_duration=0, tolerance=0.1, jobs=2,
                    min_measured=50, max_requests=1280, seeds=1, check_longer=0)
print("capacities", [round(r.capacity, 3) for r in plan.results])
"""


def test_plan_with_jobs_in_a_script_without_a_main_guard(tmp_path):
    script = tmp_path / "plan_script.py"
    script.write_text(SCRIPT.format(trace=str(ROOT / "traces" / "sharegpt.json")))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    parallel = done.stdout.split("capacities")[1].strip()
    # the same plan in one process (no workers) gives the same capacities
    serial = subprocess.run([sys.executable, "-c", SCRIPT.format(trace=str(ROOT / "traces" / "sharegpt.json"))
                             .replace("jobs=2", "jobs=1")], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                            timeout=300)
    assert serial.returncode == 0, serial.stderr
    assert parallel == serial.stdout.split("capacities")[1].strip()


def test_a_worker_that_dies_fails_the_plan_at_once():
    started = time.monotonic()
    with pytest.raises(WorkerDied, match="exited with status 3"):
        for _ in run_in_workers(os._exit, [3, 3], workers=2):  # each job ends its worker outright
            pass
    assert time.monotonic() - started < 60
    with pytest.raises(ValueError, match="math domain error"):  # a job's own exception is raised as itself
        list(run_in_workers(math.log, [0.0, 1.0], workers=2))


def children_of(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.add(int(entry.name))
    return out


def alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_plan_workers_end_with_the_parent(tmp_path, signame):
    """`pagesim plan --jobs 2` killed by SIGTERM or SIGHUP while its workers search: the parent
    exits, and within seconds no worker is left (they used to run on, orphaned)."""
    cmd = [sys.executable, "-m", "pagesim.cli", "plan", "--model", "llama-2-7b", "--trace",
           str(ROOT / "traces" / "sharegpt.json"), "--target-rate", "5", "--slo", "ttft_p99=2",
           "--gpus", "a100-80gb,h100-80gb", "--num-requests", "3000", "--jobs", "2", "--no-cache",
           "--out", str(tmp_path / "plan")]
    parent = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        workers: set[int] = set()
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline and parent.poll() is None:
            workers = children_of(parent.pid)
            time.sleep(0.1)
        assert len(workers) == 2, "the plan never started its two workers"
        time.sleep(1)  # the workers are searching now
        parent.send_signal(getattr(signal, signame))
        parent.wait(timeout=60)
        deadline = time.monotonic() + 20
        while alive(workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(workers), f"workers {alive(workers)} outlived the plan"
        assert parent.returncode == 128 + getattr(signal, signame)
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in alive(children_of(parent.pid)):
            os.kill(pid, signal.SIGKILL)
