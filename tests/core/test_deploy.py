"""The kernel's deployments: the same work wherever it runs, the choice and its reasons, faults.

The oracle tests (`test_engine_oracle.py`) run random queries in every deployment, interleaved.
These tests cover what they cannot see: every deployment doing exactly the same work (same
prefixes, counts, proposals and validations), the driver's traces following other writers and
compactions, failures leaving the state as it was, leftovers of failed task attempts removed,
the routing of the sharded executors, and the recorded choice.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession

from wcoj_core.deploy import Limits
from wcoj_core.deploy.batches import BatchFiles
from wcoj_core.deploy.executors import Written
from wcoj_core.deploy.sharded import Router
from wcoj_core.engine import Engine
from wcoj_core.errors import StateError
from wcoj_core.naive import naive_eval
from wcoj_core.query.builtins import builtin

TRIANGLES = builtin("triangles")


def edge_frame(spark: SparkSession, changes: Counter) -> DataFrame:
    rows = [(a, b, d) for (a, b), d in changes.items() if d]
    return spark.createDataFrame(rows, "c0 long, c1 long, diff long")


def graph_epochs(seed: int, epochs: int = 4) -> list[Counter]:
    """A random graph with a hub, then epochs inserting and deleting undirected edges."""
    rng = random.Random(seed)
    present: set[tuple[int, int]] = set()
    out = []
    for t in range(epochs + 1):
        change: Counter = Counter()
        pairs = [(0, v) for v in range(1, 40)] if t == 0 else []  # vertex 0: a hub
        pairs += [tuple(rng.sample(range(60), 2)) for _ in range(300 if t == 0 else 40)]
        for a, b in pairs:
            if (a, b) not in present:
                present |= {(a, b), (b, a)}
                change[(a, b)] += 1
                change[(b, a)] += 1
        if t:
            for a, b in rng.sample(sorted(present), 15):
                if (a, b) in present:
                    present -= {(a, b), (b, a)}
                    change[(a, b)] -= 1
                    change[(b, a)] -= 1
        out.append(change)
    return out


def collected(df: DataFrame) -> Counter:
    found: Counter = Counter()
    for r in df.collect():
        found[(r["c0"], r["c1"], r["c2"])] += r["diff"]
    return Counter({k: v for k, v in found.items() if v})


def engines(spark: SparkSession, root: Path) -> dict[str, Engine]:
    made = {
        "driver": Engine(spark, str(root / "driver"), TRIANGLES, deployment="driver"),
        "executors": Engine(spark, str(root / "one"), TRIANGLES, deployment="executors"),
        "executors-split": Engine(
            spark, str(root / "split"), TRIANGLES, deployment="executors", executor_tasks=3
        ),
        "executors-sharded": Engine(
            spark, str(root / "sharded"), TRIANGLES, deployment="executors", executor_max_rows=400
        ),
    }
    made["executors-split"].one_task_rows = 0
    return made


def test_every_deployment_does_the_same_work(small: SparkSession, tmp_path: Path) -> None:
    """Same epochs everywhere: the oracle's output, and the same counts at every step."""
    ways = engines(small, tmp_path)
    graph: Counter = Counter()
    for t, change in enumerate(graph_epochs(seed=11)):
        before = naive_eval(TRIANGLES, {"edge": {k: v for k, v in graph.items() if v}})
        graph.update(change)
        after = naive_eval(TRIANGLES, {"edge": {k: v for k, v in graph.items() if v}})
        expected = Counter(after)
        expected.subtract(before)
        expected = Counter({k: v for k, v in expected.items() if v})
        steps = {}
        for name, engine in ways.items():
            result = engine.apply_epoch(t, {"edge": edge_frame(small, change)})
            assert result.metrics.deployment == name.split("-")[0], name
            assert ("shards" in result.metrics.reason) == name.endswith("sharded"), name
            assert collected(result.outputs["triangles"]) == expected, (name, t)
            assert result.total("triangles") == sum(expected.values()), (name, t)
            steps[name] = sorted(
                (s.rule, s.var, s.prefixes, s.min_count_sum, s.proposed, s.validated)
                for s in result.metrics.steps
            )
        assert steps["driver"], t
        for name, seen in steps.items():
            assert seen == steps["driver"], (name, t)
    for name, engine in ways.items():
        assert collected(engine.output()) == Counter(after), name


