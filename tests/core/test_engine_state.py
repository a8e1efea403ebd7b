"""The engine's persisted state: idempotent epochs, atomic commits (failures and killed
processes), racing writers, the index's merges, and several queries sharing one state.

Every result is compared with the naive oracle as exact multisets (`Counter`) read back from the
state's batches, and every "nothing changed" claim compares the manifest, the accumulated output,
the accumulated relation and the folders on disk (batches, arrangement segments, scratch) before
and after. Most tests run on the driver without Spark, a fresh `Engine` per epoch (what a new
process does); the failure tests also run the executors and the sharded executors.

Ported from the engine before the one-pass rewrite (state format 2):

* an epoch no longer stages anything before its rules on the driver, so a failure is injected
  where the driver writes (after a batch and a segment are written); on the executors after the
  tasks wrote their batches; sharded after Spark wrote an output batch;
* what keeps files few: the index's LSM merges of arrangement segments, the store's pruning, and
  history compaction (``Engine.compact``, or ``compact_every`` in an epoch's own commit), whose
  frontier is honoured;
* an engine serves every query the state keeps (adopting those it was not given); a query the
  state does not keep is refused when an epoch is applied, until it is attached.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from oracle import naive_delta, naive_eval, stored

from wcoj_core import epoch as epoch_module
from wcoj_core import indexes
from wcoj_core import served as served_module
from wcoj_core.deploy import spark_job
from wcoj_core.engine import Engine, EpochResult
from wcoj_core.errors import ConcurrentCommit, EpochAlreadyApplied, StateError
from wcoj_core.meaning import relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.query.ir import Query
from wcoj_core.query.plan import Kind
from wcoj_core.store.manifest import Manifest
from wcoj_core.store.store import KEEP_MANIFESTS, ORPHAN_AGE, Store
from wcoj_core.traces import counts_trace_name, output_trace_name

TRIANGLES = builtin("triangles")
PATHS = builtin("2-paths")
HERE = Path(__file__).resolve().parent

Graph = Counter[tuple[int, ...]]


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


def graph_at(epoch: int) -> Graph:
    """The oracle's relation after epochs ``0 .. epoch`` of `epoch_changes` (seeded by epoch)."""
    graph: Graph = Counter()
    for t in range(epoch + 1):
        graph = apply_changes(graph, epoch_changes(t, graph))
    return graph


def table(changes: Graph) -> pa.Table:
    rows = sorted(changes.items())
    return pa.table(
        {
            "c0": pa.array([a for (a, _), _ in rows], pa.int64()),
            "c1": pa.array([b for (_, b), _ in rows], pa.int64()),
            "diff": pa.array([d for _, d in rows], pa.int64()),
        }
    )


def specs(queries: Iterable[Query]) -> dict[str, Any]:
    """Every relation a bag (the default): the epochs land multiplicities of 2."""
    arities: dict[str, int] = {}
    for q in queries:
        arities.update(q.relations)
    return relation_specs(arities)


def change_of(engine: Engine, result: EpochResult, query: str) -> Graph:
    """An epoch's output change: the driver's arrays, or the batch the executors wrote."""
    arrays = result.changes[query]
    change: Graph = Counter()
    if arrays is None:
        table = engine.change(query, result.epoch)
        cols = [c for c in table.column_names if c != "diff"]
        for row in table.to_pylist():
            change[tuple(row[c] for c in cols)] += row["diff"]
    else:
        rows, diff = arrays
        for row, d in zip(rows.tolist(), diff.tolist(), strict=True):
            change[tuple(row)] += d
    return Counter({k: v for k, v in change.items() if v})


