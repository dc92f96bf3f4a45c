"""The `pagesim` command. Each subcommand lives in its own module and imports heavy libraries
(torch, pandas, ...) inside the command, so `pagesim --help` stays fast. Input checking and
error handling (one line, exit status 2 for bad input) live in pagesim.cli.checks."""

from typing import Optional

import typer

from pagesim.cli.checks import PagesimGroup, debug

app = typer.Typer(cls=PagesimGroup, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="Paged KV-cache serving, simulated and real.")


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


# Subcommand modules register themselves on `app` when imported.
from pagesim.cli import plan as _plan  # noqa: E402,F401
from pagesim.cli import replay as _replay  # noqa: E402,F401
from pagesim.cli import run as _run  # noqa: E402,F401
from pagesim.cli import trace as _trace  # noqa: E402,F401
from pagesim.cli import profile as _profile  # noqa: E402,F401
from pagesim.cli import compare as _compare  # noqa: E402,F401
from pagesim.cli import figures as _figures  # noqa: E402,F401
from pagesim.cli import serve as _serve  # noqa: E402,F401
from pagesim.cli import bench as _bench  # noqa: E402,F401
from pagesim.cli import calibrate as _calibrate  # noqa: E402,F401


def main() -> None:
    app(prog_name="pagesim")
