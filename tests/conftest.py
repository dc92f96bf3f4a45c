import os

import pytest

# The Triton interpreter must be chosen before any @triton.jit function is defined.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# torch's OpenMP threads spin when the two cores are shared (measured here: a tiny-model step
# 40x slower); the tests' shapes are small, one thread is the fast choice.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    """Where the core runs compiled (scripts/compile.py), a test that replaces or counts its calls
    cannot see them: it is skipped here, and `make test` runs it again on the sources
    (PAGESIM_PURE_PYTHON=1)."""
    from pagesim._compiled import running_compiled

    if not running_compiled():
        return
    skip = pytest.mark.skip(reason="spies on calls inside modules compiled with mypyc; `make test` runs it again "
                                   "on their sources (PAGESIM_PURE_PYTHON=1)")
    for item in items:
        if "spies_on_core" in item.keywords:
            item.add_marker(skip)
