# The README's commands. Each target creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit docs bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash examples/demo.sh

test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q

docs: $(STAMP)
	$(BIN)/python -m cli.docs write

bench: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) .fencelog .mypy_cache .ruff_cache .pytest_cache