def test_the_driver_follows_another_writer_and_a_compaction(
    small: SparkSession, tmp_path: Path
) -> None:
    """Two engines take turns on one state (one on the driver, one on the executors), with a
    compaction every 2 batches; the oracle after each epoch."""
    state = str(tmp_path / "state")
    epochs = graph_epochs(seed=5, epochs=6)
    ways = [
        Engine(small, state, TRIANGLES, compact_every=2, deployment="driver"),
        Engine(small, state, TRIANGLES, compact_every=2, deployment="executors"),
    ]
    graph: Counter = Counter()
    for t, change in enumerate(epochs):
        engine = ways[(t // 2) % 2]  # 0, 0, 1, 1, 0, 0, 1
        graph.update(change)
        engine.apply_epoch(t, {"edge": edge_frame(small, change)})
        expected = naive_eval(TRIANGLES, {"edge": {k: v for k, v in graph.items() if v}})
        assert collected(engine.output()) == Counter(expected), f"epoch {t}"
    assert ways[0].resident.reads > 0
    assert ways[0].store.current().frontier is not None


def test_a_failed_write_applies_nothing(
    small: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    epochs = graph_epochs(seed=2, epochs=1)
    engine = Engine(small, str(state), TRIANGLES, deployment="driver")
    engine.apply_epoch(0, {"edge": edge_frame(small, epochs[0])})
    before = engine.store.current()
    writes: list[str] = []
    real = BatchFiles.write

    def failing(self, rel, *args, **kwargs):  # the third write of the epoch fails
        writes.append(rel)
        if len(writes) == 3:
            raise StateError(f"state {self.root}: cannot write a batch (No space left on device)")
        return real(self, rel, *args, **kwargs)

    monkeypatch.setattr(BatchFiles, "write", failing)
    with pytest.raises(StateError, match="No space left"):
        engine.apply_epoch(1, {"edge": edge_frame(small, epochs[1])})
    assert engine.store.current() == before
    live = {b.path for t in before.traces.values() for b in t.batches}
    on_disk = {
        f"traces/{d.name}/{b.name}" for d in (state / "traces").iterdir() for b in d.iterdir()
    }
    assert on_disk == live, "the staged batches were removed"
    monkeypatch.setattr(BatchFiles, "write", real)
    engine.apply_epoch(1, {"edge": edge_frame(small, epochs[1])})
    graph = Counter(epochs[0])
    graph.update(epochs[1])
    expected = naive_eval(TRIANGLES, {"edge": {k: v for k, v in graph.items() if v}})
    assert collected(engine.output()) == Counter(expected)


def test_a_failed_task_applies_nothing(small: SparkSession, tmp_path: Path) -> None:
    """A task that fails (a null in a change file it reads) fails the epoch, and applies
    nothing; the same epoch applies once the file is right."""
    state = tmp_path / "state"
    engine = Engine(small, str(state), TRIANGLES, deployment="executors")
    epochs = graph_epochs(seed=3, epochs=1)
    engine.apply_epoch(0, {"edge": edge_frame(small, epochs[0])})
    before = engine.store.current()
    changes = [((a, b), d) for (a, b), d in epochs[1].items() if d]
    bad = tmp_path / "bad.parquet"
    pq.write_table(
        pa.table(
            {
                "c0": pa.array([a for (a, _), _ in changes] + [None], pa.int64()),
                "c1": pa.array([b for (_, b), _ in changes] + [1], pa.int64()),
                "diff": pa.array([d for _, d in changes] + [1], pa.int64()),
            }
        ),
        bad,
    )
    with pytest.raises(Exception, match="null"):
        engine.apply_epoch(1, {"edge": small.read.parquet(str(bad))})
    assert engine.store.current() == before
    good = tmp_path / "good.parquet"
    pq.write_table(pq.read_table(bad).slice(0, len(changes)), good)
    engine.apply_epoch(1, {"edge": small.read.parquet(str(good))})
    graph = Counter(epochs[0])
    graph.update(epochs[1])
    expected = naive_eval(TRIANGLES, {"edge": {k: v for k, v in graph.items() if v}})
    assert collected(engine.output()) == Counter(expected)


def test_files_of_abandoned_attempts_are_removed(tmp_path: Path) -> None:
    from wcoj_core.deploy.work import RuleJob, Work

    files = BatchFiles(str(tmp_path))
    folder = "traces/out-x/b-x-1-abc"
    rows = np.array([[1, 2, 3]])
    files.write(folder, ["c0", "c1", "c2"], rows, np.array([1]), 1, part="kept")
    files.write(folder, ["c0", "c1", "c2"], rows, np.array([1]), 1, part="abandoned")
    empty = "traces/out-y/b-x-1-def"
    work = Work(
        str(tmp_path),
        1,
        {"triangles": _plan()},
        (),
        rules=(RuleJob("triangles", 2, "out/x"), RuleJob("triangles", 1, "out/y")),
    )
    written = Written({"out/x": [f"{folder}/part-kept-000.snappy.parquet"]}, {}, {}, {})
    written.clean(files, {"out/x": folder, "out/y": empty}, work)
    assert sorted(files.listing(folder)) == ["_SUCCESS", "part-kept-000.snappy.parquet"]
    assert files.read_layer(["c0", "c1", "c2"], [folder]).diff.tolist() == [1]
    assert len(files.read_layer(["c0", "c1", "c2"], [empty])) == 0  # an empty file of its schema


def _plan():
    from wcoj_core.query.plan import plan_query

    return plan_query(TRIANGLES)


def test_the_router_sends_each_shard_to_its_partitions(small: SparkSession) -> None:
    """Spark's hash partitioning sends each routing value to the partition it names, and a
    hub's rows (one key) spread over every partition of its shard."""
    router = Router.of(3, 4)
    keys = np.full(1000, 42, dtype=np.int64)
    salts = np.arange(1000, dtype=np.int64) * 7919
    routes = router.route(keys, salts)
    partitions = {router.values.index(int(r)) for r in routes}
    assert len(partitions) == 4 and len({p % 3 for p in partitions}) == 1
    df = small.createDataFrame([(int(r),) for r in routes], "route long")
    landed = df.repartition(router.partitions, "route").rdd.mapPartitionsWithIndex(
        lambda i, rows: [(i, r["route"]) for r in rows]
    )
    assert all(router.values[i] == route for i, route in landed.collect())


def test_the_choice_and_its_reason_are_recorded(small: SparkSession, tmp_path: Path) -> None:
    epochs = graph_epochs(seed=9, epochs=3)
    engine = Engine(small, str(tmp_path / "state"), TRIANGLES, driver_epoch_rows=20)
    first = engine.apply_epoch(0, {"edge": edge_frame(small, epochs[0])}).metrics
    assert (first.deployment, first.reason) == (
        "executors",
        "more than the driver's 20 rows changed at the epoch",
    )
    engine.limits = Limits(driver_max_rows=10)
    held = engine.apply_epoch(1, {"edge": edge_frame(small, epochs[1])}).metrics
    assert held.deployment == "executors" and "exceed the driver's 10" in held.reason
    engine.limits = Limits()
    fits = engine.apply_epoch(2, {"edge": edge_frame(small, epochs[2])}).metrics
    assert fits.deployment == "driver" and fits.reason.startswith("fits the driver (")
    assert fits.to_dict()["reason"] == fits.reason
