"""`python -m pagesim.cli ...` is the `pagesim` command."""

from pagesim.cli import app

app(prog_name="pagesim")
