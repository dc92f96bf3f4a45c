"""Compile the replay's hot modules with mypyc, in place: `python scripts/compile.py [--clean]`.

The modules below are plain, typed Python; mypyc (mypy's compiler) turns each into a C extension
that sits beside its source and is imported in its place (reports/bench_sim.md and
reports/bench_instructions.md say how much faster). Nothing else changes: the sources stay the code that is read, tested and
imported wherever no extension was built (a wheel installed without this step, a machine without
a C compiler, or PAGESIM_PURE_PYTHON=1). `make setup` runs this script; where it cannot compile,
it says so in one line and pagesim runs as plain Python.

Each build writes pagesim/_compiled.json: the compiled modules and a hash of each one's source.
pagesim/__init__.py compares those hashes at import, and where a source changed after its build,
runs every compiled module from source (mypyc's modules call one another directly, so they go
together) and says so once: an edited file is never shadowed by a stale extension.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (the replay's inner loop: scheduling, the KV manager, decode runs, the step log)
MODULES = [
    "pagesim/core/request.py",
    "pagesim/core/step.py",
    "pagesim/core/block_keys.py",
    "pagesim/core/kept_keys.py",
    "pagesim/core/kv_manager.py",
    "pagesim/core/block_pool.py",
    "pagesim/core/paged.py",
    "pagesim/core/decode_batch.py",
    "pagesim/core/decode_runs.py",
    "pagesim/core/scheduler.py",
    "pagesim/sim/run_times.py",
    "pagesim/metrics/step_log.py",
    "pagesim/metrics/recording.py",
]
GROUP = "pagesim._native"  # the shared library of the group: pagesim/_native__mypyc*.so
MANIFEST = ROOT / "pagesim" / "_compiled.json"
BUILD = ROOT / "build" / "mypyc"


def source_hashes() -> dict[str, str]:
    """Each module's name and the hash of its source, as the manifest records them."""
    return {path[:-3].replace("/", "."): hashlib.sha256((ROOT / path).read_bytes()).hexdigest() for path in MODULES}


def built_files() -> list[Path]:
    """The extensions a build left in the source tree."""
    found = [p for m in MODULES for p in (ROOT / m).parent.glob(Path(m).stem + ".*.so")]
    return found + list((ROOT / "pagesim").glob("_native__mypyc.*.so"))


def up_to_date() -> bool:
    """A build of these modules from these very sources is in place."""
    try:
        built = json.loads(MANIFEST.read_text())["modules"]
    except (OSError, ValueError, KeyError):
        return False
    return built == source_hashes() and len(built_files()) == len(MODULES) + 1


def clean() -> None:
    for path in built_files():
        path.unlink()
    MANIFEST.unlink(missing_ok=True)
    shutil.rmtree(BUILD, ignore_errors=True)


def compile_modules() -> None:
    """Build in a child process (setuptools' setup() exits on errors), then write the manifest."""
    clean()
    hashes = source_hashes()
    code = ("import sys; from setuptools import setup; from mypyc.build import mypycify; "
            "setup(name='pagesim-native', script_args=['build_ext', '--inplace', '-j', '2', '--build-temp', sys.argv[2]], "
            "ext_modules=mypycify(sys.argv[3:], group_name=sys.argv[1], target_dir=sys.argv[2], opt_level='3'))")
    env = dict(os.environ, MYPYC_OPT_LEVEL="3")
    BUILD.mkdir(parents=True, exist_ok=True)
    # (mypy checks the modules it compiles; what they import is only read for its types)
    options = ["--follow-imports=silent", "--ignore-missing-imports"]
    proc = subprocess.run([sys.executable, "-c", code, GROUP, str(BUILD), *options, *MODULES], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        clean()
        log = BUILD.parent / "mypyc.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(proc.stdout + proc.stderr)
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"mypyc failed ({last}); the whole log is in {log}")
    MANIFEST.write_text(json.dumps({"group": GROUP, "modules": hashes}, indent=1, sort_keys=True) + "\n")


def main(argv: list[str]) -> int:
    if argv[1:] == ["--clean"]:
        clean()
        return 0
    if argv[1:]:
        print("usage: python scripts/compile.py [--clean]", file=sys.stderr)
        return 2
    if importlib.util.find_spec("mypyc") is None:
        print("pagesim: not compiled (mypy is not installed: pip install -e '.[compile]'); runs as plain Python")
        return 0
    if up_to_date():
        print(f"pagesim: {len(MODULES)} modules compiled already (from these sources)")
        return 0
    try:
        compile_modules()
    except (RuntimeError, OSError) as error:
        print(f"pagesim: not compiled: {error}; runs as plain Python")
        return 0
    print(f"pagesim: compiled {len(MODULES)} modules with mypyc")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
