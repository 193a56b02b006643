# Two commands do everything on a fresh machine with Python >= 3.11:
#   make demo   -> virtualenv (if missing), install, run examples/quickstart.py
#   make test   -> virtualenv (if missing), install, run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# oneDNN's CPU allocator keeps memory statistics; TensorFlow turns oneDNN on by
# default only on some CPUs (not on AMD EPYC), so ask for it explicitly.
export TF_ENABLE_ONEDNN_OPTS ?= 1
export TF_CPP_MIN_LOG_LEVEL ?= 2
# Tests fork their subprocesses from a server that has imported TensorFlow
# once (tests/_forkserver.py: ~4.5 s of CPU less per subprocess); 0 starts a
# fresh interpreter for each.
export TFMEMOPT_TEST_FORK ?= 1
# Whole files to two workers on 2 cores, in the order tests/conftest.py
# sorts them (the long ones first, from tests/durations.json; without
# --no-loadscope-reorder the scheduler puts the files with the most tests
# first). On a 2-core AMD EPYC on 2026-12-07, fresh clones: 1365.0 s of
# pytest with 3 workers (50e9b78; 40.8 user CPU-minutes), 1187.0 s with 2
# (03b0a9c, a few more trainings; 34.4): a third worker on two
# cores cost more CPU than it kept busy. (On 2026-12-06's machine three had
# been faster: 1028.4 s against 1173.1 s.)
# --durations=60: every run ends with its 60 slowest tests (setup, call and
# teardown apart), where the suite's time goes (#51).
PYTEST_ARGS ?= -n 2 --dist loadfile --no-loadscope-reorder --durations=60
# `make test` (CI) leaves out the tests marked `extended` (pyproject.toml:
# a check the default suite already makes, repeated at a larger size or on
# more models); `make test-full` runs them too.
TEST_SELECT ?= -m "not extended"

.PHONY: demo test test-full lint format bench clean venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -e ".[test,plot]"
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(BIN)/python examples/quickstart.py

test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS) $(TEST_SELECT)

test-full: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check tfmemopt tests examples benchmarks
	$(BIN)/ruff format --check tfmemopt tests examples benchmarks
	$(BIN)/lint-imports

format: venv
	$(BIN)/ruff format tfmemopt tests examples benchmarks
	$(BIN)/ruff check --fix tfmemopt tests examples benchmarks

bench: venv
	for f in benchmarks/[a-z]*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# On a machine with a GPU (or on CPU, as a smoke test): measures what only
# an accelerator can prove; see docs/accelerator.md. No install step, so it
# also runs where the Python at hand already has TensorFlow.
.PHONY: accelerator-check
accelerator-check:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) benchmarks/accelerator.py $(ACCELERATOR_ARGS)
