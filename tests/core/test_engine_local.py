"""The engine without Spark, against the naive oracle, epoch by epoch, as exact multisets.

Every epoch is applied by a *fresh* engine over the state directory (what a new process does:
it maps the arrangements the previous epoch persisted), for random queries over relations that
are sets or bags (drawn), random epochs of inserts, deletes, repeats and multiplicities above
one, and random index policies (recent segments merged after every epoch, or kept). At every
epoch: the output change equals the oracle's, the output's and every relation's figures (count,
distinct tuples, negative tuples) equal the oracle's, and so do the stored relation and counts
traces. Replacing an epoch (a re-run, a correction) and the rebuild of the epochs it made stale
are checked the same way. No JVM starts here.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from oracle import Oracle, naive_counts, stored
from strategies import queries, updates

from wcoj_core import indexes
from wcoj_core.budget import MemoryBudget, Shares
from wcoj_core.engine import Engine
from wcoj_core.errors import EpochAlreadyApplied, StateError
from wcoj_core.meaning import Meaning, RelationSpec, relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.query.plan import Kind
from wcoj_core.traces import counts_trace_name, output_trace_name, relation_trace_name

Ups = list[tuple[tuple[int, ...], int]]
# Shares so small that an epoch of a few tuples spills at every stage (`wcoj_core.spill`).
SPILL_ALL = Shares(MemoryBudget(128 << 20), 8 << 20, 64, 64, 128, 1 << 12, 32, 2)


def table(arity: int, ups: Ups) -> pa.Table:
    cols = {f"c{i}": pa.array([t[i] for t, _ in ups], pa.int64()) for i in range(arity)}
    return pa.table({**cols, "diff": pa.array([d for _, d in ups], pa.int64())})


def as_counter(rows: np.ndarray, diff: np.ndarray) -> Counter[tuple[int, ...]]:
    out: Counter[tuple[int, ...]] = Counter()
    for row, d in zip(np.asarray(rows).tolist(), np.asarray(diff).tolist(), strict=True):
        out[tuple(row)] += d
    return Counter({k: v for k, v in out.items() if v})


def figures_of(c: Mapping[tuple[int, ...], int]) -> tuple[int, int, int]:
    return (
        sum(1 for v in c.values() if v),
        sum(c.values()),
        sum(1 for v in c.values() if v < 0),
    )


def check_epoch(engine: Engine, oracle: Oracle, t: int, result) -> None:
    query = oracle.query
    expected = oracle.change(t)
    arrays = result.changes[query.name]
    if arrays is None:  # spilled: read from its batch
        change = engine.change(query.name, t)
        cols = [c for c in change.column_names if c != "diff"]
        rows = np.zeros((change.num_rows, len(cols)), dtype=np.int64)
        for j, c in enumerate(cols):
            rows[:, j] = change.column(c).to_numpy()
        arrays = rows, change.column("diff").to_numpy()
    rows, diff = arrays
    assert as_counter(rows, diff) == expected, f"epoch {t}: the output change"
    assert result.total(query.name) == sum(expected.values())
    out = oracle.output(t)
    assert result.traces[output_trace_name(query.name)].figures.as_tuple() == figures_of(out)
    assert stored(engine, output_trace_name(query.name), t) == out, f"epoch {t}: output"
    for rel in query.relations:
        held = oracle.state(t)[rel]
        assert stored(engine, relation_trace_name(rel), t) == held, f"epoch {t}: {rel}"
        figures = engine.figures(relation_trace_name(rel), t)
        assert figures == figures_of(held), f"epoch {t}: figures of {rel}"
    for a in engine.served.arrangements:
        if a.kind is Kind.COUNTS:
            held = oracle.state(t)[a.view.relation]
            got = stored(engine, counts_trace_name(a), t)
            assert got == naive_counts(a, held), f"epoch {t}: {a}"


meanings = st.sampled_from([Meaning.SET, Meaning.BAG])


@given(data=st.data())
def test_fresh_engines_match_the_oracle_epoch_by_epoch(tmp_path_factory, data) -> None:
    query = data.draw(queries(aggregates=True), label="query")
    specs = {
        rel: RelationSpec(rel, arity, data.draw(meanings, label=f"{rel} meaning"))
        for rel, arity in query.relations.items()
    }
    epochs = data.draw(
        st.lists(
            st.fixed_dictionaries({rel: updates(ar) for rel, ar in query.relations.items()}),
            min_size=1,
            max_size=4,
        ),
        label="epochs",
    )
    policy = data.draw(
        st.sampled_from(["merge-always", "recent-only", "default", "spill-everything"]),
        label="policy",
    )
    note(f"query: {query}; {specs}")
    with pytest.MonkeyPatch.context() as mp:  # this example's policy only
        if policy == "merge-always":
            mp.setattr(indexes, "MERGE_MIN_ROWS", 0)
            mp.setattr(indexes, "MERGE_SHARE", 0.0)
        elif policy == "recent-only":
            mp.setattr(indexes, "MAX_RECENT", 1000)
        elif policy == "spill-everything":  # a budget of a few hundred bytes per stage
            mp.setattr(Shares, "of", classmethod(lambda cls, budget, threads=1: SPILL_ALL))
        root = str(tmp_path_factory.mktemp("state"))
        oracle = Oracle(query, specs)
        for t, changes in enumerate(epochs):
            oracle.land(t, changes)
            engine = Engine(None, root, query, relations=specs)  # a fresh process, every epoch
            given_changes = {rel: table(query.relations[rel], ups) for rel, ups in changes.items()}
            result = engine.apply(t, given_changes)
            assert result.metrics.deployment == "driver"
            check_epoch(engine, oracle, t, result)


@given(data=st.data())
def test_replaced_epochs_and_their_stale_successors_match_the_oracle(
    tmp_path_factory, data
) -> None:
    """Apply some epochs, then replace one (other changes, or the same again: a re-run), then
    apply the next epoch: the epochs after the replaced one are derived again first."""
    query = data.draw(queries(aggregates=True), label="query")
    specs = {
        rel: RelationSpec(rel, arity, data.draw(meanings, label=f"{rel} meaning"))
        for rel, arity in query.relations.items()
    }
    epoch_changes = st.fixed_dictionaries({rel: updates(ar) for rel, ar in query.relations.items()})
    epochs = data.draw(st.lists(epoch_changes, min_size=2, max_size=4), label="epochs")
    root = str(tmp_path_factory.mktemp("state"))
    oracle = Oracle(query, specs)

    def apply(t: int, changes: Mapping[str, Ups], replace: bool = False):
        oracle.land(t, changes)
        engine = Engine(None, root, query, relations=specs)
        given_changes = {rel: table(query.relations[rel], ups) for rel, ups in changes.items()}
        return engine, engine.apply(t, given_changes, replace=replace)

    for t, changes in enumerate(epochs):
        apply(t, changes)
    k = data.draw(st.integers(0, len(epochs) - 1), label="replaced epoch")
    same = data.draw(st.booleans(), label="a re-run with the same changes")
    new = epochs[k] if same else data.draw(epoch_changes, label="corrected changes")
    engine, result = apply(k, new, replace=True)
    check_epoch(engine, oracle, k, result)
    stale = engine.stale()
    if same:
        assert stale == []
    assert all(s > k for s in stale)
    nxt = len(epochs)
    last = data.draw(epoch_changes, label="next epoch")
    engine, result = apply(nxt, last)
    assert list(result.rebuilt_epochs) == stale
    assert engine.stale() == []
    for t in range(nxt + 1):
        assert stored(engine, output_trace_name(query.name), t) == oracle.output(t), t
    check_epoch(engine, oracle, nxt, result)


def test_an_undirected_set_reads_a_both_directions_file_as_its_edges(tmp_path: Path) -> None:
    """SNAP's undirected graphs list every edge in both directions: the relation holds each
    edge once per direction, a deletion named in either direction deletes it, re-inserting a
    present edge or deleting an absent one changes nothing and is counted."""
    query = builtin("triangles")
    specs = relation_specs({"edge": 2}, undirected=["edge"])
    root = str(tmp_path / "state")
    square = [(0, 1), (1, 2), (2, 0), (2, 3), (3, 0)]  # triangles 012, 023
    both = [((a, b), 1) for a, b in square] + [((b, a), 1) for a, b in square]
    engine = Engine(None, root, query, relations=specs)
    r0 = engine.apply(0, {"edge": table(2, both)})
    assert r0.count("triangles") == 2 and r0.total("triangles") == 2
    assert engine.figures(relation_trace_name("edge")) == (10, 10, 0)
    assert r0.relations["edge"].landed == 10
    # Delete (2, 0) named as (0, 2); re-insert (1, 2); delete the absent (1, 3).
    r1 = Engine(None, root, query, relations=specs).apply(
        1, {"edge": table(2, [((0, 2), -1), ((1, 2), 1), ((1, 3), -1)])}
    )
    assert r1.count("triangles") == 0 and r1.total("triangles") == -2
    report = r1.relations["edge"]
    assert (report.inserted_present, report.deleted_absent) == (2, 2)  # both directions each
    assert report.changed == 2


def test_a_state_refuses_another_query_or_meaning_under_the_same_name(tmp_path: Path) -> None:
    from wcoj_core.query.parse import parse_query

    root = str(tmp_path / "state")
    query = builtin("triangles")
    specs = relation_specs({"edge": 2}, undirected=["edge"])
    Engine(None, root, query, relations=specs).apply(0, {"edge": table(2, [((1, 2), 1)])})
    other = parse_query("triangles(a, b, c) :- edge(a, b), edge(b, c), edge(a, c)")
    with pytest.raises(StateError, match="maintains query 'triangles' as"):
        Engine(None, root, other, relations=specs)
    with pytest.raises(StateError, match="holds relation 'edge' as an undirected set"):
        Engine(None, root, query, relations=relation_specs({"edge": 2}))
    engine = Engine(None, root, query, relations=specs)
    with pytest.raises(EpochAlreadyApplied):
        engine.apply(0, {})


def test_one_commit_per_epoch(tmp_path: Path) -> None:
    root = tmp_path / "state"
    query = builtin("triangles")
    specs = relation_specs({"edge": 2}, undirected=["edge"])
    for t in range(4):
        engine = Engine(None, str(root), query, relations=specs)
        before = engine.store.current().generation
        result = engine.apply(t, {"edge": table(2, [((t, t + 1), 1), ((t + 1, t + 2), 1)])})
        assert result.generation == before + 1
        assert engine.store.current().generation == before + 1


def test_a_local_epoch_imports_no_pyspark(tmp_path: Path) -> None:
    """An engine over a local state, fed Arrow tables, never imports pyspark."""
    code = f"""
import sys, pyarrow as pa
from wcoj_core.engine import Engine
from wcoj_core.meaning import relation_specs
from wcoj_core.query.builtins import builtin
t = pa.table({{"c0": [1, 2, 1], "c1": [2, 3, 3], "diff": [1, 1, 1]}})
e = Engine(None, {str(tmp_path / "s")!r}, builtin("triangles"),
           relations=relation_specs({{"edge": 2}}, undirected=["edge"]))
r = e.apply(0, {{"edge": t}})
assert r.count("triangles") == 1, r.count("triangles")
assert "pyspark" not in sys.modules, "pyspark imported"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _sequence(values: Sequence[int]) -> list[int]:
    return list(values)
