"""Every `pagesim` command in README.md and docs/*.md runs as written: each parses as a valid
invocation (the subcommand exists, every option and value is accepted, input files exist), and
the fast ones (replay, trace inspect) run end to end with a small --num-requests. Python blocks
compile. None of them writes under reports/ (the committed results) unless its line says that it
regenerates a report."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

try:  # recent typer vendors its own click
    from typer._click.exceptions import UsageError
except ImportError:
    from click.exceptions import UsageError

from pagesim.cli import app
from pagesim.sim.specs import get_gpu, get_model

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(?:\.venv/bin/)?pagesim(?:\s|$)")
# a figure or report script: each writes under reports/ unless told --out / --out-dir elsewhere
SCRIPT = re.compile(r"^(?:nice -n \d+ )?(?:[A-Z_]+=\S+\s+)*(?:\.venv/bin/)?python3? -m pagesim\.experiments\.\w+")
WRITES = ("out", "out_dir", "plot", "figure", "paper_md")  # options naming what a command writes
SAYS_REGENERATES = re.compile(r"#.*\bregenerat", re.I)
INPUT_OPTIONS = ("trace", "profile", "prices", "beam_ancestry")  # parameters naming files that must exist
FAST = {("replay",), ("trace", "inspect")}
SMALL = "20"


def blocks(path: Path):
    """(language, first line number, lines) of each fenced block."""
    lang, start, lines = None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if m and lang is None:
            lang, start, lines = m.group(1), number + 1, []
        elif line.strip() == "```" and lang is not None:
            yield lang, start, lines
            lang = None
        elif lang is not None:
            lines.append(line)


def shell_commands():
    for path in DOCS:
        for lang, start, lines in blocks(path):
            if lang not in ("", "bash", "sh", "shell", "console"):
                continue
            text = "\n".join(lines).replace("\\\n", " ")  # continuation lines
            for offset, line in enumerate(text.splitlines()):
                if COMMAND.match(line.strip()):
                    yield pytest.param(line.strip(), id=f"{path.name}:{start + offset}:{line.split()[1] if len(line.split()) > 1 else ''}")


def written_commands():
    """(line, id) of every documented command that writes files: pagesim commands and the
    figure/report scripts, comments kept (they say what the line does)."""
    for path in DOCS:
        for lang, start, lines in blocks(path):
            if lang not in ("", "bash", "sh", "shell", "console"):
                continue
            text = "\n".join(lines).replace("\\\n", " ")
            for offset, line in enumerate(text.splitlines()):
                if COMMAND.match(line.strip()) or SCRIPT.match(line.strip()):
                    yield pytest.param(line.strip(), id=f"{path.name}:{start + offset}")


def python_blocks():
    for path in DOCS:
        for lang, start, lines in blocks(path):
            if lang == "python":
                yield pytest.param("\n".join(lines), id=f"{path.name}:{start}")


def argv(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    if words[-1] == "&":  # started in the background, as a server is
        words.pop()
    while "=" in words[0] and not words[0].startswith("-"):  # VAR=value prefixes
        words.pop(0)
    assert words[0].endswith("pagesim")
    return words[1:]


def resolve(args: list[str]) -> tuple[tuple[str, ...], typer.Context]:
    """Parse as the CLI would, without running: the subcommand path and its parsed context.
    Raises click's UsageError / BadParameter on anything the CLI would reject."""
    command = typer.main.get_command(app)
    ctx = command.make_context("pagesim", list(args))
    path = []
    while hasattr(command, "resolve_command"):  # a group: descend to the subcommand
        name, command, rest = command.resolve_command(ctx, ctx._protected_args + ctx.args)
        path.append(name)
        ctx = command.make_context(name, rest, parent=ctx)
    return tuple(path), ctx


