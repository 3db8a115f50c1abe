# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed

.PHONY: run test lint bench bench-tiresias clean e2e
# `make` alone installs everything (what scripts/gpu-check.sh runs when there is no .venv yet)
.DEFAULT_GOAL := $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# what running needs (make run): gpupool and its dependencies, no test tools
$(RUN_STAMP): pyproject.toml | $(BIN)/python
	@echo "make: installing gpupool and what it needs to run into $(VENV) (numpy, numba, matplotlib, kubernetes, ...)"
	$(BIN)/python -m pip install -q -e .
	touch $@

# what the tests need on top (make test, e2e, benchmarks)
$(STAMP): $(RUN_STAMP) pyproject.toml
	@echo "make: installing the test tools into $(VENV) (pytest, hypothesis, ruff, import-linter, kmock, highspy, ...)"
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

## run: compare the scheduling policies on the embedded openb trace (inflation protocol, seed 42)
run: $(RUN_STAMP)
	$(BIN)/gpupool compare --out results --json results/compare.json

## test: lint, the import contracts (.importlinter, docs/architecture.md) and the whole test suite
test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/pytest

## e2e: the live scheduler against a real etcd + kube-apiserver on loopback (tests/e2e, marker real_apiserver).
## Binaries: $$KUBE_APISERVER / $$ETCD, else the kube-control-plane cache (../shared/tools/kube-control-plane/build.sh).
KCP_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/kube-control-plane
E2E_APISERVER = $(or $(KUBE_APISERVER),$(wildcard $(KCP_CACHE)/bin/kube-apiserver))
E2E_ETCD = $(or $(ETCD),$(wildcard $(KCP_CACHE)/bin/etcd))
e2e: $(STAMP)
	@test -n "$(E2E_APISERVER)" -a -x "$(E2E_APISERVER)" || { echo "make e2e: no kube-apiserver (set KUBE_APISERVER or run ../shared/tools/kube-control-plane/build.sh)" >&2; exit 3; }
	@test -n "$(E2E_ETCD)" -a -x "$(E2E_ETCD)" || { echo "make e2e: no etcd (set ETCD or run ../shared/tools/kube-control-plane/build.sh)" >&2; exit 3; }
	@command -v prometheus >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } >/dev/null 2>&1; } \
	  || echo "note: no prometheus binary (Debian package prometheus); the real-Prometheus autoscaler e2e variant will skip" >&2
	KUBE_APISERVER="$(E2E_APISERVER)" ETCD="$(E2E_ETCD)" $(BIN)/pytest tests/e2e -m real_apiserver -p no:cacheprovider -p no:logging -W "ignore:Unverified HTTPS request" -rfEsP $(E2E_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_decisions.py

## bench-tiresias: gpupool beside the Tiresias simulator on the same jobs (benchmarks/tiresias/README.md).
## Needs git and Python 2.7; TIRESIAS_SRC=clone or git dir instead of GitHub; other windows:
## TIRESIAS_ARGS="--offset 5000 --name tiresias_peer_w5000" (the default name overwrites results/tiresias_peer.*).
bench-tiresias: $(STAMP)
	$(BIN)/python benchmarks/tiresias/run.py $(TIRESIAS_ARGS)

clean:
	rm -rf $(VENV) results
