"""Issue 26 item 7: an executor command ends without nanobind's "leaked ..." report.

The cause: NoiseControl.apply() freezes the collector's objects (gc.freeze) after the model
loads; frozen objects are never collected, so triton's (torch imports triton through
torch._dynamo) were still alive when libtriton was torn down, and nanobind reported each as a
leak. apply() now registers gc.unfreeze at exit."""

from __future__ import annotations

import subprocess
import sys

from tests.executor.test_run_inputs import ALPACA
from tests.serve.conftest import ROOT, cli_env


def test_pagesim_run_stderr_has_no_nanobind_leak_report(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pagesim.cli", "run", str(ALPACA), "--model", "random:llama-tiny",
                           "--num-requests", "2", "--rate", "20", "--out", str(tmp_path / "run")],
                          cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "summary.json").exists()
    assert "nanobind" not in done.stderr, done.stderr[-2000:]
    assert "triton" in subprocess.run(  # the check is not vacuous: the command's process did load triton
        [sys.executable, "-c", "import sys, executor.models.loader as l; l.load_model('random:llama-tiny'); "
                               "print(sorted(m for m in sys.modules if m == 'triton'))"],
        cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300).stdout
