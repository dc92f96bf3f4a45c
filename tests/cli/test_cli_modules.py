"""Each command module can be imported first, in a fresh interpreter (a test or a script that
imports `pagesim.cli.replay` for its names before anything else). A module registers its command
while it is being imported; that must not import the other command modules, some of which import
names from it that are not defined yet (run.py imports replay's)."""

import subprocess
import sys

import pytest

from pagesim.cli import COMMAND_MODULES


@pytest.mark.parametrize("name", COMMAND_MODULES)
def test_a_command_module_imports_first_in_a_fresh_interpreter(name):
    done = subprocess.run([sys.executable, "-c", f"import pagesim.cli.{name}"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
