"""The CLI's one input-checking layer and its error handling.

Every command declares its numbers and output paths with the parameter types below, so click
checks them while parsing, before any work starts; checks that need several flags at once
call `fail`. Whatever goes wrong reaches the user as one line on stderr and an exit status:

  2  a usage or input error: a flag, file or field that the message names
  1  a bug (an exception nobody expected); `pagesim --debug ...` shows its traceback
  130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, NoReturn

import typer
from typer.core import TyperGroup

from pagesim import inputs
from pagesim.inputs import MAX_REQUESTS, InputValueError, NumberRule
from pagesim.results import ResultsError, check_writes

# click's exception base, from wherever this typer takes click (recent typers carry their own copy)
ClickException = sys.modules[typer.BadParameter.__module__].ClickException

EXIT_USAGE = 2
EXIT_BUG = 1
EXIT_INTERRUPTED = 130


class InputError(Exception):
    """Bad input, said in one line that names the flag, file or field to fix."""


def fail(message: str) -> NoReturn:
    """Stop with one line; a problem with a value the --config file set names the file and its key."""
    from pagesim.cli.config_file import said_of_the_file

    raise InputError(said_of_the_file(message))


# -- declarative parameter types ---------------------------------------------------------------


class Number:
    """A flag parser over one of pagesim.inputs' number rules (the one rule for every number, from
    a flag or from a file): `typer.Option(..., parser=RATE)`. Names as in pagesim.inputs; a flag
    of its own kind gives the rule's bounds, `Number(lo=1, hi=65535, integer=True)`."""

    def __init__(self, rule: NumberRule | None = None, **bounds):
        self.rule = rule if rule is not None else NumberRule(**bounds)
        self.__name__ = "integer" if self.rule.integer else "float"  # typer names the metavar after it

    def describe(self) -> str:
        return self.rule.describe()

    def __call__(self, value):
        if value is None:
            return None
        text = str(value).strip()
        try:
            number = int(text) if self.rule.integer else float(text)
        except ValueError:
            if not self.rule.integer:
                raise typer.BadParameter(f"must be {self.describe()}, got {value!r}") from None
            try:  # 1e3 or 4.0 for an integer flag: said as the range, not as "not an integer"
                number = float(text)
            except ValueError:
                raise typer.BadParameter(f"must be {self.describe()}, got {value!r}") from None
        problem = self.rule.problem(number)
        if problem:
            raise typer.BadParameter(problem)
        return number


# one parser per named rule of pagesim.inputs
FINITE, NON_NEGATIVE, POSITIVE, FRACTION = (Number(r) for r in (inputs.ANY, inputs.NON_NEGATIVE, inputs.POSITIVE,
                                                                 inputs.FRACTION))
RATE, RATE_OR_TRACE, BURSTINESS, SCALE = (Number(r) for r in (inputs.RATE, inputs.RATE_OR_TRACE, inputs.BURSTINESS,
                                                              inputs.SCALE))
SECONDS, POSITIVE_SECONDS, SWAP_GIB = Number(inputs.SECONDS), Number(inputs.POSITIVE_SECONDS), Number(inputs.SWAP_GIB)
COUNT, POSITIVE_INT, ANY_INT = Number(inputs.COUNT), Number(inputs.POSITIVE_INT), Number(NumberRule(integer=True))
SEED, TP, NUM_REQUESTS, SAMPLES = (Number(r) for r in (inputs.SEED, inputs.TP, inputs.NUM_REQUESTS, inputs.SAMPLES))
BLOCKS, BLOCK_SIZE, TOKENS, SEQS = (Number(r) for r in (inputs.BLOCKS, inputs.BLOCK_SIZE, inputs.TOKENS, inputs.SEQS))
WORKERS, JOBS = Number(inputs.WORKERS), Number(inputs.JOBS)
REPLICAS = Number(NumberRule(lo=1, hi=1024, integer=True, why="replicas in a cluster"))


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def writable_problem(path: Path, folder: bool) -> str | None:
    """Why results could not be written at path (a folder or a file), or None. Checked before a
    run, so a long run never ends in an unwritable place."""
    if path.is_symlink() and not path.exists():
        return f"is a symbolic link to {os.readlink(path)}, which does not exist"
    if path.exists():
        if folder and not path.is_dir():
            return "exists and is not a folder"
        if not folder and path.is_dir():
            return "is a folder, not a file"
    # results are written beside the target and renamed into place: its parent must take new entries
    parent = _nearest_existing(path.absolute().parent)
    if not parent.is_dir():
        return f"{parent} is not a folder"
    # try it: os.access answers yes for root, also on /proc or a read-only mount
    try:
        tempfile.TemporaryDirectory(prefix=".pagesim-probe-", dir=parent).cleanup()
    except OSError as e:
        return f"cannot write in {parent} ({(e.strerror or str(e)).lower()})"
    return None


