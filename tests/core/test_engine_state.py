"""The engine's persisted state: idempotent epochs, atomic commits, racing writers, compaction,
and several queries sharing one state.

Every result is compared with the naive oracle as exact multisets (`Counter`), and every "nothing
changed" claim compares the manifest, the accumulated output, the accumulated relation and the
batch directories on disk before and after.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from wcoj_core import engine as engine_module
from wcoj_core.deploy.batches import BatchFiles
from wcoj_core.engine import Engine, EpochResult
from wcoj_core.errors import EpochAlreadyApplied, StateError
from wcoj_core.naive import naive_delta, naive_eval
from wcoj_core.query.builtins import builtin
from wcoj_core.query.ir import Query
from wcoj_core.query.plan import Kind
from wcoj_core.state import Manifest, StateStore
from wcoj_core.traces import counts_trace_name
from wcoj_core.updates import DIFF, consolidate

TRIANGLES = builtin("triangles")
PATHS = builtin("2-paths")

Graph = Counter[tuple[int, ...]]


@pytest.fixture(autouse=True)
def small_data_conf(small: SparkSession) -> None:
    """Every test here runs on tiny data (see the `small` fixture)."""


# --- data and oracle ------------------------------------------------------------------------------


def epoch_changes(seed: int, graph: Graph) -> Graph:
    """Symmetric changes to a small graph: insertions (some doubled) and deletions of live edges."""
    rng = random.Random(seed)
    changes: Graph = Counter()
    pairs = {(u, v) for (u, v), d in graph.items() if u < v and d > 0}
    for u, v in rng.sample(sorted(pairs), min(2, len(pairs))):
        changes[(u, v)] -= 1
    while len(changes) < (6 if pairs else 11):
        u, v = sorted(rng.sample(range(7), 2))
        changes[(u, v)] += rng.choice((1, 1, 2))
    return Counter({k: d for (u, v), d in changes.items() for k in ((u, v), (v, u)) if d != 0})


def apply_changes(graph: Graph, changes: Graph) -> Graph:
    total = Counter(graph)
    for t, d in changes.items():
        total[t] += d
    return Counter({t: d for t, d in total.items() if d != 0})


def frame(spark: SparkSession, changes: Graph) -> DataFrame:
    rows = [(*t, d) for t, d in sorted(changes.items())]
    return spark.createDataFrame(rows, "c0 long, c1 long, diff long")


def change_of(result: EpochResult, query: Query) -> Counter[tuple[int, ...]]:
    """An epoch's output change (c0.., time, diff) as a multiset; every row carries the epoch."""
    change: Counter[tuple[int, ...]] = Counter()
    for row in result.outputs[query.name].collect():
        assert row["time"] == result.epoch
        change[tuple(row)[:-2]] += row["diff"]
    return change


def multiset(df: DataFrame) -> Counter[tuple[int, ...]]:
    """Accumulated (c0.., diff) rows as a multiset."""
    out: Counter[tuple[int, ...]] = Counter()
    for row in df.collect():
        out[tuple(row)[:-1]] += row["diff"]
    return out


@dataclass
class Run:
    """An engine plus the oracle's view of the input it was given."""

    spark: SparkSession
    engine: Engine
    graph: Graph

    def step(self, epoch: int, changes: Graph) -> EpochResult:
        """Apply one epoch and check every output change against the oracle."""
        before, after = self.graph, apply_changes(self.graph, changes)
        result = self.engine.apply_epoch(epoch, {"edge": frame(self.spark, changes)})
        for query in self.engine.queries.values():
            expected = naive_delta(query, {"edge": before}, {"edge": after})
            assert change_of(result, query) == expected, f"{query.name} at epoch {epoch}"
        self.graph = after
        return result

    def check_accumulated(self) -> None:
        assert multiset(self.engine.relation("edge")) == self.graph
        for query in self.engine.queries.values():
            expected = naive_eval(query, {"edge": self.graph})
            assert multiset(self.engine.output(query.name)) == expected, query.name


