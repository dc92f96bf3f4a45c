"""`--config FILE`: a command's options from a TOML, YAML or JSON file (docs/cli.md).

Keys are named as the command's flags, as Python names (`num_requests`) or as written on the
command line (`num-requests`, `--num-requests`, any alias such as `tensor-parallel-size`). The
file's values become the options' defaults (the click context's default_map), so a flag given on the command
line overrides the file, and each value is checked by the flag's own parser before any work
starts: a bad one is one line naming the file and the key. An option set by the file counts as
given (`checks.given`). A file whose top level holds a `config` mapping is a summary.json, and its
`config` is read: `pagesim replay TRACE --config OUT/summary.json` re-creates that run (run and
bench store theirs the same way; compare.json holds it under `meta`).

A command may also take keys that have no flag (`replay`: the ReplayConfig fields without one,
such as `allocator`): `extra_keys` names them and checks each; they are stored in
`ctx.meta[EXTRA]` for the command to pass on.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, Callable

import typer

from pagesim.cli.checks import fail

EXTRA = "pagesim.config_extra"  # ctx.meta key: {name: value} of the file's keys that have no flag
SOURCE = "pagesim.config_source"  # ctx.meta key: (the file, {option or extra key's name: the file's key})
SKIPPED = ("config", "help")  # options a config file cannot set
FLAG_PREFIX = re.compile(r"^--[\w-]+:? ")  # a config field's problem said as a flag's ("--allocator: ...")

# A file's null, where the option's default is not None: what it means (summary.json's config
# stores the run's resolved values, and `rate: null` there is the trace's own arrival times).
NULL_MEANS = {"rate": 0}
NULL_MEANS_DEFAULT = {"num_requests"}  # null: sized by duration instead (the flag's default then)

# extra_keys(ctx) -> {key: check(value) -> value (or ValueError / TypeError naming the problem)}
ExtraKeys = Callable[[typer.Context], dict]


def read_config_file(path: Path) -> dict:
    """The file's mapping (a summary.json's `config`), or one line naming the file."""
    _check_readable(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        fail(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})")
    except OSError as e:
        fail(f"{path}: cannot read the config file ({(e.strerror or str(e)).lower()})")
    doc = _parse(path, text)
    if isinstance(doc, dict) and isinstance(doc.get("meta"), dict) and isinstance(doc["meta"].get("config"), dict):
        doc = doc["meta"]  # a compare.json: its meta holds the config
    if isinstance(doc, dict) and isinstance(doc.get("config"), dict):  # a summary.json
        doc = doc["config"]
    if doc is None:
        fail(f"{path}: the config file is empty")
    if not isinstance(doc, dict):
        fail(f"{path}: a config file holds a mapping of option names to values, got {type(doc).__name__}")
    return doc


def _check_readable(path: Path) -> None:
    """A regular file, or a pipe the shell made (`--config <(jq .config summary.json)`); any other
    FIFO is refused, as every input is, since opening it waits for a writer that may never come."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        fail(f"{path}: no such config file")
    except OSError as e:
        fail(f"{path}: cannot read the config file ({(e.strerror or str(e)).lower()})")
    if stat.S_ISFIFO(mode) and str(path).startswith(("/dev/fd/", "/proc/self/fd/")):
        return
    from pagesim.cli.checks import input_file

    input_file(path, "config file")


def _parse(path: Path, text: str) -> Any:
    suffix = path.suffix.lower()
    if suffix == ".toml":
        import tomllib

        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            fail(f"{path}: not TOML ({e})")
        except RecursionError:
            fail(f"{path}: nested too deep to be a config file")
    if suffix == ".json":
        from pagesim.inputs import parse_json

        return parse_json(text, str(path))
    import yaml  # YAML, and anything else: JSON is YAML too (a pipe has no suffix)

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        fail(f"{path}: not YAML or JSON ({' '.join(str(e).split())})")
    except RecursionError:
        fail(f"{path}: nested too deep to be a config file")