def shrink(path: tuple[str, ...], args: list[str], tmp: Path) -> list[str]:
    """The fast version of a documented command: few requests, outputs under tmp."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a in ("--num-requests", "--duration", "--warmup"):  # a 20-request run has no 60 s of warm-up
            i += 2
            continue
        if a in ("--out", "--plot"):
            out += [a, str(tmp / Path(args[i + 1]).name)]
            i += 2
            continue
        out.append(a)
        i += 1
    return out + (["--num-requests", SMALL] if path == ("replay",) else [])


@pytest.mark.parametrize("line", list(shell_commands()))
def test_documented_command(line, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = argv(line)
    path, ctx = resolve(args)
    for name in INPUT_OPTIONS:
        value = ctx.params.get(name)
        if value is not None:
            assert (ROOT / value).exists(), f"{line}: {name} {value} does not exist"
    if path in (("replay",), ("plan",)):  # catalog names (run, compare, profile take executor models)
        get_model(ctx.params["model"])
        for gpu in (ctx.params.get("gpus") or ctx.params.get("gpu") or "").split(","):
            get_gpu(gpu)
    if path in FAST:
        result = CliRunner().invoke(app, shrink(path, args, tmp_path))
        assert result.exit_code == 0, f"{line}\n{result.output}"


def test_the_extraction_finds_the_commands():
    lines = [p.values[0] for p in shell_commands()]
    assert len(lines) >= 20
    assert any("pagesim plan" in line and "--out plans/llama" in line for line in lines)  # continuation joined
    assert any(line.startswith("pagesim trace build alpaca") for line in lines)  # untagged blocks in docs/


def test_a_bad_command_is_caught():
    with pytest.raises(UsageError, match="unexpected extra argument"):
        resolve(argv(".venv/bin/pagesim figures --only fig12 fig13 --smoke"))  # the README's old line
    with pytest.raises(UsageError):
        resolve(argv("pagesim replay traces/sharegpt.json --policy orca-maximum"))
    with pytest.raises(UsageError, match="unexpected extra argument"):
        resolve(argv("pagesim replay traces/sharegpt.json ..."))
    with pytest.raises(UsageError, match="No such command"):
        resolve(argv("pagesim replays traces/sharegpt.json"))


def under_reports(value) -> bool:
    return value is not None and (ROOT / str(value)).resolve().is_relative_to(ROOT / "reports")


def writes_under_reports(line: str) -> list[str]:
    """What of reports/ the documented line would write: its output options' values, and the
    defaults that point there (`pagesim figures` without --out-dir, a script without --out)."""
    words = shlex.split(line, comments=True)
    if SCRIPT.match(line):
        outs = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--out", "--out-dir")]
        return [o for o in outs if under_reports(o)] if outs else ["reports/ (the script's default)"]
    path, ctx = resolve(argv(line))
    found = [f"--{name.replace('_', '-')} {ctx.params[name]}" for name in WRITES if under_reports(ctx.params.get(name))]
    if path == ("figures",) and ctx.params.get("out_dir") is None:
        found.append("reports/figures and reports/paper.md (the default --out-dir)")
    return found


@pytest.mark.parametrize("line", list(written_commands()))
def test_no_documented_command_writes_under_reports_unless_it_says_so(line, monkeypatch):
    """Issue 27: the README's smoke run rewrote reports/paper.md. A line that writes under reports/
    must say, in its comment, that it regenerates a report."""
    monkeypatch.chdir(ROOT)
    written = writes_under_reports(line)
    assert not written or SAYS_REGENERATES.search(line), f"{line}\nwrites {', '.join(written)} without saying it regenerates a report"


def test_the_reports_check_catches_a_line_that_writes_there():
    assert writes_under_reports("pagesim figures --only fig12 --smoke --out-dir reports/figures")
    assert writes_under_reports(".venv/bin/pagesim figures --jobs 2")
    assert writes_under_reports("pagesim trace inspect traces/sharegpt.json --plot reports/figures/lengths.png")
    assert writes_under_reports(".venv/bin/python -m pagesim.experiments.model_zoo")
    assert not writes_under_reports("pagesim figures --only fig12,fig13 --smoke --out-dir /tmp/pagesim-smoke")
    assert not writes_under_reports("python -m pagesim.experiments.fig12_latency_vs_rate --smoke --out-dir /tmp/x")
    assert SAYS_REGENERATES.search("pagesim figures --jobs 2   # regenerates reports/paper.md")
    assert not SAYS_REGENERATES.search("pagesim figures --jobs 2   # then reports/paper.md")


def ignored_folders() -> set[str]:
    """The top-level folders .gitignore ignores (`/runs/`, `/plans/`, ...)."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return {line.strip("/") for line in lines if line.startswith("/") and line.endswith("/")}


def writes_into_the_checkout(line: str) -> list[str]:
    """What a documented pagesim line would write inside the checkout where `git status` shows it:
    not under an ignored folder, not under reports/ (the test above) and not under traces/ (the
    committed traces a `trace build` line rebuilds byte for byte)."""
    _, ctx = resolve(argv(line))
    allowed = ignored_folders() | {"reports", "traces"}
    found = []
    for name in WRITES:
        value = ctx.params.get(name)
        if value is None:
            continue
        target = (ROOT / str(value)).resolve()
        if target.is_relative_to(ROOT) and target.relative_to(ROOT).parts[0] not in allowed:
            found.append(f"--{name.replace('_', '-')} {value}")
    return found


@pytest.mark.parametrize("line", [p for p in written_commands() if COMMAND.match(p.values[0])])
def test_no_documented_command_leaves_files_in_the_checkout(line, monkeypatch):
    """A user copies these lines: their outputs go to an ignored folder (runs/, plans/) or outside
    the checkout, so `git status` stays clean (docs/traces.md's `--plot fig11.png` left fig11.png)."""
    monkeypatch.chdir(ROOT)
    written = writes_into_the_checkout(line)
    assert not written, f"{line}\nwrites {', '.join(written)} into the checkout, outside an ignored folder"


def test_the_checkout_check_catches_a_line_that_writes_there():
    assert writes_into_the_checkout("pagesim trace inspect traces/sharegpt.json --plot fig11.png")
    assert writes_into_the_checkout("pagesim calibrate engine RUN1 --gpu h100-80gb --out my-cluster.json")
    assert not writes_into_the_checkout("pagesim trace inspect traces/sharegpt.json --plot /tmp/fig11.png")
    assert not writes_into_the_checkout("pagesim replay traces/sharegpt.json --out runs/oracle")
    assert not writes_into_the_checkout("pagesim trace build sharegpt --out traces/sharegpt.json")


@pytest.mark.parametrize("source", list(python_blocks()))
def test_documented_python_compiles(source):
    compile(source, "<doc>", "exec")
