"""The modules scripts/compile.py compiles with mypyc run as their sources do.

The reference is the sources themselves: each replay below runs twice, on the compiled modules and
on their sources (PAGESIM_PURE_PYTHON=1), and every output file must be the same bytes. The cases
cover what the compiled code handles differently from Python if an annotation is wrong (an int
kept as an int: a trace's own integer times, a closed loop's releases; budgets; ints and
infinities mixed in decode runs), the classes that uncompiled ones extend (a sliding-window model's HybridKVManager,
the reservation managers), forks (beam search, parallel samples), swap and prefix caching, and
results pickled back from forked workers (a cluster). Then the guard of pagesim/_compiled.py: a
source edited after its build is imported instead of every compiled module, and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pagesim._compiled import running_compiled

REPO = Path(__file__).resolve().parent.parent

CASES = {
    "paged": ["traces/sharegpt.json", "--num-requests", "300", "--rate", "4"],
    "trace-times": ["traces/mooncake_conversation.json", "--num-requests", "200", "--rate", "0", "--model",
                    "llama-3.1-8b", "--gpu", "h100-80gb", "--prefix-caching"],
    "closed-loop": ["traces/alpaca.json", "--num-requests", "200", "--concurrency", "16"],
    "chunked": ["traces/sharegpt.json", "--num-requests", "300", "--rate", "6", "--model", "llama-2-7b", "--gpu",
                "a100-80gb", "--chunked-prefill", "--max-num-batched-tokens", "512"],
    "prefix": ["traces/sharegpt_chat.json", "--num-requests", "300", "--rate", "8", "--model", "llama-2-7b", "--gpu",
               "a100-80gb", "--chunked-prefill", "--prefix-caching"],
    "swap": ["traces/sharegpt.json", "--num-requests", "200", "--rate", "20", "--preemption", "swap", "--n", "2",
             "--num-gpu-blocks", "300"],
    "beam": ["traces/alpaca.json", "--num-requests", "100", "--rate", "4", "--beam-width", "4"],
    "reservation": ["traces/sharegpt.json", "--num-requests", "200", "--rate", "4", "--policy", "orca-pow2"],
    "sliding-window": ["traces/sharegpt.json", "--num-requests", "200", "--rate", "20", "--model", "gemma-2-9b",
                       "--gpu", "a100-80gb", "--preemption", "swap", "--n", "2", "--num-gpu-blocks", "400"],
    "cluster": ["traces/sharegpt.json", "--num-requests", "400", "--rate", "8", "--replicas", "3"],
}


def _replay(args: list[str], out: Path, pure: bool) -> dict[str, bytes]:
    """Every output of the replay (stdout and the files under out), by name."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PAGESIM_PURE_PYTHON="1" if pure else "0")
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "pagesim.cli", "replay", *args, "--out", str(out), "--json"],
                          cwd=REPO, env=env, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    outputs = {path.relative_to(out).as_posix(): path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}
    outputs["(stdout)"] = proc.stdout
    return outputs


@pytest.mark.skipif(not running_compiled(), reason="no compiled build here (python scripts/compile.py makes one)")
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_modules_give_the_sources_outputs(case, tmp_path):
    # (the same folder for both: the outputs name it)
    compiled = _replay(CASES[case], tmp_path / "out", pure=False)
    source = _replay(CASES[case], tmp_path / "out", pure=True)
    assert "requests.csv" in compiled and len(compiled) >= 3, sorted(compiled)
    assert sorted(compiled) == sorted(source)
    differing = [name for name in compiled if compiled[name] != source[name]]
    assert not differing, differing


def _copy_package(tmp_path: Path) -> Path:
    """The package as it is here (with its build, if any), beside nothing else."""
    root = tmp_path / "tree"
    shutil.copytree(REPO / "pagesim", root / "pagesim", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _origin(root: Path, module: str, pure: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root), PAGESIM_PURE_PYTHON="1" if pure else "0")
    return subprocess.run([sys.executable, "-c", f"import {module} as m; print(m.__file__)"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_source_changed_after_its_build_is_imported_instead(tmp_path):
    """A manifest whose hash of scheduler.py is not the file's (as after an edit): every module it
    lists is imported from source, and one line says which file changed."""
    import hashlib

    root = _copy_package(tmp_path)
    names = ["pagesim.core.scheduler", "pagesim.core.paged"]
    hashes = {name: hashlib.sha256((root / (name.replace(".", "/") + ".py")).read_bytes()).hexdigest()
              for name in names}
    hashes["pagesim.core.scheduler"] = "0" * 64  # (built from another text)
    (root / "pagesim" / "_compiled.json").write_text(json.dumps({"group": "pagesim._native", "modules": hashes}))
    for name in names:
        proc = _origin(root, name)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == str(root / (name.replace(".", "/") + ".py"))
        assert proc.stderr.count("\n") == 1 and "pagesim/core/scheduler.py changed after it was compiled" in proc.stderr


@pytest.mark.skipif(not running_compiled(), reason="no compiled build here (python scripts/compile.py makes one)")
def test_the_build_is_imported_until_a_source_changes(tmp_path):
    root = _copy_package(tmp_path)
    built = _origin(root, "pagesim.core.scheduler")
    assert built.stdout.strip().endswith(".so") and not built.stderr, (built.stdout, built.stderr)
    pure = _origin(root, "pagesim.core.scheduler", pure=True)
    assert pure.stdout.strip().endswith("scheduler.py") and not pure.stderr
    with open(root / "pagesim" / "core" / "decode_batch.py", "a") as source:
        source.write("\n# an edit\n")
    edited = _origin(root, "pagesim.core.scheduler")
    assert edited.stdout.strip().endswith("scheduler.py"), edited.stdout
    assert "pagesim/core/decode_batch.py changed after it was compiled" in edited.stderr