@dataclass
class Run:
    """A state, the engines applying its epochs (a fresh one per epoch, unless `keep`), and the
    oracle's view of the input they were given."""

    root: Path
    queries: list[Query]
    spark: Any = None
    options: dict[str, Any] = field(default_factory=dict)
    graph: Graph = field(default_factory=Counter)
    keep: Engine | None = None

    @property
    def engine(self) -> Engine:
        if self.keep is not None:
            return self.keep
        relations = specs(self.queries)
        return Engine(self.spark, str(self.root), self.queries, relations=relations, **self.options)

    def step(self, epoch: int, changes: Graph) -> EpochResult:
        """Apply one epoch and check every output change against the oracle."""
        engine = self.engine
        before, after = self.graph, apply_changes(self.graph, changes)
        result = engine.apply(epoch, {"edge": table(changes)})
        for query in self.queries:
            expected = naive_delta(query, {"edge": before}, {"edge": after})
            assert change_of(engine, result, query.name) == expected, f"{query.name} at {epoch}"
            assert result.total(query.name) == sum(expected.values())
        self.graph = after
        return result

    def check_accumulated(self) -> None:
        engine = self.engine
        assert stored(engine, "rel/edge") == self.graph
        for query in self.queries:
            expected = naive_eval(query, {"edge": self.graph})
            assert stored(engine, output_trace_name(query.name)) == expected, query.name
            assert engine.count(query.name) == sum(expected.values())


def new_run(
    root: Path, queries: list[Query], epochs: int, spark: Any = None, **options: Any
) -> Run:
    run = Run(root, queries, spark, options)
    for epoch in range(epochs):
        run.step(epoch, epoch_changes(epoch, run.graph))
    return run


# --- state on disk --------------------------------------------------------------------------------


def folders(root: Path) -> set[str]:
    """Every batch, segment and scratch folder on disk, as manifests name them."""
    found = set()
    for area in ("traces", "arrangements"):
        if (root / area).is_dir():
            found |= {
                f"{area}/{t.name}/{b.name}" for t in (root / area).iterdir() for b in t.iterdir()
            }
    if (root / "scratch").is_dir():
        found |= {f"scratch/{s.name}" for s in (root / "scratch").iterdir()}
    return found


def kept_paths(store: Store) -> set[str]:
    """Every folder some kept manifest references."""
    return {p for g in store.generations() for p in store.generation(g).paths()}


@dataclass(frozen=True)
class Observed:
    """What must not change when an epoch is refused or fails."""

    manifest: Manifest
    manifests: tuple[str, ...]
    output: Graph
    relation: Graph
    dirs: frozenset[str]


def observe(engine: Engine, root: Path) -> Observed:
    return Observed(
        engine.store.current(),
        tuple(sorted(p.name for p in (root / "manifests").iterdir())),
        stored(engine, output_trace_name(next(iter(engine.queries)))),
        stored(engine, "rel/edge"),
        frozenset(folders(root)),
    )


def assert_unchanged(engine: Engine, root: Path, before: Observed) -> None:
    after = observe(engine, root)
    assert after.manifest == before.manifest
    assert after.manifests == before.manifests
    assert after.output == before.output
    assert after.relation == before.relation
    assert after.dirs == before.dirs, f"left behind: {sorted(after.dirs - before.dirs)}"
    assert after.dirs == kept_paths(engine.store)


# --- idempotence ----------------------------------------------------------------------------------


def test_an_applied_epoch_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "state"
    run = new_run(root, [TRIANGLES], epochs=2)
    before = observe(run.engine, root)
    assert before.manifest.epoch == 1
    assert before.output, "the test graph should hold triangles"

    again = {"edge": table(epoch_changes(1, run.graph))}
    with pytest.raises(EpochAlreadyApplied, match="epoch 1 is already applied"):
        run.engine.apply(1, again)
    assert_unchanged(run.engine, root, before)

    with pytest.raises(EpochAlreadyApplied, match="epoch 0 cannot be applied"):
        run.engine.apply(0, again)
    assert_unchanged(run.engine, root, before)
    run.check_accumulated()


# --- atomicity ------------------------------------------------------------------------------------


class Injected(Exception):
    """The failure the fault-injection tests raise."""