def _flag_names(command: typer.core.TyperCommand, aliases: dict[str, str]) -> dict:
    """Every spelling of every option a file may set -> the option; aliases: other key -> option name."""
    names = {}
    for param in command.params:
        if getattr(param, "param_type_name", "") != "option" or param.name in SKIPPED:
            continue
        for spelling in [param.name, *param.opts]:  # not secondary_opts: `no-prefix-caching: true` reads wrong
            bare = spelling.lstrip("-")
            names[bare] = names[bare.replace("-", "_")] = names["--" + bare.replace("_", "-")] = param
        names.update({alias: param for alias, name in aliases.items() if name == param.name})
    return names


def _flag(param) -> str:
    return param.opts[0]


def _key(param) -> str:
    """The option's key as the list of valid keys shows it: its first flag as a Python name."""
    return param.opts[0].lstrip("-").replace("-", "_")


def _coerce(param, ctx: typer.Context, value: Any) -> Any:
    """The option's value from `value`, as its flag's parsing makes it (typer's coercion in the
    typers that have one, click's type otherwise)."""
    if hasattr(param, "get_runtime_param"):
        if param.type_descriptor.annotation is bool and isinstance(value, bool):
            return value
        return param.get_runtime_param().coerce(value, param=param, ctx=ctx)
    return param.type_cast_value(ctx, value)


