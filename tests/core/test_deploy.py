"""The kernel's deployments: the same work wherever it runs, the choice and its reasons, faults.

The oracle tests (`test_engine_oracle.py`) run random queries in every deployment, interleaved.
These tests cover what they cannot see: every deployment doing exactly the same work (same
prefixes, counts, proposals and validations) on a graph with a hub, writers on different
deployments taking turns on one state (each following the other's index and its merges),
failures leaving the state as it was, leftovers of failed task attempts removed, the routing of
the sharded executors, and the recorded choice.

Ported to the one-pass engine: changes are Arrow tables (the engine lands them on the driver,
whatever the deployment), an epoch's output change is `EpochResult.changes` (None when the
executors wrote it: `Engine.change`), and "nothing changed" includes the arrangement segments.
The old "follows a compaction" case is now "follows another writer's index merges": the engine
no longer compacts Parquet history (see test_engine_state.py).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from oracle import naive_eval, stored
from pyspark.sql import SparkSession

from wcoj_core import indexes
from wcoj_core.deploy import Limits, spark_job
from wcoj_core.deploy.executors import Written
from wcoj_core.deploy.sharded import Router
from wcoj_core.engine import Engine, EpochResult
from wcoj_core.errors import InputError, StateError
from wcoj_core.query.builtins import builtin
from wcoj_core.store.batches import Batches
from wcoj_core.store.manifest import Batch
from wcoj_core.store.store import Store

TRIANGLES = builtin("triangles")
OUT = "out/triangles"
Graph = Counter[tuple[int, ...]]


def edge_table(changes: Counter) -> pa.Table:
    rows = [(a, b, d) for (a, b), d in sorted(changes.items()) if d]
    return pa.table(
        {
            "c0": pa.array([a for a, _, _ in rows], pa.int64()),
            "c1": pa.array([b for _, b, _ in rows], pa.int64()),
            "diff": pa.array([d for _, _, d in rows], pa.int64()),
        }
    )


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


def live(graph: Counter) -> dict[tuple[int, ...], int]:
    return {k: v for k, v in graph.items() if v}


def change_of(engine: Engine, result: EpochResult, query: str = "triangles") -> Graph:
    """An epoch's output change: the driver's arrays, or the batch the executors wrote."""
    found: Graph = Counter()
    arrays = result.changes[query]
    if arrays is None:
        for row in engine.change(query, result.epoch).to_pylist():
            found[(row["c0"], row["c1"], row["c2"])] += row["diff"]
    else:
        rows, diff = arrays
        for row, d in zip(rows.tolist(), diff.tolist(), strict=True):
            found[tuple(row)] += d
    return Counter({k: v for k, v in found.items() if v})


def folders(root: Path) -> set[str]:
    """Every batch and segment folder on disk, as manifests name them."""
    found = set()
    for area in ("traces", "arrangements"):
        if (root / area).is_dir():
            found |= {
                f"{area}/{t.name}/{b.name}" for t in (root / area).iterdir() for b in t.iterdir()
            }
    return found


def kept_paths(store: Store) -> set[str]:
    return {p for g in store.generations() for p in store.generation(g).paths()}


def engines(spark: SparkSession, root: Path) -> dict[str, Engine]:
    made = {
        "driver": Engine(spark, str(root / "driver"), TRIANGLES, deployment="driver"),
        "executors": Engine(spark, str(root / "one"), TRIANGLES, deployment="executors"),
        "executors-split": Engine(
            spark, str(root / "split"), TRIANGLES, deployment="executors", executor_tasks=3
        ),
        "executors-sharded": Engine(
            spark, str(root / "sharded"), TRIANGLES, deployment="executors", executor_max_rows=600
        ),
    }
    made["executors-split"].access.one_task_rows = 0
    made["executors-sharded"].access.one_task_rows = 0
    made["executors-sharded"].access.routed = True  # routed stages, however small the epoch
    return made


def test_every_deployment_does_the_same_work(small: SparkSession, tmp_path: Path) -> None:
    """Same epochs everywhere (a hub of degree 39 at epoch 0): the oracle's output, and the same
    counts at every step of every rule."""
    ways = engines(small, tmp_path)
    graph: Counter = Counter()
    for t, change in enumerate(graph_epochs(seed=11, epochs=1)):
        before = naive_eval(TRIANGLES, {"edge": live(graph)})
        graph.update(change)
        after = naive_eval(TRIANGLES, {"edge": live(graph)})
        expected = Counter(after)
        expected.subtract(before)
        expected = Counter({k: v for k, v in expected.items() if v})
        assert expected, t
        steps = {}
        for name, engine in ways.items():
            result = engine.apply(t, {"edge": edge_table(change)})
            assert result.metrics.deployment == name.split("-")[0], name
            assert ("shards" in result.metrics.reason) == name.endswith("sharded"), name
            assert change_of(engine, result) == expected, (name, t)
            assert result.total("triangles") == sum(expected.values()), (name, t)
            assert result.count("triangles") == sum(after.values()), (name, t)
            steps[name] = sorted(
                (s.rule, s.var, s.prefixes, s.min_count_sum, s.proposed, s.validated)
                for s in result.metrics.steps
            )
        assert steps["driver"], t
        for name, seen in steps.items():
            assert seen == steps["driver"], (name, t)
    for name, engine in ways.items():
        assert stored(engine, OUT) == Counter(after), name
        assert stored(engine, "rel/edge") == live(graph), name


def test_a_static_evaluation_on_the_executors_is_written_by_the_tasks_unsummed(
    small: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Epoch 0 of a fresh state runs one rule whose bindings are all distinct
    (`EpochPass._distinct`): on the executors each task writes its own part of the output, as
    the driver keeps it unsorted, with no stage summing it (that stage held a whole partition
    of the output in one Python worker: 30 M 4-cliques ran out of a 1 GiB worker). Later
    epochs' outputs are summed as before. Exact against the oracle either way."""
    from wcoj_core.deploy import executors

    seen: list[tuple[frozenset[str], int]] = []
    real = executors.run_on_executors

    def spy(spark: SparkSession, work: Any, folders: Any, tasks: int) -> Any:
        seen.append((work.distinct, tasks))
        return real(spark, work, folders, tasks)

    monkeypatch.setattr(executors, "run_on_executors", spy)
    engine = Engine(small, str(tmp_path / "s"), TRIANGLES, deployment="executors", executor_tasks=3)
    engine.access.one_task_rows = 0
    graph: Counter = Counter()
    for t, change in enumerate(graph_epochs(seed=5, epochs=1)):
        before = Counter(naive_eval(TRIANGLES, {"edge": live(graph)}))
        graph.update(change)
        expected = Counter(naive_eval(TRIANGLES, {"edge": live(graph)}))
        expected.subtract(before)
        result = engine.apply(t, {"edge": edge_table(change)})
        assert change_of(engine, result) == Counter({k: v for k, v in expected.items() if v})
    assert [distinct for distinct, _ in seen] == [frozenset({"out/triangles"}), frozenset()]
    assert [tasks for _, tasks in seen] == [3, 3]
    assert stored(engine, OUT) == Counter(naive_eval(TRIANGLES, {"edge": live(graph)}))


