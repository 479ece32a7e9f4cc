# Two commands for a fresh machine:  `make demo`  and  `make test`.
# Everything a run needs is installed here, into .venv, from the project's own files.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
# torch comes from the CPU wheel on this machine's disk; install it before the train
# extra so nothing asks the index for a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv demo test test-fast lint chromium clean

$(BIN)/trainguard: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e '.[dev,train]'
	touch $@

venv: $(BIN)/trainguard

# Debian's chromium for the browser tests (Playwright cannot download its own here).
chromium:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

demo: venv
	$(BIN)/trainguard demo --port $(PORT)

# The checks the code's habits rely on run first: lint, format, types (.ci/typecheck lays
# out the installed trainguard namespace for mypy), then every test, slow ones included.
test: venv chromium lint
	$(BIN)/python -m pytest

test-fast: venv
	$(BIN)/python -m pytest -m "not slow"

lint: venv
	$(BIN)/ruff check agent backend migrations tests examples
	$(BIN)/ruff format --check agent backend migrations tests examples
	$(BIN)/python .ci/typecheck

clean:
	rm -rf $(VENV) .pytest_cache