class OutputPath:
    """A parser for where a command writes results: a folder (`folder=True`) or a file, checked
    writable while the command line is parsed, before any work. `writes`: the file names a
    results folder gets, none of which may be a folder of the user's there."""

    def __init__(self, folder: bool, writes: tuple[str, ...] = ()):
        self.folder, self.writes = folder, writes
        self.__name__ = "folder" if folder else "file"

    def __call__(self, value):
        if value is None:
            return None
        path = Path(value)
        problem = writable_problem(path, self.folder) or (check_writes(path, self.writes) if self.writes else None)
        if problem:
            raise typer.BadParameter(f"{value}: {problem}")
        return path


OUT_DIR = OutputPath(folder=True)
OUT_FILE = OutputPath(folder=False)
RUN_OUT_DIR = OutputPath(folder=True, writes=("requests.csv", "steps.csv", "summary.json"))  # replay, run


def input_file(path: Path, what: str = "file") -> Path:
    """An input file that must be a readable regular file (one line otherwise; a FIFO is refused
    at once rather than read forever)."""
    try:
        return inputs.regular_file(path, what)
    except InputValueError as e:
        fail(str(e))


# -- checks that look at several flags, or at the trace --------------------------------------------


def warn(message: str) -> None:
    typer.echo(f"warning: {one_line(message)}", err=True)


def given(ctx, name: str) -> bool:
    """Was the option set by the user (command line, environment or --config file), not left at
    its default?"""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT", "DEFAULT_MAP")


def typed(ctx, name: str) -> bool:
    """Was the option set on the command line (or environment), over any --config file?"""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def check_arrival_flags(ctx, duration: float | None) -> float | None:
    """The --duration the run uses: a run is sized by a count or by seconds, and a flag on the
    command line overrides the other one set in a --config file."""
    if duration is not None and given(ctx, "num_requests"):
        if typed(ctx, "num_requests") and not typed(ctx, "duration"):
            return None  # --num-requests over the file's duration
        if typed(ctx, "duration") == typed(ctx, "num_requests"):
            fail("give --num-requests or --duration, not both (a run is sized by a count or by seconds of arrivals)")
    return duration


def check_run_size(rate: float | None, num_requests: int | None, duration: float | None) -> None:
    """Refuse runs that could not finish: --duration is finite by now, but rate x duration may
    still ask for more requests than memory holds (the trace is cycled to supply them)."""
    expected = rate * duration if duration is not None and rate is not None else (num_requests or 0)
    if expected > MAX_REQUESTS:
        what = f"--rate {rate:g} x --duration {duration:g}" if duration is not None else f"--num-requests {num_requests}"
        fail(f"{what} asks for about {expected:,.0f} requests, more than the {MAX_REQUESTS:,} one run may hold")


def check_workload(requests, warmup: float, duration: float | None) -> None:
    """The requests a run will submit: at least one, and at least one measured after the warm-up."""
    if not requests:
        fail(f"--duration {duration:g} s holds no arrival: nothing to run" if duration is not None
             else "the run holds no request")
    # the warm-up counts from the run's first arrival (a trace may be stamped in Unix time); a
    # Workload's arrival times are read as they are, without building its requests (twice)
    times = getattr(requests, "arrival_times", None)
    if times is None:
        times = [r.arrival_time for r in requests]
    last = max(times) - min(times)
    if warmup > 0 and last < warmup:
        fail(f"--warmup {warmup:g} s is longer than the arrivals (the last request arrives at {last:.2f} s): "
             "no request would be measured")


