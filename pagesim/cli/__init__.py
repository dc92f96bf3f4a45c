"""The `pagesim` command. Each subcommand lives in its own module and imports heavy libraries
(torch, pandas, ...) inside the command, so `pagesim --help` stays fast."""

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Paged KV-cache serving, simulated and real.")

# Subcommand modules register themselves on `app` when imported.
from pagesim.cli import plan as _plan  # noqa: E402,F401
from pagesim.cli import replay as _replay  # noqa: E402,F401
from pagesim.cli import run as _run  # noqa: E402,F401
from pagesim.cli import trace as _trace  # noqa: E402,F401
from pagesim.cli import profile as _profile  # noqa: E402,F401
from pagesim.cli import compare as _compare  # noqa: E402,F401
from pagesim.cli import figures as _figures  # noqa: E402,F401
from pagesim.cli import calibrate as _calibrate  # noqa: E402,F401


def main() -> None:
    app()
