# Two commands for a fresh machine:  `make demo`  and  `make test`.
# Everything a run needs is installed here, into .venv, from the project's own files.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
# torch comes from the CPU wheel on this machine's disk; install it before the train
# extra so nothing asks the index for a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

# A second environment with the NVRx line current GPU machines install (0.6/0.7 need glibc
# 2.39, which pip here does not have): the 0.7.0 wheel's files, from PyPI, in a venv of
# this Python (.ci/nvrx_env.py says how). `make test` runs the restart tests in it too.
NVRX_NEW ?= 0.7.0
VENV_NEW := .venv-nvrx07
# The tests that start real launchers and Wrappers: NVRx's restarts, 0.7's differences, the
# matrix's ft_launcher cells that CI runs, the README's script, capabilities, the demo, and
# a user's SIGTERM to ft_launcher, and the timeouts ranks report under them.
NVRX_TESTS ?= tests/restarts/test_nvrx_restarts.py tests/restarts/test_nvrx_versions.py \
	tests/restarts/test_launcher_matrix.py \
	tests/restarts/test_capabilities.py tests/restarts/test_launcher_flags.py tests/test_demo.py \
	tests/restarts/test_timeouts_reported.py \
	"tests/restarts/test_job_states.py::test_a_job_its_user_stops_ends_stopped_with_no_incident[ft_launcher-2n-sigterm]" \
	"tests/restarts/test_exclusion_spare.py::test_an_excluded_node_leaves_the_job_and_the_spare_takes_its_place[ft_launcher]"

.PHONY: venv venv-nvrx07 demo test test-fast test-nvrx07 lint chromium clean

$(BIN)/trainguard: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e '.[dev,train]'
	touch $@

venv: $(BIN)/trainguard

$(VENV_NEW)/bin/trainguard: pyproject.toml .ci/nvrx_env.py
	$(PY) -m venv $(VENV_NEW)
	$(VENV_NEW)/bin/pip install -q --upgrade pip installer packaging
	$(VENV_NEW)/bin/python .ci/nvrx_env.py $(NVRX_NEW) --torch "$(TORCH_SPEC)"
	touch $@

venv-nvrx07: $(VENV_NEW)/bin/trainguard

# Debian's chromium for the browser tests (Playwright cannot download its own here).
chromium:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

demo: venv
	$(BIN)/trainguard demo --port $(PORT)

# The checks the code's habits rely on run first: lint, format, types (.ci/typecheck runs
# mypy, import-linter and pyright over .ci/namespace, the installed trainguard namespace as
# committed links), then every test, slow ones included.
test: venv chromium lint
	$(BIN)/python -m pytest
	$(MAKE) test-nvrx07

# The restart tests again, on NVRx $(NVRX_NEW) (the same tests; docs/restarts.md, "NVRx versions").
# (The demo's torchrun form uses no NVRx: the first run covers it.)
test-nvrx07: venv-nvrx07
	$(VENV_NEW)/bin/python -m pytest $(NVRX_TESTS) \
		--deselect "tests/test_demo.py::test_demo_runs_nodes_and_the_training_job_until_ctrl_c[torchrun]"

test-fast: venv
	$(BIN)/python -m pytest -m "not slow"

lint: venv
	$(BIN)/ruff check agent backend migrations tests examples
	$(BIN)/ruff format --check agent backend migrations tests examples
	$(BIN)/python .ci/typecheck

clean:
	rm -rf $(VENV) $(VENV_NEW) .pytest_cache
