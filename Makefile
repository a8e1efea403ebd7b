# Two commands that work on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

DEMO   := .wcoj
PG_DIR := .wcoj-postgres
# What every process that creates or executes runs needs (wcoj_assets.instance.dagster_env).
DAGSTER_ENV = $$($(BIN)/python -m wcoj_assets.instance env)
# The demo's epochs start on its first landed day (the oldest folder), so the UI counts them only.
DEMO_START = WCOJ_EPOCH_START=$$(ls $(DEMO)/landing/edge | head -n 1)

.PHONY: demo replay ui postgres postgres-down ui-prod test test-fast test-e2e benchmarks lint java clean

# The install also compiles the byte-code, as a non-editable install does (a process reads it
# even where PYTHONDONTWRITEBYTECODE keeps it from writing any: ~0.2 s of every fresh `wcoj`).
$(STAMP): pyproject.toml setup.py wcoj_core/kernel/_native.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m compileall -q wcoj_core wcoj_assets wcoj_bench
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
	env $(DAGSTER_ENV) DAGSTER_HOME=$(abspath $(DEMO)/dagster) $(DEMO_START) \
		$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

## postgres: start the production instance's Postgres server (from a wheel) in .wcoj-postgres.
postgres: $(STAMP)
	$(BIN)/python -m wcoj_bench.infra.postgres up --dir $(PG_DIR)

## postgres-down: stop it; its data stays in .wcoj-postgres for the next `make postgres`.
postgres-down: $(STAMP)
	$(BIN)/python -m wcoj_bench.infra.postgres down --dir $(PG_DIR)

## ui-prod: the Dagster UI and daemon on http://127.0.0.1:3000 over the Postgres instance.
ui-prod: postgres java
	env $(DAGSTER_ENV) DAGSTER_HOME=$(abspath $(PG_DIR)/dagster) \
		$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

# Tests run on WORKERS processes (pytest-xdist), one per core of the machine we test on (2): the
# suite kept both cores busy (vmstat: 2% idle over a whole run), so a third worker only added
# contention (24 min 33 s with three, 22 min 08 s with two). Since its JVMs stop their JIT at the
# first tier (tests/spark-conf), the suite took 18 min 06 s with two (3c77859); 23 min 29 s at
# f4ebae3, 21 tests more and the machine slower that night; 29 min 59 s at b1e5542 under another
# engineer's load (7.5): 59.3 worker-minutes, the two workers ending 6 s apart, so the time is
# the work's, not the order's (docs/benchmarks.md, "The suite at b1e5542"); 17 min 23 s at
# a3d5e6e on an idle machine (1,529 passed, 1 skipped; the whole .ci/run 18 min 14 s); 21 min 53 s
# at fc52b06 (1,538 passed, 1 skipped), the same idle machine slower that morning (its warm probe
# on unchanged code 22 ms against 15 ms the night before).
# The end-to-end tests of one folder run one after another on one of them, the longest groups
# first, in the order tests/tiers.py gives (--no-loadscope-reorder keeps it). WORKERS=0 runs them
# all in this process.
WORKERS ?= 2
PYTEST  = $(BIN)/pytest -n $(WORKERS) --dist loadgroup --no-loadscope-reorder

## test: the whole suite, every tier (fast, spark, e2e, slow): what CI runs, with its 30 slowest
##   tests listed at the end. The browser test's Chromium and playwright-core are installed first
##   where they can be (else that test skips).
test: $(STAMP) java
	@scripts/ui_test_deps.sh
	$(PYTEST) --durations=30

## test-fast: the fast tier: no JVM, no server, nothing marked slow; no Java needed.
test-fast: $(STAMP)
	$(PYTEST) -m "not spark and not e2e and not slow"

## test-e2e: the end-to-end tier alone (Dagster daemon and webserver, Postgres, clusters, ...).
test-e2e: $(STAMP) java
	$(PYTEST) -m e2e

## benchmarks: rerun every benchmark, rewrite docs/benchmarks.md (long: use an idle machine).
##   ARGS='--only curve-size' reruns one part; ARGS=--render-only rebuilds the page from docs/bench.
benchmarks: $(STAMP) java
	$(BIN)/python -m wcoj_bench.report $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check wcoj_core wcoj_assets wcoj_bench tests
	$(BIN)/ruff format --check wcoj_core wcoj_assets wcoj_bench tests
	$(BIN)/pyright

clean:
	-test ! -x $(BIN)/python || $(BIN)/python -m wcoj_bench.infra.postgres down --dir $(PG_DIR)
	rm -rf $(VENV) $(DEMO) .pytest_cache .hypothesis spark-warehouse
