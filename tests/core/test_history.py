"""Epoch-addressed maintenance: any order of rule evaluation, re-runs and corrected history."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pyspark.sql import DataFrame, SparkSession

from wcoj_core.engine import Engine
from wcoj_core.history import History
from wcoj_core.naive import naive_eval
from wcoj_core.query.builtins import builtin
from wcoj_core.traces import counts_trace_name, output_trace_name, rule_trace_name

QUERY = builtin("4-cycles")
Changes = list[tuple[tuple[int, int], int]]


def epochs(seed: int, count: int) -> list[Changes]:
    rng = random.Random(seed)
    live: list[tuple[int, int]] = []
    out = []
    for _ in range(count):
        ups: Changes = []
        for _ in range(10):
            a, b = rng.sample(range(8), 2)
            ups += [((a, b), 1), ((b, a), 1)]
            live.append((a, b))
        for a, b in rng.sample(live, 3):
            ups += [((a, b), -1), ((b, a), -1)]
        out.append(ups)
    return out


def frame(spark: SparkSession, ups: Changes) -> DataFrame:
    return spark.createDataFrame([(a, b, d) for (a, b), d in ups], "c0 long, c1 long, diff long")


def multiset(df: DataFrame) -> Counter:
    out: Counter = Counter()
    for row in df.collect():
        out[tuple(row[:-1])] += row[-1]
    return Counter({k: v for k, v in out.items() if v})


def oracle(history: list[Changes], upto: int) -> Counter:
    edge: dict[tuple[int, ...], int] = {}
    for ups in history[: upto + 1]:
        for t, d in ups:
            edge[t] = edge.get(t, 0) + d
    return naive_eval(QUERY, {"edge": edge})


RULES = [rule_trace_name(QUERY.name, i) for i in range(len(QUERY.atoms))]


def derive(h: History, spark: SparkSession, history: list[Changes], rule_order: list[int]) -> None:
    """Ingest and arrange in epoch order; evaluate the rules' epochs in the given order."""
    for t, ups in enumerate(history):
        h.ingest(t, "edge", frame(spark, ups))
        for a in h.counts():
            h.arrange(t, a)
    for t in rule_order:
        for i in range(len(QUERY.atoms)):
            h.derive_rule(QUERY.name, i, t)
    for t in sorted(rule_order):
        h.derive_output(QUERY.name, t)


def engine(spark: SparkSession, root: str, deployment: str) -> Engine:
    return Engine(spark, root, QUERY, deployment=deployment, executor_tasks=2)


def derived_where(h: History, deployment: str) -> None:
    """Every derived batch was written where asked (the driver's are named b-k-)."""
    manifest = h.store.current()
    for name in h.sources:
        trace = manifest.trace(name)
        assert trace is not None and trace.batches, name
        driver = deployment == "driver"
        assert all(("/b-k-" in b.path) == driver for b in trace.batches), name


@pytest.mark.parametrize("deployment", ["driver", "executors"])
def test_reverse_order_backfill_and_corrected_history(
    small: SparkSession, tmp_path, deployment: str
) -> None:
    history = epochs(seed=5, count=4)
    h = History(engine(small, str(tmp_path / "state"), deployment))
    derive(h, small, history, rule_order=[3, 2, 1, 0])
    derived_where(h, deployment)
    for t in range(4):
        assert multiset(h.output(QUERY.name, t)) == oracle(history, t), f"epoch {t}"
        figures = h.output_figures(QUERY.name, t)
        if deployment == "driver":
            expected = oracle(history, t)
            assert figures == (len(expected), sum(expected.values())), f"epoch {t}"
        else:
            assert figures is None

    assert h.stale() == {}

    # Running an epoch again changes nothing: steps replace, they never add; re-ingesting the
    # same changes keeps the stored batch, so nothing derived from it goes stale.
    before = h.store.current().trace("rel/edge")
    derive(h, small, history[:2], rule_order=[1])
    assert h.store.current().trace("rel/edge") == before
    assert multiset(h.output(QUERY.name, 3)) == oracle(history, 3)
    assert h.stale() == {}

    # Correct epoch 1, then re-derive from it: every later output is as if it had come on time.
    corrected = [*history]
    corrected[1] = [((0, 7), 1), ((7, 0), 1), ((1, 7), 1), ((7, 1), 1), *history[1][:6]]
    h.ingest(1, "edge", frame(small, corrected[1]))
    derived = [*(counts_trace_name(a) for a in h.counts()), *RULES, output_trace_name(QUERY.name)]
    assert h.stale() == {name: [1, 2, 3] for name in derived}
    for t in range(1, 4):
        for a in h.counts():
            h.arrange(t, a)
    # Counts rebuilt: the rules and the output still read what was replaced.
    assert h.stale() == {name: [1, 2, 3] for name in [*RULES, output_trace_name(QUERY.name)]}
    for i in range(len(QUERY.atoms)):
        h.derive_rule(QUERY.name, i, 3)
    # A rule at 3 rebuilt: the output at 3 sums replaced rule batches, so it stays stale.
    assert h.stale() == {**{r: [1, 2] for r in RULES}, output_trace_name(QUERY.name): [1, 2, 3]}
    for t in (1, 2):
        for i in range(len(QUERY.atoms)):
            h.derive_rule(QUERY.name, i, t)
    for t in (1, 2, 3):
        h.derive_output(QUERY.name, t)
    assert h.stale() == {}
    for t in range(4):
        assert multiset(h.output(QUERY.name, t)) == oracle(corrected, t), f"corrected epoch {t}"
    derived_where(h, deployment)
    fresh = History(engine(small, str(tmp_path / "fresh"), deployment))
    derive(fresh, small, corrected, rule_order=[0, 1, 2, 3])
    assert multiset(fresh.output(QUERY.name, 3)) == multiset(h.output(QUERY.name, 3))
