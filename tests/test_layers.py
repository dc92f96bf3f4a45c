"""The import contracts in pyproject.toml ([tool.importlinter]: core <- drivers <- applications, a
core free of heavy libraries) hold for this tree, and the same contracts break on a tree that
imports upwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def lint(tree: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run([sys.executable, "-c", LINT, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=tree, env=env, capture_output=True, text=True)


def test_the_tree_keeps_its_layers():
    run = lint(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


@pytest.mark.parametrize("module, imports, broken", [
    ("pagesim/core/scheduler.py", "import pagesim.sim.engine", "Layers"),  # the core reaching up
    ("executor/engine.py", "import pagesim.sim.engine", "Layers"),  # one driver importing the other
    ("pagesim/sim/engine.py", "import pagesim.plan", "Layers"),  # a driver importing an application
    ("pagesim/realruns/types.py", "import pagesim.sim.engine", "Layers"),  # the real-run readers reaching a driver
    ("pagesim/cluster/__init__.py", "import pagesim.route", "Layers"),  # the routers reaching the HTTP router
    ("pagesim/core/step.py", "import torch", "nothing heavy"),
    ("pagesim/view/__init__.py", "import pagesim.cli", "Layers"),  # the page reaching the command line
    ("pagesim/plan/__init__.py", "import pagesim.api", "never imports the API"),  # the old cycle with pagesim.api
])
def test_an_upward_import_breaks_a_contract(tmp_path, module, imports, broken):
    # the layers' packages, empty but for one import that goes the wrong way
    for pkg in ("pagesim", "pagesim/core", "pagesim/workload", "pagesim/models", "pagesim/sim", "pagesim/plan",
                "pagesim/cli", "executor", "pagesim/experiments", "pagesim/realruns", "pagesim/cluster",
                "pagesim/route", "pagesim/view"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    for name in ("pagesim/metrics.py", "pagesim/compare.py", "pagesim/validate.py", "pagesim/engine_fit.py",
                 "pagesim/sim/engine.py", "pagesim/inputs.py", "pagesim/progress.py", "pagesim/lazy_names.py",
                 "pagesim/api.py"):
        (tmp_path / name).write_text("")
    (tmp_path / module).write_text(imports + "\n")
    run = lint(tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 broken" in run.stdout and broken in run.stdout.split("BROKEN")[0].splitlines()[-1]
