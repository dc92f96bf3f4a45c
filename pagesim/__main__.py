"""`python -m pagesim ...` is the `pagesim` command."""

from pagesim.cli import main

if __name__ == "__main__":
    main()
