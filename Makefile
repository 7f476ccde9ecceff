# flowledger: `make demo` runs the main job, `make test` passes the tests.
# Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SOURCES := $(shell find domain infrastructure projections adapters -name '*.py' -o -name '*.json' -o -name '*.html' 2>/dev/null)

.PHONY: demo test bench lint typecheck check install clean

$(STAMP): pyproject.toml $(SOURCES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	flock $(VENV)/.install.lock $(BIN)/python -m pip install --quiet -e '.[dev]' --config-settings editable_mode=strict
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/flowledger demo

test: $(STAMP)
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy -p flowledger.domain -p flowledger.infrastructure -p flowledger.projections -p flowledger.adapters

check: lint typecheck test

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
