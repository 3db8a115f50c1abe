# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

## run: compare the scheduling policies on the embedded openb trace (inflation protocol, seed 42)
run: $(STAMP)
	$(BIN)/gpupool compare --out results --json results/compare.json

## test: lint and the whole test suite
test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_decisions.py

clean:
	rm -rf $(VENV) results
