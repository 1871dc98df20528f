# `make run`: the quickstart; `make test`: lint + tests. Each creates .venv and installs if needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/accel train

lint: $(STAMP)
	$(BIN)/ruff check .

test: lint
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/engine_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
