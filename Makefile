# perfsdk — set-up, quickstart, tests.
#
#   make run     create .venv, install perfsdk (CPU PyTorch by default), run the quickstart benchmark
#   make test    same set-up plus test dependencies, then the whole test suite
#   make test-lowest  the suite again on the lowest transformers release pyproject.toml declares
#
# GPU users choose their PyTorch build:
#   make run TORCH_SPEC="torch==2.13.0" TORCH_INDEX=https://download.pytorch.org/whl/cu128

PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
PYTEST_ARGS ?=
BIN         := $(VENV)/bin
# the lowest transformers release pyproject.toml declares: CI tests it beside the newest
LOWEST_VENV ?= .venv-lowest
TRANSFORMERS_LOWEST := $(shell sed -n 's/.*"transformers>=\([0-9][0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)
PIP         := $(BIN)/python -m pip --disable-pip-version-check -q

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1

.PHONY: setup setup-dev run test test-lowest typecheck schemas bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# PyTorch first, pinned, so that resolving perfsdk's `torch` requirement installs nothing more.
$(VENV)/.torch: | $(BIN)/python
	$(PIP) install $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	touch $@

$(VENV)/.perfsdk: pyproject.toml $(VENV)/.torch
	$(PIP) install -e .
	touch $@

$(VENV)/.perfsdk-dev: pyproject.toml $(VENV)/.perfsdk
	$(PIP) install -e ".[dev]"
	touch $@

setup: $(VENV)/.perfsdk

setup-dev: $(VENV)/.perfsdk-dev

run: setup
	$(BIN)/perfsdk run

test: setup-dev
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The same suite on the lowest transformers release that pyproject.toml declares.
$(LOWEST_VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/python -m pip --disable-pip-version-check -q install $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(LOWEST_VENV)/bin/python -m pip --disable-pip-version-check -q install -e ".[dev]" "transformers[serving]==$(TRANSFORMERS_LOWEST)"
	touch $@

test-lowest: $(LOWEST_VENV)/.ready
	@echo "transformers $(TRANSFORMERS_LOWEST) (the declared lower bound):"
	$(LOWEST_VENV)/bin/python -m pytest $(PYTEST_ARGS)

typecheck: setup-dev
	$(BIN)/python -m mypy src/perfsdk

schemas: setup
	$(BIN)/perfsdk schema --output-dir schemas

bench: setup-dev
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) $(LOWEST_VENV) perfsdk-results .pytest_cache
