PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench bench-ops conformance lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

demo: $(VENV)/.installed-test
	$(BIN)/python -m ember.demo

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest

test-all: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m ''

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/ember bench --out bench/results --readme bench/README.md

bench-ops: $(VENV)/.installed-bench
	$(BIN)/python bench/ops.py --out bench/results

conformance: $(VENV)/.installed-test
	$(BIN)/python -m ember.conformance --out bench/results/conformance.json

lint: $(VENV)/.installed-test
	$(BIN)/pip install -q ruff
	$(BIN)/ruff check ember tests bench

clean:
	rm -rf $(VENV) build *.egg-info
