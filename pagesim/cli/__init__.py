"""The `pagesim` command. Each subcommand lives in its own module (named as the command) and
imports heavy libraries (torch, pandas, ...) inside the command, so `pagesim --help` stays fast;
`pagesim CMD ...` imports only CMD's module (see `_CommandsOnDemand`). Input checking and error
handling (one line, exit status 2 for bad input) live in pagesim.cli.checks."""

import importlib
import sys
from typing import Optional

import typer

from pagesim.cli.checks import PagesimGroup, debug

# Each registers itself on `app` when imported, in this order (the order of `pagesim --help`).
COMMAND_MODULES = ("plan", "replay", "validate", "run", "trace", "profile", "compare", "figures", "serve", "route",
                   "bench", "calibrate", "model", "view")


class _CommandsOnDemand(typer.Typer):
    """A Typer whose subcommand modules are imported when its command tree is first read (typer
    reads `registered_commands` and `registered_groups` when it builds the click group): all of
    them, or only those `main` names for this invocation."""

    def __init__(self, **kwargs):
        self._modules: tuple[str, ...] | None = None  # None: every module
        self._loading = False
        super().__init__(**kwargs)

    def only(self, modules: tuple[str, ...] | None) -> None:
        self._modules = modules

    def _load(self) -> None:
        if self._loading:  # a module being imported registers itself
            return
        self._loading = True
        try:
            for name in self._modules or COMMAND_MODULES:
                importlib.import_module(f"pagesim.cli.{name}")
        finally:
            self._loading = False

    def _registering(self, register):
        """register (typer's decorator or add_typer) run without loading the other modules: a
        module that registers itself while it is being imported (`from pagesim.cli.replay import
        ...` before anything else) must not import the modules that import from it (run imports
        replay's names), which would find it half-defined."""
        was, self._loading = self._loading, True
        try:
            return register()
        finally:
            self._loading = was

    def command(self, *args, **kwargs):
        decorate = super().command(*args, **kwargs)
        return lambda f: self._registering(lambda: decorate(f))

    def add_typer(self, *args, **kwargs):
        return self._registering(lambda: super(_CommandsOnDemand, self).add_typer(*args, **kwargs))

    def _loaded(attr: str):  # noqa: N805 - builds the two properties below
        """A property over typer's list `attr` that loads the command modules before it is read."""
        stored = f"_{attr}"

        def read(self):
            self._load()
            return getattr(self, stored)

        return property(read, lambda self, value: setattr(self, stored, value))

    registered_commands = _loaded("registered_commands")
    registered_groups = _loaded("registered_groups")
    del _loaded


app = _CommandsOnDemand(cls=PagesimGroup, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                        rich_markup_mode=None, help="Paged KV-cache serving, simulated and real.")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    import pagesim

    try:
        return version("pagesim")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return pagesim.__version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"pagesim {_version()}")
        raise typer.Exit()


@app.callback()
def root(
    version: Optional[bool] = typer.Option(None, "--version", is_eager=True, callback=_print_version,
                                           help="print the version and exit"),
    debug_: bool = typer.Option(False, "--debug", help="show a traceback when something fails unexpectedly"),
) -> None:
    """Paged KV-cache serving, simulated and real."""
    if debug_:
        debug["on"] = True


def _command_module(argv: list[str]) -> tuple[str, ...] | None:
    """The one subcommand module `pagesim ARGV` needs: the first word after the root options
    (--debug, --version, --help) where it names a command; None (all) otherwise, so the root's
    help and its "no such command" message list every command."""
    for word in argv:
        if not word.startswith("-"):
            return (word,) if word in COMMAND_MODULES else None
    return None


def main() -> None:
    app.only(_command_module(sys.argv[1:]))
    try:
        app(prog_name="pagesim")
    finally:  # an in-process caller's next use of `app` sees every command again
        app.only(None)
