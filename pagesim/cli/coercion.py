"""Turning command-line strings into parameter values without pydantic.

Recent typers coerce every parameter through a pydantic TypeAdapter: importing pydantic and
building one adapter per parameter costs about 90 ms on each `pagesim` invocation, a third of
a short replay. Nearly all of pagesim's parameters need nothing pydantic offers: a `parser=`
(our own checked numbers and output paths, pagesim.cli.checks), a plain string, a flag, an enum
of choices or a path. For exactly those, `install` has typer's lazily built per-parameter
coercion be a `LightCoercion`, which gives the same values and the same error messages through
typer's own choice and path helpers; any other annotation (lists, bare ints and floats, files,
...) keeps typer's adapter, built on first use as before. Typers without
these internals (before 0.2x) do not use pydantic at all, and `install` leaves them alone.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any

import typer

try:
    from typer._coercion import RuntimeParam
    from typer._param_types import coerce_cli_choice, coerce_cli_path, routes_to_path
    from typer.core import _TyperParameter
except ImportError:  # an older typer: click's own types, no pydantic to avoid
    RuntimeParam = _TyperParameter = None


class LightCoercion(RuntimeParam or object):
    """One parameter's coercion for the annotations `handles` accepts."""

    def _coerce_value(self, value: Any, param, ctx) -> Any:
        info, annotation = self.parameter_info, self.annotation
        try:
            if info.parser is not None:
                return info.parser(value)
            if isinstance(annotation, type) and issubclass(annotation, Enum):
                return coerce_cli_choice(value, choices=list(annotation), case_sensitive=info.case_sensitive, ctx=ctx)
            if annotation is str:
                return value if isinstance(value, str) else _text(value)
            if annotation is bool:
                return _flag(value, param, ctx)
            # a Path: typer's own checks (exists, readable, ...), given a Path so it needs no adapter
            return coerce_cli_path(value if isinstance(value, annotation) else annotation(value), info,
                                   path_type=annotation, param=param, ctx=ctx)
        except ValueError as e:  # worded as typer's pydantic adapters word a validator's ValueError
            raise typer.BadParameter(f"Value error, {e}", ctx=ctx, param=param) from e


# the strings pydantic's lax bool accepts (what typer's adapter for a bool option takes)
_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no", ""}


def _flag(value: Any, param, ctx) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise typer.BadParameter("Input should be a valid boolean, unable to interpret input", ctx=ctx, param=param)


def _text(value: Any) -> str:
    if isinstance(value, bytes):  # as typer decodes argv bytes (its _parse_cli_str)
        from typer._adapters import _parse_cli_str

        return _parse_cli_str(value)
    return str(value)


def handles(param) -> bool:
    desc = param.type_descriptor
    info, annotation = desc.parameter_info, desc.annotation
    if desc.file_annotation is not None or param.multiple or param.nargs != 1:
        return False
    if info.parser is not None:
        return True
    if not isinstance(annotation, type):
        return False
    if issubclass(annotation, Enum) or annotation in (str, bool):
        return True
    return issubclass(annotation, Path) and info.path_type in (None, annotation) and routes_to_path(annotation, info)


def install() -> None:
    """From now on, a parameter that `handles` accepts gets a LightCoercion where typer would build
    its pydantic adapter. Typer builds that lazily, per parameter, on the first value to coerce
    (`_TyperParameter.get_runtime_param`); wrapping that one method also covers the parameters
    click adds late (each command's --help). Idempotent."""
    if _TyperParameter is None or getattr(_TyperParameter.get_runtime_param, "light", False):
        return
    typer_builds = _TyperParameter.get_runtime_param

    def get_runtime_param(param):
        if param._runtime_param is None and handles(param):
            desc = param.type_descriptor
            param._runtime_param = LightCoercion(parameter_info=desc.parameter_info, annotation=desc.annotation)
        return typer_builds(param)

    get_runtime_param.light = True
    _TyperParameter.get_runtime_param = get_runtime_param