def failing(
    original: Callable[..., Any] | None, root: Path, seen: list[set[str]], exc: BaseException
) -> Callable[..., Any]:
    """A stand-in that runs `original` (if any), records the folders on disk, raises."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if original is not None:
            original(*args, **kwargs)
        seen.append(folders(root))
        raise exc

    return wrapper


@pytest.mark.parametrize(
    ("owner", "name", "deployment", "run_original", "exc"),
    [
        # On the driver, once a batch and a segment of the epoch are written.
        (epoch_module, "advance", "driver", True, Injected("driver, writing")),
        pytest.param(
            # On the executors, once the tasks wrote every output batch.
            spark_job, "run_rules", "executors", True, Injected("executors, after the tasks"),
            marks=pytest.mark.spark,
        ),
        pytest.param(
            # Sharded, once Spark wrote an output batch (hashed next).
            spark_job, "_hashed", "sharded", True, Injected("sharded, after an output"),
            marks=pytest.mark.spark,
        ),
        # Instead of writing the manifest, as an interrupt would (the engine catches it too).
        (Store, "commit", "driver", False, KeyboardInterrupt()),
    ],
    ids=["driver", "executors", "sharded", "commit"],
)  # fmt: skip
def test_a_failed_epoch_leaves_the_state_intact(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    owner: Any,
    name: str,
    deployment: str,
    run_original: bool,
    exc: BaseException,
) -> None:
    root = tmp_path / "state"
    run = new_run(root, [TRIANGLES], epochs=1)  # on the driver; the failing epoch as asked
    run.options = {"deployment": deployment.replace("sharded", "executors")}
    if deployment == "sharded":
        run.options["executor_max_rows"] = 40  # two shards (each phase is a Spark stage)
        # Routed stages even for this small epoch (not one task over the mapped files).
        monkeypatch.setattr(served_module, "ONE_TASK_ROWS", 0)
        monkeypatch.setattr(served_module.StateAccess, "routed", True)
    run.spark = request.getfixturevalue("small") if deployment != "driver" else None
    options = run.options
    before = observe(run.engine, root)
    changes = epoch_changes(1, run.graph)

    seen: list[set[str]] = []
    with monkeypatch.context() as patch:
        original = getattr(owner, name) if run_original else None
        patch.setattr(owner, name, failing(original, root, seen, exc))
        with pytest.raises(type(exc)):
            run.engine.apply(1, {"edge": table(changes)})
    if run_original:
        assert seen and seen[0] > before.dirs, "the failure should come after some staging"
    assert_unchanged(run.engine, root, before)

    # The same epoch then applies normally, and gives exactly the oracle's change.
    result = run.step(1, changes)
    assert result.metrics.deployment == options["deployment"]
    if deployment == "sharded":
        assert "shards" in result.metrics.reason
    run.check_accumulated()


CHILD = """
import os, signal, sys
sys.path[:0] = [{here!r}, os.path.dirname({here!r})]  # the test module, the oracle
from test_engine_state import TRIANGLES, epoch_changes, graph_at, specs, table
from wcoj_core.engine import Engine
from wcoj_core.store.store import Store
root, stop, kill_in = {root!r}, {stop}, {kill_in!r}
if kill_in:
    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    setattr(Store, kill_in, killed)
engine = Engine(None, root, TRIANGLES, relations=specs([TRIANGLES]))
start = 0 if engine.epoch is None else engine.epoch + 1
graph = graph_at(start - 1) if start else {{}}
for t in range(start, stop):
    changes = epoch_changes(t, graph)
    Engine(None, root, TRIANGLES, relations=specs([TRIANGLES])).apply(t, {{"edge": table(changes)}})
    for k, d in changes.items():
        graph[k] = graph.get(k, 0) + d
    print(t, flush=True)
