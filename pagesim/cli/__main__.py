"""`python -m pagesim.cli`: the same as the `pagesim` command."""

from pagesim.cli import main

main()
