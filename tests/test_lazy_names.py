"""pagesim.lazy_names: a package's names read from their modules on first use."""

import importlib
import subprocess
import sys

import pytest


def test_a_name_is_its_modules_object_and_kept_once_read():
    code = ("import sys, pagesim.core as core\n"
            "assert 'pagesim.core.scheduler' not in sys.modules and 'Scheduler' not in vars(core)\n"
            "from pagesim.core.scheduler import Scheduler\n"
            "assert core.Scheduler is Scheduler and vars(core)['Scheduler'] is Scheduler\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("package", ["pagesim.core", "pagesim.sim.cost"])
def test_an_unknown_name_is_an_attribute_error_naming_the_package(package):
    module = importlib.import_module(package)
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'NoSuchName'"):
        module.NoSuchName
    assert all(hasattr(module, name) for name in module.__all__)  # every listed name resolves