def new_run(
    spark: SparkSession, state: Path, queries: list[Query], epochs: int, **options: Any
) -> Run:
    run = Run(spark, Engine(spark, str(state), queries, **options), Counter())
    for epoch in range(epochs):
        run.step(epoch, epoch_changes(epoch, run.graph))
    return run


# --- state on disk --------------------------------------------------------------------------------


def batch_dirs(state: Path) -> set[str]:
    """Every batch directory under ``<state>/traces``, as manifests name them."""
    traces = state / "traces"
    return {f"traces/{t.name}/{b.name}" for t in traces.iterdir() for b in t.iterdir()}


def live_batches(manifest: Manifest) -> set[str]:
    return {b.path for t in manifest.traces.values() for b in t.batches}


@dataclass(frozen=True)
class Observed:
    """What must not change when an epoch is refused or fails."""

    manifest: Manifest
    output: Counter[tuple[int, ...]]
    relation: Counter[tuple[int, ...]]
    dirs: frozenset[str]


def observe(engine: Engine, state: Path) -> Observed:
    return Observed(
        engine.store.current(),
        multiset(engine.output()),
        multiset(engine.relation("edge")),
        frozenset(batch_dirs(state)),
    )


def assert_unchanged(engine: Engine, state: Path, before: Observed) -> None:
    after = observe(engine, state)
    assert (after.manifest.generation, after.manifest.epoch) == (
        before.manifest.generation,
        before.manifest.epoch,
    )
    assert after.manifest == before.manifest
    assert after.output == before.output
    assert after.relation == before.relation
    assert after.dirs == before.dirs, f"left behind: {sorted(after.dirs - before.dirs)}"
    assert after.dirs == live_batches(after.manifest)


# --- idempotence ----------------------------------------------------------------------------------


def test_an_applied_epoch_is_refused_and_changes_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    run = new_run(spark, state, [TRIANGLES], epochs=2)
    before = observe(run.engine, state)
    assert before.manifest.epoch == 1
    assert before.output, "the test graph should hold triangles"

    again = frame(spark, epoch_changes(1, run.graph))
    with pytest.raises(EpochAlreadyApplied, match="epoch 1 is already applied"):
        run.engine.apply_epoch(1, {"edge": again})
    assert_unchanged(run.engine, state, before)

    with pytest.raises(EpochAlreadyApplied, match="epoch 0 cannot be applied"):
        run.engine.apply_epoch(0, {"edge": again})
    assert_unchanged(run.engine, state, before)
    run.check_accumulated()


# --- atomicity ------------------------------------------------------------------------------------


class Injected(Exception):
    """The failure the fault-injection tests raise."""


