"""Start-up: pagesim.cli.coercion against typer's own (pydantic) coercion, parameter by parameter;
a short replay loads neither pydantic nor rich nor numpy.random (its Poisson arrivals are drawn
without it), nor any other command's module; a replay's help
loads neither numpy nor simpy nor a cost model; the command tree
seen through `app` is whole."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import typer.main

from pagesim.cli import COMMAND_MODULES, _command_module, app
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


def test_short_replay_loads_only_what_it_uses():
    code = ("import sys; from pagesim.cli import main\n"
            "sys.argv = ['pagesim', '--debug', 'replay', 'traces/sharegpt.json', '--num-requests', '10', '--json']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m in ('pydantic', 'rich', 'typer._adapters', 'numpy.random')\n"
            "             or m.startswith('pagesim.cli.') and m.split('.')[2] in " + repr(COMMAND_MODULES) + "), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["num_finished"] == 10
    assert done.stderr.strip().splitlines()[-1] == "['pagesim.cli.replay']"


def test_replay_help_loads_no_numpy_simpy_or_cost_model():
    # the help names the defaults (pagesim.sim.cost.names) without loading what a run needs
    code = ("import sys; from pagesim.cli import main\n"
            "sys.argv = ['pagesim', 'replay', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m in ('numpy', 'simpy', 'pandas', 'pagesim.sim.cost.calibrated',"
            " 'pagesim.sim.cost.registry', 'pagesim.sim.engine')), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "--num-requests" in done.stdout
    assert done.stderr.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("argv, modules", [
    (["replay", "t.json"], ("replay",)), (["--debug", "plan", "--help"], ("plan",)), (["trace", "build"], ("trace",)),
    ([], None), (["--help"], None), (["--version"], None), (["replya"], None)])
def test_the_command_named_is_the_module_loaded(argv, modules):
    # None: every module (the root's help and its "no such command" list them all)
    assert _command_module(argv) == modules


def test_app_holds_every_command():
    root = typer.main.get_command(app)
    assert set(root.commands) == set(COMMAND_MODULES)


def test_after_main_the_app_is_whole_again(monkeypatch):
    from pagesim.cli import main

    monkeypatch.setattr(sys, "argv", ["pagesim", "replay", "--help"])
    with pytest.raises(SystemExit):
        main()
    assert app._modules is None
    assert set(typer.main.get_command(app).commands) == set(COMMAND_MODULES)
