"""`python -m pagesim.cli ...` is the `pagesim` command."""

from pagesim.cli import main

main()