def test_a_static_count_on_the_executors_is_counted_by_the_tasks_and_written_nowhere(
    small: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`wcoj count` keeping nothing (`Engine.evaluate(count_only=True)`) on the executors: each
    task counts its share of the bindings and sums their weights (`Work.counted`), with no
    output folder to write into, over the changes the driver wrote as segment files for them
    to map (`TraceRead.mapped`); the count, its total and every step's work are the driver's
    and the oracle's. (An output over sets keeping every variable: over a bag it is indexed,
    so made, on either deployment.)"""
    from wcoj_core.deploy import executors
    from wcoj_core.meaning import Meaning, RelationSpec

    seen: list[tuple[frozenset[str], set[str], int]] = []
    shipped: list[dict[str, tuple[int, int]]] = []
    real = executors.run_on_executors

    def spy(spark: SparkSession, work: Any, folders: Any, tasks: int) -> Any:
        seen.append((work.counted, set(folders), tasks))
        shipped.append({r.name: (r.mapped.rows, len(r.delta)) for r in work.reads if r.mapped})
        return real(spark, work, folders, tasks)

    monkeypatch.setattr(executors, "run_on_executors", spy)
    graph = graph_epochs(seed=7, epochs=0)[0]
    expected = sum(naive_eval(TRIANGLES, {"edge": live(graph)}).values())
    sets = {"edge": RelationSpec("edge", 2, Meaning.SET)}
    figures = {}
    for name in ("driver", "executors"):
        root = tmp_path / name
        engine = Engine(
            small, str(root), TRIANGLES, relations=sets, deployment=name, executor_tasks=3
        )
        engine.access.one_task_rows = 0
        result = engine.evaluate({"edge": edge_table(graph)}, count_only=True)
        assert result.metrics.deployment == name
        assert result.changes["triangles"] is None, name  # counted, not made
        steps = sorted(
            (s.rule, s.var, s.prefixes, s.min_count_sum, s.proposed, s.validated)
            for s in result.metrics.steps
        )
        figures[name] = (result.count("triangles"), result.total("triangles"), steps)
        assert not list(root.rglob("*.parquet")), name  # a dry run leaves nothing
    assert expected > 0
    assert figures["driver"][:2] == (expected, expected)
    assert figures["executors"] == figures["driver"]
    assert seen == [(frozenset({OUT}), set(), 3)]  # no folder for the counted output
    # The changes reach the tasks as the segment files the driver wrote (mapped there), and no
    # batch is written for them: the pass keeps nothing.
    (ways,) = shipped
    assert ways["rel/edge"] == (sum(1 for d in graph.values() if d), 0)
    assert {n for n in ways if n.startswith("counts/")} and all(b == 0 for _, b in ways.values())


def test_writers_on_both_deployments_follow_each_other_and_the_merges(
    small: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two engines take turns on one state (one on the driver, one on the executors) while the
    index merges its segments after nearly every epoch; the oracle after each epoch. The usual
    epoch reads no batch, whoever wrote the previous one: it maps the index that epoch left."""
    monkeypatch.setattr(indexes, "MAX_RECENT", 1)
    monkeypatch.setattr(indexes, "MERGE_MIN_ROWS", 0)
    monkeypatch.setattr(indexes, "MERGE_SHARE", 0.1)
    state = str(tmp_path / "state")
    epochs = graph_epochs(seed=5, epochs=4)
    ways = [
        Engine(small, state, TRIANGLES, deployment="driver"),
        Engine(small, state, TRIANGLES, deployment="executors"),
    ]
    graph: Counter = Counter()
    bases: set[str] = set()
    for t, change in enumerate(epochs):
        engine = ways[(t // 2) % 2]  # 0, 0, 1, 1, 0
        graph.update(change)
        result = engine.apply(t, {"edge": edge_table(change)})
        assert result.metrics.deployment == ("driver", "executors")[(t // 2) % 2]
        expected = naive_eval(TRIANGLES, {"edge": live(graph)})
        assert stored(engine, OUT) == Counter(expected), f"epoch {t}"
        assert result.count("triangles") == sum(expected.values())
        if t:
            assert result.metrics.mapped_bytes > 0 and result.metrics.read_bytes == 0, t
        manifest = engine.store.current()
        bases |= {
            s.path
            for trace in manifest.traces.values()
            if trace.index is not None
            for s in trace.index.segments
            if s.level.value == "base"
        }
    assert len(bases) > len(ways[0].served.indexed()), "the bases were merged again"


def test_a_failed_write_applies_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The third batch the epoch writes fails (a full disk): the batches and segments staged
    before it are removed, no manifest is written, and the epoch then applies exactly."""
    state = tmp_path / "state"
    epochs = graph_epochs(seed=2, epochs=1)
    engine = Engine(None, str(state), TRIANGLES, deployment="driver")
    engine.apply(0, {"edge": edge_table(epochs[0])})
    before = engine.store.current()
    on_disk = folders(state)
    writes: list[str] = []
    real = Batches.write

    def failing(self: Batches, rel: str, *args: Any, **kwargs: Any) -> Any:
        writes.append(rel)
        if len(writes) == 3:
            raise StateError(f"state {self.root}: cannot write a batch (No space left on device)")
        return real(self, rel, *args, **kwargs)

    monkeypatch.setattr(Batches, "write", failing)
    with pytest.raises(StateError, match="No space left"):
        engine.apply(1, {"edge": edge_table(epochs[1])})
    assert len(writes) == 3
    assert engine.store.current() == before
    assert folders(state) == on_disk == kept_paths(engine.store), "the staged folders were removed"
    monkeypatch.setattr(Batches, "write", real)
    engine.apply(1, {"edge": edge_table(epochs[1])})
    graph = Counter(epochs[0])
    graph.update(epochs[1])
    assert stored(engine, OUT) == Counter(naive_eval(TRIANGLES, {"edge": live(graph)}))


def test_a_failed_task_applies_nothing(
    small: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task that fails (the relation's change file it reads is truncated under it) fails the
    epoch, and applies nothing; the same epoch then applies. Changes holding a null are refused
    on the driver, before anything is written."""
    state = tmp_path / "state"
    engine = Engine(small, str(state), TRIANGLES, deployment="executors")
    epochs = graph_epochs(seed=3, epochs=1)
    engine.apply(0, {"edge": edge_table(epochs[0])})
    before = engine.store.current()
    on_disk = folders(state)

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
    with pytest.raises(InputError, match="null"):
        engine.apply(1, {"edge": small.read.parquet(str(bad))})
    assert engine.store.current() == before and folders(state) == on_disk

    real = spark_job.run_rules
    truncated: list[str] = []

    def truncating(served: Any, access: Any, m: Any, epoch: int, *rest: Any, **kw: Any):
        choice, jobs, pre, written = rest
        # What the tasks read: the change mapped (a local state), else its batch.
        segment = (kw.get("mapped") or {}).get("rel/edge")
        if segment is not None:
            path = state / segment.path
        else:
            path = state / pre["rel/edge"].path / pre["rel/edge"].files[0].name
        path.chmod(0o644)
        path.write_bytes(path.read_bytes()[:20])
        truncated.append(str(path))
        return real(served, access, m, epoch, choice, jobs, pre, written, **kw)

    with monkeypatch.context() as patch:
        patch.setattr(spark_job, "run_rules", truncating)
        with pytest.raises(Exception) as failed:
            engine.apply(1, {"edge": edge_table(epochs[1])})
    assert truncated, "the tasks ran"
    assert not isinstance(failed.value, AssertionError), failed.value
    assert engine.store.current() == before
    assert folders(state) == on_disk, "the staged batches were removed"

    good = tmp_path / "good.parquet"
    pq.write_table(pq.read_table(bad).slice(0, len(changes)), good)
    result = engine.apply(1, {"edge": small.read.parquet(str(good))})
    assert result.metrics.deployment == "executors"
    graph = Counter(epochs[0])
    graph.update(epochs[1])
    assert stored(engine, OUT) == Counter(naive_eval(TRIANGLES, {"edge": live(graph)}))


def test_files_of_abandoned_attempts_are_removed(tmp_path: Path) -> None:
    from wcoj_core.deploy.work import RuleJob, Work

    files = Batches(str(tmp_path))
    folder = "traces/out-x/b-x-1-abc"
    rows = np.array([[1, 2, 3]])
    kept = files.write(folder, ["c0", "c1", "c2"], rows, np.array([1]), 1, part="kept")
    files.write(folder, ["c0", "c1", "c2"], rows, np.array([1]), 1, part="abandoned")
    empty = "traces/out-y/b-x-1-def"
    work = Work(
        str(tmp_path),
        1,
        {"triangles": _plan()},
        (),
        rules=(RuleJob("triangles", 2, "out/x"), RuleJob("triangles", 1, "out/y")),
    )
    written = Written(
        {"out/x": [f"{folder}/part-kept-000.snappy.parquet"]}, {"out/x": list(kept)}, {}, {}, {}
    )
    refs = written.clean(files, {"out/x": folder, "out/y": empty}, work)
    assert sorted(files.files.names(folder)) == ["part-kept-000.snappy.parquet"]
    cols = ["c0", "c1", "c2"]
    assert files.read_layer(cols, [Batch(folder, 1, 1, refs["out/x"])]).diff.tolist() == [1]
    assert len(files.read_layer(cols, [Batch(empty, 1, 0, refs["out/y"])])) == 0  # an empty file


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
    epochs = graph_epochs(seed=9, epochs=2)
    engine = Engine(small, str(tmp_path / "state"), TRIANGLES, driver_epoch_rows=20)
    first = engine.apply(0, {"edge": edge_table(epochs[0])}).metrics
    assert (first.deployment, first.reason) == (
        "executors",
        "more than the driver's 20 rows changed at the epoch",
    )
    engine.limits = Limits(driver_max_rows=10)
    held = engine.apply(1, {"edge": edge_table(epochs[1])}).metrics
    assert held.deployment == "executors" and "exceed the driver's 10" in held.reason
    engine.limits = Limits()
    fits = engine.apply(2, {"edge": edge_table(epochs[2])}).metrics
    assert fits.deployment == "driver" and fits.reason.startswith("fits the driver (")
    assert fits.to_dict()["reason"] == fits.reason
    graph: Counter = Counter()
    for change in epochs:
        graph.update(change)
    assert stored(engine, OUT) == Counter(naive_eval(TRIANGLES, {"edge": live(graph)}))


@pytest.mark.parametrize("one_task_rows", [50_000, 0])
def test_a_sharded_state_on_files_runs_its_epochs_as_tasks_over_the_mapped_arrangements(
    small: SparkSession, tmp_path: Path, one_task_rows: int
) -> None:
    """A state larger than an executor holds, on files every executor reaches: every epoch — the
    first load (nothing held before it), small ones (one task with the default
    `one_task_rows`) and large ones (split in tasks with 0) — runs its rules in tasks searching
    the mapped arrangement files, not as routed stages (the epoch's reason says so), with the
    oracle's change."""
    engine = Engine(
        small, str(tmp_path / "s"), TRIANGLES, deployment="executors", executor_max_rows=600
    )
    engine.access.one_task_rows = one_task_rows
    graph: Counter = Counter()
    sharded = 0
    epochs = graph_epochs(seed=11, epochs=3)
    for t, change in enumerate(epochs):
        before = naive_eval(TRIANGLES, {"edge": live(graph)})
        graph.update(change)
        expected = Counter(naive_eval(TRIANGLES, {"edge": live(graph)}))
        expected.subtract(before)
        result = engine.apply(t, {"edge": edge_table(change)})
        assert change_of(engine, result) == Counter({k: v for k, v in expected.items() if v}), t
        if "shards" in result.metrics.reason:
            sharded += 1
            assert spark_job.OVER_FILES in result.metrics.reason, result.metrics.reason
    assert sharded == len(epochs)
    assert stored(engine, OUT) == Counter(naive_eval(TRIANGLES, {"edge": live(graph)}))


def test_a_sharded_work_is_routed_only_where_its_tasks_cannot_map_every_trace() -> None:
    """`spark_job.routes`: routed stages for a sharded choice whose traces are not all in files
    the tasks map (a trace with batches but no arrangement files, a state on remote storage),
    or when asked for; tasks over the mapped files otherwise — an indexed trace, or one that
    held nothing before the epoch (a first load)."""
    from types import SimpleNamespace

    from wcoj_core.deploy import Choice, Deployment

    held = (SimpleNamespace(time=0),)  # a batch at epoch 0
    indexed = SimpleNamespace(batches=held, index=SimpleNamespace(segments=("a segment",)))
    unindexed = SimpleNamespace(batches=held, index=None)
    served = SimpleNamespace(relations=("edge",), counts_traces=())
    sharded, one = Choice(Deployment.EXECUTORS, "", 3), Choice(Deployment.EXECUTORS, "")

    def routes(
        trace: Any, epoch: int, choice: Choice = sharded, local: bool = True, routed: bool = False
    ) -> bool:
        state = SimpleNamespace(local=local, routed=routed)
        m = SimpleNamespace(traces={"rel/edge": trace})
        return spark_job.routes(served, state, m, epoch, choice)  # type: ignore[arg-type]

    assert not routes(indexed, 1)
    assert not routes(unindexed, 0)  # held nothing before epoch 0
    assert routes(unindexed, 1)
    assert routes(indexed, 1, local=False)
    assert routes(indexed, 1, routed=True)
    assert not routes(unindexed, 1, choice=one)


def test_a_task_on_a_cluster_that_sets_no_worker_memory_takes_the_default_task_budget() -> None:
    """`spark_job._budgeted`: with neither the engine's share (Spark in this process tree) nor
    ``spark.executor.pyspark.memory``, a task's kernel pieces and spill are sized for
    `work.TASK_MEMORY`, not left at the kernel's own limits (sized for no budget: a Python
    worker reached 2 GB on a first load of 18.6 M edges); a set worker memory still decides."""
    from types import SimpleNamespace

    from wcoj_core.budget import MemoryBudget, Shares
    from wcoj_core.deploy.work import TASK_MEMORY, Work
    from wcoj_core.kernel.join import CHUNK_ROWS, PROPOSAL_BUDGET

    plans = {"triangles": SimpleNamespace(query=TRIANGLES)}
    work = Work("/state", 0, plans, ())  # type: ignore[arg-type]

    def budgeted(conf: dict[str, str]) -> Work:
        spark = SimpleNamespace(conf=SimpleNamespace(get=lambda k, d=None: conf.get(k, d)))
        state = SimpleNamespace(spark=lambda _why: spark)
        served = SimpleNamespace(worker_bytes=None)
        return spark_job._budgeted(served, state, work)  # type: ignore[arg-type]

    default = budgeted({})
    shares = Shares.of(MemoryBudget(TASK_MEMORY, "a task"))
    assert default.memory == TASK_MEMORY
    assert default.chunk_rows == shares.chunk_rows(3) < CHUNK_ROWS
    assert default.budget == shares.proposals(3) < PROPOSAL_BUDGET
    small = budgeted({"spark.executor.pyspark.memory": "256m"})
    assert small.memory == 256 << 20 and small.budget < default.budget


def test_sharded_tasks_map_the_arrangement_files_and_hold_no_shard(tmp_path: Path) -> None:
    """A sharded task (`ShardLayers`) of a state with arrangement files searches them mapped:
    no batch is read into the worker, and the rows of its shard's keys are exactly the shard
    that the batches cut, for every view the plans read and every shard."""
    from dataclasses import replace

    from wcoj_core.deploy.resident import Resident, shard_of
    from wcoj_core.deploy.sharded import ShardLayers
    from wcoj_core.deploy.work import TraceRead, Work
    from wcoj_core.kernel.layer import Layer
    from wcoj_core.query.plan import AtomView, Version

    engine = Engine(None, str(tmp_path / "s"), TRIANGLES, deployment="driver")
    for t, change in enumerate(graph_epochs(seed=3, epochs=2)):
        engine.apply(t, {"edge": edge_table(change)})
    m = engine.store.current()
    root = engine.store.root
    reads = []
    for name in ("rel/edge", *engine.served.counts_traces):
        trace = m.traces[name]
        reads.append(
            TraceRead(
                name, trace.columns, trace.batches, trace=trace, keys=engine.served.views[name]
            )
        )
    assert m.epoch is not None
    mapped_work = Work(root, m.epoch + 1, engine.served.plans, tuple(reads))
    cut_work = replace(mapped_work, reads=tuple(replace(r, trace=None) for r in reads))
    shards = 3
    for read in reads:
        for pattern, order in sorted(read.keys, key=repr):
            view = None if pattern is None else AtomView("", pattern)
            for shard in range(shards):
                resident = Resident(Batches(root))
                layers = ShardLayers(mapped_work, resident, shard, shards).layers(
                    read.name, view, order, Version.OLD
                )
                assert resident.reads == 0 and layers, (read.name, order)
                whole = layers[0]
                for more in layers[1:]:
                    whole = Layer.build(
                        np.concatenate([np.asarray(whole.rows), np.asarray(more.rows)]),
                        np.concatenate([np.asarray(whole.diff), np.asarray(more.diff)]),
                    )
                rows = np.asarray(whole.rows)
                mine = shard_of(rows[:, 0], shards) == shard
                cut = ShardLayers(cut_work, Resident(Batches(root)), shard, shards).layers(
                    read.name, view, order, Version.OLD
                )
                (held,) = cut
                assert rows[mine].tolist() == np.asarray(held.rows).tolist(), (read.name, shard)
                assert np.asarray(whole.diff)[mine].tolist() == np.asarray(held.diff).tolist()


def test_the_driver_reads_counted_and_written_outputs_from_the_same_records() -> None:
    """A task's records of an output only counted (its rows, and its weights' sum as text: it
    may leave int64) and of an output written (its files) are read side by side."""
    from wcoj_core.deploy.executors import COUNT, FILE, _written
    from wcoj_core.deploy.work import Work

    work = Work("/state", 0, {}, (), counted=frozenset({"out/a"}))
    big = 2**63 + 5
    records = [
        {"kind": COUNT, "tag": 0, "c0": 5, "c1": None, "diff": 0, "path": str(big)},
        {"kind": FILE, "tag": 1, "c0": 3, "c1": 4, "diff": 0, "path": "traces/b/p-1\t10\tab"},
        {"kind": COUNT, "tag": 0, "c0": 2, "c1": None, "diff": 0, "path": "-1"},
        {"kind": FILE, "tag": 1, "c0": 1, "c1": -2, "diff": 0, "path": "traces/b/p-2\t11\tcd"},
    ]
    got = _written(work, ["out/a", "out/b"], records)
    assert got.counted == {"out/a": (7, big - 1)}
    assert got.rows["out/b"] == 4 and got.totals["out/b"] == 2
    assert got.files["out/b"] == ["traces/b/p-1", "traces/b/p-2"]
    assert "out/a" not in got.files or not got.files["out/a"]
