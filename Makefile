# Two commands do all set-up on a fresh machine with only python3: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Test files run in parallel, one file per worker (a file's TF cluster and servers stay in one process);
# `make test PYTEST_PARALLEL=` runs them in one process.
PYTEST_PARALLEL ?= -n auto --maxprocesses 4 --dist loadfile

.PHONY: demo test test-slow bench install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel

$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/placer demo

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow $(PYTEST_PARALLEL)

bench: $(STAMP)
	$(BIN)/placer bench --size full --gpus 2,4 --kind K80

clean:
	rm -rf $(VENV) build *.egg-info
