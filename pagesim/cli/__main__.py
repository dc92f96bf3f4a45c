"""`python -m pagesim.cli`: the `pagesim` command."""

from pagesim.cli import main

main()
