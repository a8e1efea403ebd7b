# Two commands that work on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint java clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

java:
	@scripts/check_java.sh

## demo: replay the built-in skewed graph through the engine in 6 epochs, with deletions, checked.
demo: $(STAMP) java
	$(BIN)/wcoj replay --query triangles --input edge=rmat:scale=12,edges=40000,seed=7 \
		--undirected edge --epochs 6 --delete-fraction 0.2 --check

## test: the whole suite (unit, oracle property tests, real SNAP graphs, CLI).
test: $(STAMP) java
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check wcoj_core wcoj_assets tests
	$(BIN)/ruff format --check wcoj_core wcoj_assets tests
	$(BIN)/pyright

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis spark-warehouse