def load_trace_file(path: Path):
    """load_trace, with every problem as one line naming the file (and record and field)."""
    from pagesim.workload.trace import TraceError, find_trace, load_trace

    input_file(find_trace(path), "trace file")
    try:
        return load_trace(path)
    except (OSError, TraceError) as e:
        fail(str(e))


@contextmanager
def progress_bar(label: str, unit: str, total: int | None, console=None, quiet: bool = False,
                 bar: bool = True) -> Iterator[Callable]:
    """A progress bar with elapsed time and ETA on `console` (default: a rich Console on stderr);
    where that is not a terminal (a log), a line every 10 s instead (pagesim.progress). Off when
    quiet (--json); bar=False: the log lines only (work that prints its own lines on a terminal).
    Yields update(done, total=None), a CountOnly (it reads nothing but the count). Quiet, it loads
    no rich."""
    from pagesim.progress import CountOnly

    if quiet:
        yield CountOnly(lambda done, new_total=None: None)
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    console = console or Console(stderr=True)
    if not console.is_terminal:
        from pagesim.progress import LogProgress

        with LogProgress(label, unit, total, console.file) as log:
            yield CountOnly(log.update)
        return
    if not bar:
        yield CountOnly(lambda done, new_total=None: None)
        return

    columns = [TextColumn(f"[bold]{label}[/]"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        every = max(1, (total or 0) // 200)  # about 200 redraws a run, not one per request

        def update(done: int, new_total: int | None = None) -> None:
            if new_total is not None:
                bar.update(task, total=new_total)
            if done % every == 0 or done == bar.tasks[0].total:
                bar.update(task, completed=done)

        yield CountOnly(update)


# -- one place that turns every failure into one line and an exit status ------------------------

debug = {"on": False}  # set by `pagesim --debug` (the root callback), read when something fails


def one_line(text: str) -> str:
    return " ".join(str(text).split())


class PagesimGroup(TyperGroup):
    """The root command: runs a subcommand and maps whatever escapes it to one line and an exit
    status (see the module docstring), for the console script and for in-process callers
    (typer.testing.CliRunner) alike."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        from pagesim.cli.coercion import install

        debug["on"] = bool(os.environ.get("PAGESIM_DEBUG"))
        install()  # parameter values without pydantic's start-up cost (see pagesim.cli.coercion)
        code = 0
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0  # typer returns the status of an Exit here
            if code == EXIT_INTERRUPTED:  # typer's answer to Ctrl-C
                typer.echo("interrupted", err=True)
        except (InputError, InputValueError, ResultsError) as e:
            typer.echo(f"error: {one_line(e)}", err=True)
            code = EXIT_USAGE
        except ClickException as e:  # parse errors: unknown option, bad value, ...
            if type(e).__name__ == "NoArgsIsHelpError":  # `pagesim` alone: the help is the answer
                typer.echo(e.format_message(), err=True)
                return self._exit(e.exit_code, standalone_mode)
            where = f"{e.ctx.command_path}: " if getattr(e, "ctx", None) is not None else ""
            hint = f" (see '{e.ctx.command_path} --help')" if getattr(e, "ctx", None) is not None else ""
            typer.echo(f"error: {where}{one_line(e.format_message())}{hint}", err=True)
            code = e.exit_code
        except typer.Abort:
            typer.echo("interrupted", err=True)
            code = EXIT_INTERRUPTED
        except Exception as e:  # noqa: BLE001 - the last line of defence: a bug, said as one
            if debug["on"]:
                raise
            typer.echo(f"error: internal error, this is a bug in pagesim: {type(e).__name__}: {one_line(e)} "
                       "(run `pagesim --debug ...` for the traceback)", err=True)
            code = EXIT_BUG
        return self._exit(code, standalone_mode)

    @staticmethod
    def _exit(code: int, standalone_mode: bool) -> int:
        if standalone_mode:
            sys.exit(code)
        return code