def failing(
    original: Callable[..., Any] | None, state: Path, seen: list[set[str]], exc: BaseException
) -> Callable[..., Any]:
    """A stand-in that runs `original` (if any), records the staged batch directories, raises."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if original is not None:
            original(*args, **kwargs)
        seen.append(batch_dirs(state))
        raise exc

    return wrapper


@pytest.mark.parametrize(
    ("owner", "name", "deployment", "run_original", "exc"),
    [
        # On the driver, after the relation's batch is staged, as the kernel finishes.
        (engine_module, "run_on_driver", "driver", True, Injected("driver, in rules")),
        # On the executors, after every counts and output batch was written by the tasks.
        (engine_module, "run_on_executors", "executors", True, Injected("executors, in rules")),
        # Sharded, after the relation and counts batches were written, before the rules'.
        (engine_module, "rule_frames", "sharded", True, Injected("sharded, in rules")),
        # Instead of writing the manifest, as an interrupt would (the engine catches it too).
        (StateStore, "commit", "driver", False, KeyboardInterrupt()),
    ],
    ids=["driver", "executors", "sharded", "commit"],
)
def test_a_failed_epoch_leaves_the_state_intact(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    owner: Any,
    name: str,
    deployment: str,
    run_original: bool,
    exc: BaseException,
) -> None:
    state = tmp_path / "state"
    options: dict[str, Any] = {"deployment": deployment.replace("sharded", "executors")}
    if deployment == "sharded":
        options["executor_max_rows"] = 5
    run = new_run(spark, state, [TRIANGLES], epochs=1, **options)
    before = observe(run.engine, state)
    changes = epoch_changes(1, run.graph)

    seen: list[set[str]] = []
    with monkeypatch.context() as patch:
        original = getattr(owner, name) if run_original else None
        patch.setattr(owner, name, failing(original, state, seen, exc))
        with pytest.raises(type(exc)):
            run.engine.apply_epoch(1, {"edge": frame(spark, changes)})
    assert seen and seen[0] > before.dirs, "the failure should come after some staging"
    assert_unchanged(run.engine, state, before)

    # The same epoch then applies normally, and gives exactly the oracle's change.
    run.step(1, changes)
    run.check_accumulated()


# --- two writers ----------------------------------------------------------------------------------


def test_a_second_engine_cannot_reapply_or_race(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    first = new_run(spark, state, [TRIANGLES], epochs=1)
    second = Engine(spark, str(state), TRIANGLES)
    with pytest.raises(EpochAlreadyApplied):
        second.apply_epoch(0, {"edge": frame(spark, epoch_changes(0, Counter()))})

    # Both writers start from the same generation; the first commits epoch 1, then the second,
    # still seeing the older generation, tries its own epoch 1.
    stale = second.store.current()
    first.step(1, epoch_changes(1, first.graph))
    won = observe(first.engine, state)
    assert won.manifest.generation == stale.generation + 1

    with monkeypatch.context() as patch:
        patch.setattr(second.store, "current", lambda: stale)
        other = frame(spark, epoch_changes(101, first.graph))
        with pytest.raises(StateError, match="committed by another writer") as caught:
            second.apply_epoch(1, {"edge": other})
    assert not isinstance(caught.value, EpochAlreadyApplied)
    assert_unchanged(first.engine, state, won)
    first.check_accumulated()

    # After reloading, the second engine continues from the first one's state.
    racing = Run(spark, second, first.graph)
    racing.step(2, epoch_changes(2, racing.graph))
    racing.check_accumulated()


# --- compaction -----------------------------------------------------------------------------------


@pytest.mark.parametrize("deployment", ["driver", "executors"])
def test_compaction_keeps_contents_and_later_epochs_exact(
    spark: SparkSession, tmp_path: Path, deployment: str
) -> None:
    """Merged on the driver (a local state's default) or by Spark (the executors'): the same."""
    state = tmp_path / "state"
    run = new_run(spark, state, [TRIANGLES], epochs=3, deployment=deployment)
    before = observe(run.engine, state)
    assert any(len(t.batches) == 3 for t in before.manifest.traces.values())

    run.engine.compact()
    after = run.engine.store.current()
    assert after.generation == before.manifest.generation + 1
    assert (after.epoch, after.frontier) == (2, 2)
    assert sorted(after.traces) == sorted(before.manifest.traces)
    for trace in after.traces.values():
        assert len(trace.batches) <= 1 and all(b.time == 2 for b in trace.batches), trace
        for batch in trace.batches:
            # The driver writes its batches as `b-k-*` (see `Engine.write_batch`).
            assert ("/b-k-" in batch.path) == (deployment == "driver"), batch.path
            # Each tuple once, with its summed, non-zero diff; the manifest counts its rows.
            rows = run.engine.store.read(trace, [batch]).collect()
            tuples = [tuple(r[c] for c in trace.columns) for r in rows]
            assert len(tuples) == len(set(tuples)) == batch.rows, trace.name
            assert all(r[DIFF] != 0 for r in rows), trace.name
    assert multiset(run.engine.output()) == before.output
    assert multiset(run.engine.relation("edge")) == before.relation
    assert multiset(run.engine.output(time=2)) == before.output
    for time in (0, 1):
        with pytest.raises(StateError, match="compacted"):
            run.engine.output(time=time)
        with pytest.raises(StateError, match="compacted"):
            run.engine.relation("edge", time=time)

    run.step(3, epoch_changes(3, run.graph))
    run.check_accumulated()
    assert multiset(run.engine.output(time=2)) == before.output


def test_a_failed_compaction_on_the_driver_leaves_the_state_intact(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The third merged batch fails to write: the two written are removed, nothing commits."""
    state = tmp_path / "state"
    run = new_run(spark, state, [TRIANGLES], epochs=3)
    before = observe(run.engine, state)
    seen: list[set[str]] = []
    original = BatchFiles.write

    def write(self: BatchFiles, *args: Any, **kwargs: Any) -> Any:
        if len(seen) == 2:
            raise Injected("the third merged batch")
        original(self, *args, **kwargs)
        seen.append(batch_dirs(state))

    with monkeypatch.context() as patch:
        patch.setattr(BatchFiles, "write", write)
        with pytest.raises(Injected):
            run.engine.compact()
    assert seen[-1] > before.dirs, "two merged batches were written before the failure"
    assert_unchanged(run.engine, state, before)

    run.engine.compact()  # then it compacts, and later epochs stay exact
    assert run.engine.store.current().frontier == 2
    run.step(3, epoch_changes(3, run.graph))
    run.check_accumulated()