def apply_config(ctx: typer.Context, path: Path, extra_keys: ExtraKeys | None = None,
                 aliases: dict[str, str] | None = None) -> None:
    """Check the file's keys and values and make them the command's defaults."""
    doc = read_config_file(path)
    names = _flag_names(ctx.command, aliases or {})
    extras_known = extra_keys(ctx) if extra_keys else {}
    defaults: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    set_by: dict[str, str] = {}
    for key, value in doc.items():
        param = names.get(str(key))
        target = param.name if param is not None else str(key)
        if target in set_by:
            fail(f"{path}: {set_by[target]} and {key} set the same option: keep one")
        set_by[target] = str(key)
        if param is None:
            if key not in extras_known:
                valid = sorted({_key(p) for p in names.values()} | set(extras_known))
                fail(f"{path}: unknown key {key!r} for `pagesim {ctx.info_name}` (valid: {', '.join(valid)})")
            try:
                extra[key] = extras_known[key](value)
            except (TypeError, ValueError) as e:  # (said as a flag's problem: the key names it here)
                fail(f"{path}: {key}: {FLAG_PREFIX.sub('', str(e))}")
            continue
        if value is None:
            if param.name in NULL_MEANS:
                value = NULL_MEANS[param.name]
            elif param.name in NULL_MEANS_DEFAULT or param.default is None:
                continue  # the option's own default, None
            else:
                fail(f"{path}: {key}: null is not a value of {_flag(param)} (leave the key out for its default)")
        repeated = getattr(param, "multiple", False)  # a repeatable flag (compare's --system) takes a list
        if isinstance(value, dict) or (isinstance(value, list) and not repeated):
            fail(f"{path}: {key}: must be one value for {_flag(param)}, got a {type(value).__name__}")
        if repeated:
            value = value if isinstance(value, list) else [value]
            if any(isinstance(item, (dict, list)) or item is None for item in value):
                fail(f"{path}: {key}: each value of {_flag(param)} is one value, got {value!r}")
        try:
            _coerce(param, ctx, value)  # the flag's own parser, as if typed after it (each time, if repeated)
        except typer.BadParameter as e:
            fail(f"{path}: {key}: {' '.join(e.message.removeprefix('Value error, ').split())}")
        defaults[param.name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    ctx.meta[EXTRA] = extra
    ctx.meta[SOURCE] = (path, set_by)


def said_of_the_file(message: str) -> str:
    """`message` as the --config file's problem (`FILE: KEY: ...`, as a bad value in the file is
    said) where it begins with a flag the running command's file set and its command line did not
    (`--max-model-len 4096 is greater than ...`, found once the run starts); else unchanged."""
    import importlib

    # the running command's context, from wherever this typer takes click (as checks.ClickException)
    click_globals = importlib.import_module(typer.BadParameter.__module__.rsplit(".", 1)[0] + ".globals")
    ctx = click_globals.get_current_context(silent=True)
    flag = FLAG_PREFIX.match(message)
    if ctx is None or flag is None or SOURCE not in ctx.meta:
        return message
    path, set_by = ctx.meta[SOURCE]
    opt = flag.group().strip().rstrip(":")
    param = next((p for p in ctx.command.params if opt in getattr(p, "opts", ())), None)
    name = param.name if param is not None else opt.lstrip("-").replace("-", "_")  # (or a key without a flag)
    source = ctx.get_parameter_source(name) if param is not None else None
    if name not in set_by or (param is not None and getattr(source, "name", None) != "DEFAULT_MAP"):
        return message
    return f"{path}: {set_by[name]}: {message[flag.end():]}"


def config_option(extra_keys: ExtraKeys | None = None, aliases: dict[str, str] | None = None,
                  help_text: str | None = None):
    """The `--config FILE` option of a command (eager: read before any other option's default).
    aliases: more key names for options (replay: the ReplayConfig field names summary.json uses)."""

    def callback(ctx: typer.Context, value: Path | None) -> Path | None:
        if value is not None and not ctx.resilient_parsing:
            apply_config(ctx, value, extra_keys, aliases)
        return value

    return typer.Option(None, "--config", is_eager=True, callback=callback, metavar="FILE",
                        help=help_text or "TOML, YAML or JSON file of options named as the flags (or a summary.json, "
                        "whose config it reads); flags given here override it")


def config_extra(ctx: typer.Context) -> dict:
    """The file's keys that have no flag (empty without --config)."""
    return dict(ctx.meta.get(EXTRA, {}))


def resolved_options(ctx: typer.Context, skip: tuple[str, ...] = ("out", "as_json", "config")) -> dict:
    """Every option's value as the command ran with it, keyed as its flag (a Python name): the
    content of a --config file that runs the command again with the same settings (stored as the
    results' `config`). Enums are their text, paths strings, repeated options lists."""
    options = {}
    for param in ctx.command.params:
        if getattr(param, "param_type_name", "") != "option" or param.name in skip:
            continue
        value = ctx.params[param.name]
        if isinstance(value, (list, tuple)):
            options[param.name] = [_plain(v) for v in value]
        else:
            options[param.name] = _plain(value)
    return options


def run_options(ctx: typer.Context, duration: float | None) -> dict:
    """resolved_options of a command that serves requests (run, bench): sized by the count or by
    `duration` (the one check_arrival_flags kept), whose count is then null, never by both."""
    options = dict(resolved_options(ctx), duration=duration)
    if duration is not None:
        options["num_requests"] = None
    return options


def _plain(value: Any) -> Any:
    value = getattr(value, "value", value)  # an enum's text
    return str(value) if isinstance(value, Path) else value


def print_reproduce(line: str) -> None:
    """The "reproduce with" line every command that writes results prints (on stdout, whole)."""
    from rich.console import Console

    Console().print(f"reproduce with: {line}", markup=False, soft_wrap=True)


def given_options_line(ctx: typer.Context, *arguments, skip: tuple[str, ...] = ("out", "as_json", "config")) -> str:
    """`pagesim CMD ARGUMENTS --flag value ...` with every option the user set (on the command
    line or in a --config file) and nothing else, then `--out NEW_FOLDER`: a command's
    "reproduce with" line where its results hold no config file to point at."""
    import shlex

    from pagesim.cli.checks import given

    words = ["pagesim", ctx.info_name, *map(str, arguments)]
    for param in ctx.command.params:
        if getattr(param, "param_type_name", "") != "option" or param.name in skip or not given(ctx, param.name):
            continue
        value = getattr(ctx.params[param.name], "value", ctx.params[param.name])  # (an enum's text)
        if isinstance(value, bool):
            words += [param.opts[0]] if value else param.secondary_opts[:1]
        elif isinstance(value, (list, tuple)):
            for item in value:
                words += [param.opts[0], str(getattr(item, "value", item))]
        elif value is not None:
            words += [param.opts[0], str(value)]
    return shlex.join(words + ["--out"]) + " NEW_FOLDER"
