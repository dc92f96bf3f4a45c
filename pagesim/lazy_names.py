"""A package's names imported from their modules when first read (PEP 562): a command that
needs one part of a package (a help text reads a default) does not load all of it."""

from __future__ import annotations

import importlib


def lazy_getattr(package: str, homes: dict[str, str], namespace: dict):
    """The package's module `__getattr__`: name -> getattr(package.homes[name], name), kept in
    the package's `namespace` (its globals()) once read."""

    def __getattr__(name: str):
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(f"{package}.{home}"), name)
        return value

    return __getattr__
