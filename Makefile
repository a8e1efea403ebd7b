# Two commands that work on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

DEMO   := .wcoj

.PHONY: demo replay ui test benchmarks lint java clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

java:
	@scripts/check_java.sh

## demo: land a generated skewed graph's epochs, let the sensor find them, run each through Dagster.
demo: $(STAMP) java
	$(BIN)/python -m wcoj_assets.demo --root $(DEMO)

## replay: the same kind of graph through the engine alone (no Dagster), checked at the end.
replay: $(STAMP) java
	$(BIN)/wcoj replay --query triangles --input edge=rmat:scale=12,edges=40000,seed=7 \
		--undirected edge --epochs 6 --delete-fraction 0.2 --check

## ui: the Dagster UI on http://127.0.0.1:3000 over the demo's instance, state and landing folder.
ui: $(STAMP) java
	@test -d $(DEMO)/dagster || { echo "run 'make demo' first: the UI shows its data"; exit 1; }
	DAGSTER_HOME=$(abspath $(DEMO)/dagster) $(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

## test: the whole suite (unit, oracle property tests, real SNAP graphs, CLI).
test: $(STAMP) java
	$(BIN)/pytest

## benchmarks: rerun every benchmark, rewrite docs/benchmarks.md (long: use an idle machine).
##   ARGS='--only curve-size' reruns one part; ARGS=--render-only rebuilds the page from docs/bench.
benchmarks: $(STAMP) java
	$(BIN)/python -m wcoj_core.report $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check wcoj_core wcoj_assets tests
	$(BIN)/ruff format --check wcoj_core wcoj_assets tests
	$(BIN)/pyright

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache .hypothesis spark-warehouse