"""


def child(root: Path, stop: int, kill_in: str = "") -> subprocess.Popen[str]:
    code = CHILD.format(here=str(HERE), root=str(root), stop=stop, kill_in=kill_in)
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def check_state_at_its_epoch(root: Path) -> Engine:
    """A killed writer's state: it opens, holds exactly the oracle at its last epoch, and every
    folder it left that no manifest references goes at the next pruning past `ORPHAN_AGE`."""
    engine = Engine(None, str(root), TRIANGLES, relations=specs([TRIANGLES]))
    t = engine.epoch
    assert t is not None
    graph = graph_at(t)
    assert stored(engine, "rel/edge") == graph
    assert stored(engine, output_trace_name("triangles")) == naive_eval(TRIANGLES, {"edge": graph})
    assert engine.stale() == []
    engine.store.prune(now=time.time() + ORPHAN_AGE + 1)
    assert folders(root) == kept_paths(engine.store)
    return engine


@pytest.mark.parametrize("kill_in", ["commit", "prune"])
def test_a_process_killed_around_its_commit_leaves_a_consistent_state(
    tmp_path: Path, kill_in: str
) -> None:
    """SIGKILL instead of the commit: the epoch is not applied, its staged folders are orphans
    (not referenced, pruned once old). SIGKILL right after the commit (in the pruning that
    follows it): the epoch is applied. Either way the next writer continues exactly."""
    root = tmp_path / "state"
    done = child(root, stop=2)
    assert done.wait(timeout=300) == 0, done.stderr.read() if done.stderr else ""
    staged_before = folders(root)
    killed = child(root, stop=3, kill_in=kill_in)
    assert killed.wait(timeout=300) == -signal.SIGKILL
    engine = Engine(None, str(root), TRIANGLES, relations=specs([TRIANGLES]))
    assert engine.epoch == (1 if kill_in == "commit" else 2)
    if kill_in == "commit":
        assert folders(root) > staged_before, "the killed epoch had staged its folders"
        assert not (folders(root) - staged_before) & kept_paths(engine.store)
    check_state_at_its_epoch(root)
    resumed = child(root, stop=5)
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read() if resumed.stderr else ""
    assert check_state_at_its_epoch(root).epoch == 4


def test_a_writer_killed_at_random_leaves_a_state_that_continues(tmp_path: Path) -> None:
    """A writer applying epoch after epoch is killed at three arbitrary moments (once its state
    holds an epoch more than before); each time the state is exactly the oracle at its epoch
    and the next writer continues from it."""
    root = tmp_path / "state"
    rng = random.Random(7)
    reached = -1
    for _ in range(3):
        proc = child(root, stop=60)
        store_dir = root / "manifests"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            gens = [p for p in store_dir.glob("*.json")] if store_dir.is_dir() else []
            if gens and Store.open(root, create=False).current().epoch not in (None, reached):
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        engine = check_state_at_its_epoch(root)
        assert engine.epoch is not None and engine.epoch > reached
        reached = engine.epoch


# --- two writers ----------------------------------------------------------------------------------


def test_a_second_engine_cannot_reapply_or_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "state"
    first = new_run(root, [TRIANGLES], epochs=1)
    second = Engine(None, str(root), TRIANGLES, relations=specs([TRIANGLES]))
    with pytest.raises(EpochAlreadyApplied):
        second.apply(0, {"edge": table(epoch_changes(0, Counter()))})

    # Both writers start from the same generation; the first commits epoch 1, then the second,
    # still seeing the older generation, tries its own epoch 1.
    stale = second.store.current()
    first.step(1, epoch_changes(1, first.graph))
    won = observe(first.engine, root)
    assert won.manifest.generation == stale.generation + 1

    with monkeypatch.context() as patch:
        patch.setattr(second.store, "current", lambda: stale)
        other = table(epoch_changes(101, first.graph))
        with pytest.raises(ConcurrentCommit, match="committed by another writer") as caught:
            second.apply(1, {"edge": other})
    assert isinstance(caught.value, StateError)
    assert not isinstance(caught.value, EpochAlreadyApplied)
    assert_unchanged(first.engine, root, won)
    first.check_accumulated()

    # The second engine then continues from the first one's state.
    racing = Run(root, [TRIANGLES], graph=first.graph, keep=second)
    racing.step(2, epoch_changes(2, racing.graph))
    racing.check_accumulated()


def test_two_writers_racing_for_one_epoch_one_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two engines in two threads apply different changes at epoch 1 and reach their commits
    together: exactly one commits, the other is refused and leaves nothing behind."""
    root = tmp_path / "state"
    run = new_run(root, [TRIANGLES], epochs=1)
    engines = [run.engine, run.engine]
    changes = [epoch_changes(1, run.graph), epoch_changes(202, run.graph)]
    assert changes[0] != changes[1]
    barrier = threading.Barrier(2, timeout=60)
    original = Store.commit

    def commit(self: Store, manifest: Manifest, expected: Manifest) -> Manifest:
        barrier.wait()
        return original(self, manifest, expected)

    outcomes: list[Any] = [None, None]

    def apply(i: int) -> None:
        try:
            outcomes[i] = engines[i].apply(1, {"edge": table(changes[i])})
        except BaseException as e:  # the loser's refusal, checked below
            outcomes[i] = e

    monkeypatch.setattr(Store, "commit", commit)
    threads = [threading.Thread(target=apply, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    monkeypatch.setattr(Store, "commit", original)
    won = [i for i, o in enumerate(outcomes) if isinstance(o, EpochResult)]
    lost = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert isinstance(lost[0], ConcurrentCommit), lost[0]
    run.graph = apply_changes(run.graph, changes[won[0]])
    run.check_accumulated()
    assert folders(root) == kept_paths(run.engine.store), "the loser's folders were removed"
    run.step(2, epoch_changes(2, run.graph))
    run.check_accumulated()


# --- what keeps files few -------------------------------------------------------------------------


def test_index_merges_keep_contents_exact_and_files_few(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What replaced the history compaction: each trace's index keeps one base segment and at
    most `MAX_RECENT` recent ones per view key, merging recent segments together and into the
    base (LSM); pruning deletes what no kept manifest references. Over many epochs the answers
    stay exact, the segments few, the manifests `KEEP_MANIFESTS`, and merges do happen."""
    monkeypatch.setattr(indexes, "MAX_RECENT", 2)
    monkeypatch.setattr(indexes, "MERGE_MIN_ROWS", 4)
    monkeypatch.setattr(indexes, "MERGE_SHARE", 0.3)
    root = tmp_path / "state"
    run = Run(root, [TRIANGLES, PATHS])
    bases: set[str] = set()
    epochs = 14
    for t in range(epochs):
        run.step(t, epoch_changes(t, run.graph))
        run.check_accumulated()
        engine = run.engine
        manifest = engine.store.current()
        for name in engine.served.indexed():
            index = manifest.traces[name].index
            assert index is not None and index.time == t, name
            per_key: Counter[Any] = Counter()
            for s in index.segments:
                per_key[(s.view, s.order, s.level.value)] += 1
                if s.level.value == "base":
                    bases.add(s.path)
            assert all(n <= (1 if key[2] == "base" else indexes.MAX_RECENT)
                       for key, n in per_key.items()), (name, per_key)  # fmt: skip
        assert folders(root) == kept_paths(engine.store)
        assert len(list((root / "manifests").glob("*.json"))) == min(t + 1, KEEP_MANIFESTS)
    assert len(bases) > len(run.engine.served.indexed()), "some base was merged again"
    # Batches are the history: one per changed trace and epoch, kept (no compaction asked).
    rel = run.engine.store.current().traces["rel/edge"]
    assert [b.time for b in rel.batches] == list(range(epochs))


def test_history_compaction_keeps_contents_and_later_epochs_exact(tmp_path: Path) -> None:
    """``Engine.compact()``: one batch per trace at the frontier, the same contents, history
    before it refused, later epochs exact."""
    root = tmp_path / "state"
    run = new_run(root, [TRIANGLES], epochs=3)
    before = observe(run.engine, root)
    engine = run.engine
    engine.compact()
    after = engine.store.current()
    assert (after.epoch, after.frontier) == (2, 2)
    assert all(len(t.batches) <= 1 for t in after.traces.values())
    assert stored(engine, output_trace_name("triangles")) == before.output
    with pytest.raises(StateError, match="compacted"):
        engine.output(time=0)
    run.step(3, epoch_changes(3, run.graph))
    run.check_accumulated()


def test_automatic_compaction_keeps_the_last_epochs_rerunnable(tmp_path: Path) -> None:
    """With ``compact_every=N`` a trace never holds more than about 2N batches: once it would,
    the epoch's own commit merges everything older than its last N epochs; those N stay
    re-runnable (here: the last epoch replaced by the same changes), the answers stay exact,
    and nothing goes stale."""
    root = tmp_path / "state"
    run = new_run(root, [TRIANGLES], epochs=1, compact_every=2)
    applied = {}
    for t in range(1, 9):
        before = run.engine.store.current().generation
        applied[t] = epoch_changes(t, run.graph)
        run.step(t, applied[t])
        engine = run.engine
        assert engine.store.current().generation == before + 1  # in the epoch's own commit
        run.check_accumulated()
        m = engine.store.current()
        assert max(len(tr.batches) for tr in m.traces.values()) <= 2 * 2 + 1
    m = run.engine.store.current()
    assert m.frontier is not None and m.frontier >= m.epoch - 2 * 2
    assert run.engine.stale() == []
    engine = run.engine
    engine.apply(m.epoch, {"edge": table(applied[m.epoch])}, replace=True)
    run.check_accumulated()
    assert engine.stale() == []
    with pytest.raises(StateError, match="compaction frontier"):
        engine.apply(m.frontier, {}, replace=True)


def test_epochs_at_or_before_a_frontier_cannot_be_rewritten(tmp_path: Path) -> None:
    """A state whose manifest records a compaction frontier refuses to replace an epoch at or before it, and to read history before it."""
    root = tmp_path / "state"
    run = new_run(root, [TRIANGLES], epochs=3)
    store = run.engine.store
    base = store.current()
    store.commit(replace(base, frontier=1), expected=base)
    engine = run.engine
    for t in (0, 1):
        with pytest.raises(
            StateError, match=f"epoch {t} is at or before the compaction frontier 1"
        ):
            engine.apply(t, {"edge": table(Counter({(1, 2): 1}))}, replace=True)
    with pytest.raises(StateError, match="history before epoch 1 was compacted"):
        engine.output(time=0)  # refused before any Spark is needed
    run.step(3, epoch_changes(3, run.graph))
    run.check_accumulated()


# --- several queries ------------------------------------------------------------------------------


def test_an_engine_serves_every_query_the_state_keeps_and_a_new_one_once_attached(
    tmp_path: Path,
) -> None:
    """An engine given fewer queries than the state keeps serves them all (it never drops one);
    a query the state does not keep is refused until it is attached (tests/core/test_attach.py)."""
    root = tmp_path / "state"
    run = new_run(root, [TRIANGLES, PATHS], epochs=1)
    before = observe(run.engine, root)
    assert sorted(Engine(None, str(root), TRIANGLES, relations=specs([TRIANGLES])).queries) == [
        "paths2",
        "triangles",
    ]
    four = builtin("4-cycles")
    engine = Engine(None, str(root), [TRIANGLES, four], relations=specs([TRIANGLES, four]))
    with pytest.raises(StateError, match="does not keep query cycles4: attach it first"):
        engine.apply(1, {"edge": table(epoch_changes(1, run.graph))})
    assert_unchanged(run.engine, root, before)


def test_queries_share_arrangements_and_stay_exact(tmp_path: Path) -> None:
    root = tmp_path / "state"
    run = new_run(root, [TRIANGLES, PATHS], epochs=3)
    run.check_accumulated()

    engine = run.engine
    manifest = engine.store.current()
    counts = sorted(name for name in manifest.traces if name.startswith("counts/"))
    per_query = [
        {a for a in engine.served.plans[q.name].arrangements if a.kind is Kind.COUNTS}
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
    # One index for the relation, holding the column orders both queries read.
    orders = {tuple(s.order) for s in manifest.traces["rel/edge"].index.segments}
    assert orders >= {(0, 1), (1, 0)}

    # The shared counts hold, per key, the number of distinct live tuples.
    for a in shared:
        expected: Graph = Counter()
        for t in run.graph:
            expected[tuple(t[k] for k in a.key)] += 1
        assert stored(engine, counts_trace_name(a)) == expected, str(a)
