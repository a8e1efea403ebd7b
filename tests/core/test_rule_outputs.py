"""Each delta rule's output kept as a trace of its own (`Engine(keep_rules=True)`, what the
Dagster assets show), against the naive oracle.

When one rule of a query runs at an epoch (a first load: only the last rule reads no empty old
state; or one relation of several changed), the query's change *is* that rule's: the epoch
writes it once, and both traces' batches name the same files (`EpochPass._batch_of`). These
tests hold the shared batch to every promise a batch of its own keeps: exact contents (read
back from the files, digests checked), `wcoj verify`, a correction of the epoch (the shared
folder retired only once no kept manifest names it), and the audit.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
from oracle import Oracle, naive_delta, stored

from wcoj_core.audit import AuditMode
from wcoj_core.audit_sample import audit_epoch
from wcoj_core.check.verify import verify_state
from wcoj_core.engine import Engine
from wcoj_core.meaning import relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.query.parse import parse_query
from wcoj_core.store.manifest import Batch
from wcoj_core.store.store import KEEP_MANIFESTS
from wcoj_core.traces import output_trace_name, rule_trace_name

TRIANGLES = builtin("triangles")
SPECS = relation_specs({"edge": 2}, undirected=["edge"])
Ups = list[tuple[tuple[int, ...], int]]


def table(arity: int, ups: Ups) -> pa.Table:
    cols = {f"c{i}": pa.array([t[i] for t, _ in ups], pa.int64()) for i in range(arity)}
    return pa.table({**cols, "diff": pa.array([d for _, d in ups], pa.int64())})


def ring_with_chords(n: int) -> Ups:
    """A ring of `n` vertices with chords two apart: a triangle at every vertex."""
    return [((i, (i + 1) % n), 1) for i in range(n)] + [((i, (i + 2) % n), 1) for i in range(n)]


def batch_at(engine: Engine, name: str, t: int) -> Batch:
    trace = engine.store.current().trace(name)
    assert trace is not None
    return next(b for b in trace.batches if b.time == t)


def test_a_first_loads_query_change_is_its_one_rules_batch(tmp_path: Path) -> None:
    root = str(tmp_path / "state")
    oracle = Oracle(TRIANGLES, SPECS)
    first = ring_with_chords(40)
    oracle.land(0, {"edge": first})
    engine = Engine(None, root, TRIANGLES, relations=SPECS, keep_rules=True)
    result = engine.apply(0, {"edge": table(2, first)})
    out, rule = output_trace_name("triangles"), rule_trace_name("triangles", 2)
    # Only the last rule ran on the empty state; the query's change is its change, one batch.
    assert set(result.rules["triangles"]) == {2}
    shared, own = batch_at(engine, out, 0), batch_at(engine, rule, 0)
    assert (shared.path, shared.files, shared.rows) == (own.path, own.files, own.rows)
    assert shared.figures is not None and shared.figures[1] == len(oracle.change(0))
    assert stored(engine, out) == oracle.change(0) == stored(engine, rule)
    assert result.rules["triangles"][2].rows == len(oracle.change(0))
    assert verify_state(engine.store).ok
    assert audit_epoch(engine, "triangles", 0, AuditMode.FULL).passed

    # Later epochs run every rule: their batches are their own, and everything stays exact.
    later = [((0, 5), 1), ((1, 2), -1), ((3, 7), 1)]
    oracle.land(1, {"edge": later})
    engine.apply(1, {"edge": table(2, later)})
    assert batch_at(engine, out, 1).path != batch_at(engine, rule, 1).path
    assert stored(engine, out) == oracle.output(1)
    rules: Counter[tuple[int, ...]] = Counter()
    for i in range(3):
        rules.update(stored(engine, rule_trace_name("triangles", i), 1))
    assert +rules == oracle.output(1)

    # A correction of epoch 0 replaces both traces' batch (the later epoch derived again); the
    # shared folder goes once no kept manifest names it, and nothing else is lost.
    corrected = [*first, ((0, 20), 1), ((20, 21), 1), ((0, 21), 1)]
    oracle.land(0, {"edge": corrected})
    engine.apply(0, {"edge": table(2, corrected)}, replace=True)
    assert stored(engine, out, 0) == oracle.change(0) == stored(engine, rule, 0)
    assert stored(engine, out) == oracle.output(1)
    old = Path(root) / shared.path
    assert old.is_dir()  # still named by a kept manifest
    for _ in range(KEEP_MANIFESTS):
        engine.apply(1, {"edge": table(2, later)}, replace=True)
    assert not old.exists()
    assert verify_state(engine.store).ok
    assert stored(engine, out) == oracle.output(1)


def test_one_relation_of_several_changing_shares_the_batch_of_its_one_rule(
    tmp_path: Path,
) -> None:
    """A warm epoch where one relation of a join changes: one rule runs; its change (summed,
    not distinct) is the query's, written once, exact against the oracle."""
    query = parse_query("p(a, b, c) :- r(a, b), s(b, c), r(c, a)")
    specs = relation_specs({"r": 2, "s": 2})
    r0 = [((1, 2), 1), ((3, 1), 1), ((2, 3), 1), ((4, 2), 2), ((3, 4), 1)]
    s0 = [((2, 3), 1), ((3, 1), 1), ((2, 4), 1)]
    s1 = [((2, 3), -1), ((1, 2), 3), ((3, 4), 1)]
    oracle = Oracle(query, specs)
    oracle.land(0, {"r": r0, "s": s0})
    oracle.land(1, {"s": s1})
    engine = Engine(None, str(tmp_path / "state"), query, relations=specs, keep_rules=True)
    engine.apply(0, {"r": table(2, r0), "s": table(2, s0)})
    result = engine.apply(1, {"s": table(2, s1)})
    name = next(iter(engine.queries))
    out = output_trace_name(name)
    assert set(result.rules[name]) == {1}  # only s's rule
    own = batch_at(engine, rule_trace_name(name, 1), 1)
    assert batch_at(engine, out, 1).path == own.path
    expected = naive_delta(query, oracle.state(0), oracle.state(1))
    change = Counter(stored(engine, out, 1))
    change.subtract(stored(engine, out, 0))
    assert Counter({k: v for k, v in change.items() if v}) == expected
    assert stored(engine, out) == oracle.output(1)
    assert verify_state(engine.store).ok
