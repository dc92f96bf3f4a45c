"""pagesim.cli.coercion against typer's own (pydantic) coercion, parameter by parameter, and the
start-up it buys: a short replay loads neither pydantic nor rich."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import typer.main

from pagesim.cli import app
from pagesim.cli.coercion import LightCoercion, handles

typer_coercion = pytest.importorskip("typer._coercion", reason="a typer without pydantic coercion")

ROOT = Path(__file__).resolve().parents[2]
# Strings a user may type: numbers good and bad, choices in any case, paths, flags, junk.
SAMPLES = ["1", "0", "-3", "2.5", "1e3", "nan", "inf", "abc", "", " 7 ", "true", "False", "YES", "off", "2",
           "paged", "PAGED", "orca-max", "recompute", "Swap", "traces/sharegpt.json", "/nonexistent/x.json",
           str(ROOT / "traces"), "a,b", "opt-13b"]


def _outcome(runtime, param, ctx, value):
    try:
        return "ok", runtime.coerce(value, param=param, ctx=ctx)
    except typer.BadParameter as e:
        return "error", e.format_message()


def _params():
    root = typer.main.get_command(app)
    commands = [root, *root.commands.values()]
    for sub in list(commands):
        commands += list(getattr(sub, "commands", {}).values())
    seen = set()
    for command in commands:
        ctx = typer.Context(command)
        for param in command.get_params(ctx):
            if handles(param) and id(param) not in seen:
                seen.add(id(param))
                yield command.name, param, ctx


def test_every_handled_parameter_coerces_as_typer_does():
    checked = 0
    for name, param, ctx in _params():
        desc = param.type_descriptor
        light = LightCoercion(parameter_info=desc.parameter_info, annotation=desc.annotation)
        reference = typer_coercion.build_runtime_param(desc)  # typer's pydantic adapter
        assert not isinstance(reference, LightCoercion)
        for value in SAMPLES:
            ours, theirs = _outcome(light, param, ctx, value), _outcome(reference, param, ctx, value)
            assert ours == theirs, (name, param.name, value)
            checked += 1
    assert checked > 1000  # every command's parameters, not a handful


def test_short_replay_loads_neither_pydantic_nor_rich():
    code = ("import sys; from pagesim.cli import main\n"
            "sys.argv = ['pagesim', 'replay', 'traces/sharegpt.json', '--num-requests', '10', '--json']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('pydantic', 'rich', 'typer._adapters') if m in sys.modules), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["num_finished"] == 10
    assert done.stderr.strip().splitlines()[-1] == "[]"
