"""The modules scripts/compile.py compiled with mypyc, and when to import their sources instead.

A build leaves an extension beside each module's source, which Python imports in the source's
place, and pagesim/_compiled.json: each module and the hash of the source it was built from. At
`import pagesim` (before any of them is imported), the sources are imported instead of every
extension of the build where PAGESIM_PURE_PYTHON=1 asks for it, or where a source is not the one
its extension was built from (an edit since the build; it says so, once). All of them go together:
mypyc's modules call one another's compiled code directly.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
MANIFEST = PACKAGE / "_compiled.json"


class _SourceFinder:
    """A finder ahead of the usual ones that imports these modules from their .py files."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        source = source_of(name)
        loader = importlib.machinery.SourceFileLoader(name, str(source))
        return importlib.util.spec_from_file_location(name, source, loader=loader)


def source_of(name: str) -> Path:
    """A module's .py file."""
    return PACKAGE.parent.joinpath(*name.split(".")).with_suffix(".py")


def compiled_modules() -> dict[str, str]:
    """The build's modules and the hashes of their sources ({} without a build)."""
    try:
        return json.loads(MANIFEST.read_text())["modules"]
    except (OSError, ValueError, KeyError):
        return {}


def stale_modules(modules: dict[str, str]) -> list[str]:
    """The modules whose source is not the one they were built from."""
    stale = []
    for name, built_from in modules.items():
        try:
            now = hashlib.sha256(source_of(name).read_bytes()).hexdigest()
        except OSError:
            now = None
        if now != built_from:
            stale.append(name)
    return stale


def running_compiled() -> bool:
    """Whether the compiled modules are the ones imported (not their sources)."""
    modules = compiled_modules()
    if not modules:
        return False
    module = importlib.import_module(min(modules))
    return not (module.__file__ or "").endswith(".py")


def use_sources_where_stale() -> None:
    modules = compiled_modules()
    if not modules or any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        return
    pure = os.environ.get("PAGESIM_PURE_PYTHON", "") not in ("", "0")
    stale = [] if pure else stale_modules(modules)
    if pure or stale:
        if stale:
            print(f"pagesim: {stale[0].replace('.', '/')}.py changed after it was compiled: running every compiled "
                  f"module from source (python scripts/compile.py compiles them again)", file=sys.stderr)
        sys.meta_path.insert(0, _SourceFinder(set(modules)))