def test_compacting_to_an_earlier_frontier_keeps_the_later_one(
    spark: SparkSession, tmp_path: Path
) -> None:
    run = new_run(spark, tmp_path / "state", [TRIANGLES], epochs=2)
    run.engine.compact()
    run.engine.compact(frontier=0)
    assert run.engine.store.current().frontier == 1
    with pytest.raises(StateError, match="compacted"):
        run.engine.relation("edge", time=0)


# --- several queries ------------------------------------------------------------------------------


def test_an_engine_must_serve_every_query_the_state_holds(
    spark: SparkSession, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    run = new_run(spark, state, [TRIANGLES, PATHS], epochs=1)
    before = run.engine.store.current()
    partial = Engine(spark, str(state), TRIANGLES)
    with pytest.raises(StateError, match="must serve every query"):
        partial.apply_epoch(5, {})
    assert partial.store.current() == before


def test_queries_share_arrangements_and_stay_exact(spark: SparkSession, tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = new_run(spark, state, [TRIANGLES, PATHS], epochs=3)
    run.check_accumulated()

    engine = run.engine
    manifest = engine.store.current()
    counts = sorted(name for name in manifest.traces if name.startswith("counts/"))
    per_query = [
        {a for a in engine.plans[q.name].arrangements if a.kind is Kind.COUNTS}
        for q in (TRIANGLES, PATHS)
    ]
    shared = set.union(*per_query)
    # One trace per distinct counts arrangement, however many queries read it.
    assert counts == sorted({counts_trace_name(a) for a in shared})
    assert len(counts) < sum(map(len, per_query))
    assert sorted(n for n in manifest.traces if n.startswith("rel/")) == ["rel/edge"]
    assert sorted(n for n in manifest.traces if n.startswith("out/")) == [
        "out/paths2",
        "out/triangles",
    ]

    # The shared counts hold, per key, the number of distinct live tuples.
    for a in shared:
        trace = manifest.traces[counts_trace_name(a)]
        stored = consolidate(engine.store.read(trace, trace.batches).drop("time"), trace.columns)
        expected: Counter[tuple[int, ...]] = Counter()
        for t in run.graph:
            expected[tuple(t[k] for k in a.key)] += 1
        assert multiset(stored) == expected, str(a)
