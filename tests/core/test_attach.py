"""Queries attached to a kept state and detached from it (`wcoj_core.attach`, ``wcoj attach``,
``wcoj detach``): the attached output equals the oracle's as of the epoch it was attached at,
then every epoch's change and output with deletions, bags and corrections before it; the
relation's arrangements are not copied; detaching drops only the query's own traces. No JVM.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import Oracle, naive_eval, signed_difference, stored

from wcoj_core.audit import AuditMode
from wcoj_core.audit_sample import audit_epoch
from wcoj_core.cli import main
from wcoj_core.engine import Engine
from wcoj_core.errors import QueryError, StateError
from wcoj_core.meaning import Meaning, RelationSpec, relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.query.parse import parse_query
from wcoj_core.traces import output_trace_name

Ups = list[tuple[tuple[int, ...], int]]
ATTACHED = [
    builtin("4-cliques"),
    builtin("triangles-per-vertex"),
    parse_query("wedge(a, c) :- edge(a, b), edge(b, c), a != c"),
    parse_query("loops(a, count()) :- edge(a, b), edge(b, a)"),
]


def table(ups: Ups) -> pa.Table:
    return pa.table(
        {
            "c0": pa.array([t[0] for t, _ in ups], pa.int64()),
            "c1": pa.array([t[1] for t, _ in ups], pa.int64()),
            "diff": pa.array([d for _, d in ups], pa.int64()),
        }
    )


def epoch_ups(rng: random.Random, present: list[tuple[int, int]], bag: bool) -> Ups:
    ups: Ups = []
    for _ in range(rng.randrange(15, 60)):
        edge = (rng.randrange(12), rng.randrange(12))
        ups.append((edge, rng.choice([1, 1, 2, -1]) if bag else 1))
        present.append(edge)
    return ups + [(e, -1) for e in rng.sample(present, k=min(len(present) // 5, 12))]


def specs_of(meaning: str) -> dict[str, RelationSpec]:
    if meaning == "undirected":
        return relation_specs({"edge": 2}, undirected=["edge"])
    return {"edge": RelationSpec("edge", 2, Meaning(meaning))}


@settings(max_examples=8, deadline=None)
@given(
    data=st.data(),
    meaning=st.sampled_from(["undirected", "set", "bag"]),
    kept=st.sampled_from(["triangles", "degrees"]),
    query=st.sampled_from(ATTACHED),
)
def test_an_attached_query_is_exact_from_its_epoch_on(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, meaning: str, kept: str, query
) -> None:
    """A state keeping `kept` for a few epochs; `query` attached at the latest (its counts
    arrangements made from the relation's batches when the state keeps none: `degrees`);
    then epochs with deletions, and a correction of an epoch before the one it was attached
    at: its output as of every epoch from then on, and each later change, equal the oracle's."""
    specs = specs_of(meaning)
    rng = random.Random(data.draw(st.integers(0, 2**16), label="seed"))
    root = str(tmp_path_factory.mktemp("attach"))
    oracle = Oracle(query, specs)
    present: list[tuple[int, int]] = []
    before = data.draw(st.integers(1, 3), label="epochs before")
    for t in range(before):
        ups = epoch_ups(rng, present, meaning == "bag")
        oracle.land(t, {"edge": ups})
        Engine(None, root, builtin(kept), relations=specs).apply(t, {"edge": table(ups)})
    since = before - 1
    engine = Engine(None, root, [builtin(kept), query], relations=specs)
    done = engine.attach()
    assert (done.queries, done.epoch) == ((query.name,), since)
    assert stored(engine, output_trace_name(query.name)) == oracle.output(since)
    for t in range(before, before + 3):
        ups = epoch_ups(rng, present, meaning == "bag")
        oracle.land(t, {"edge": ups})
        result = Engine(None, root, builtin(kept), relations=specs).apply(t, {"edge": table(ups)})
        change = engine.change(query.name, t)
        cols = [c for c in change.column_names if c != "diff"]
        rows = change.to_pylist()
        assert Counter({tuple(r[c] for c in cols): r["diff"] for r in rows}) == oracle.change(t)
        got = stored(engine, output_trace_name(query.name), t)
        assert got == oracle.output(t), t
        assert result.count(query.name) == sum(oracle.output(t).values())
    # A correction of an epoch before the attach: the later epochs are derived again, the
    # attached query's whole output made again at the epoch it was attached at.
    ups = epoch_ups(rng, present, meaning == "bag")
    oracle.land(0, {"edge": ups})
    fixer = Engine(None, root, builtin(kept), relations=specs)
    fixer.apply(0, {"edge": table(ups)}, replace=True)
    fixer.refresh()
    assert fixer.stale() == []
    last = before + 2
    for t in range(since, last + 1):
        assert stored(engine, output_trace_name(query.name), t) == oracle.output(t), t
    assert stored(engine, output_trace_name(query.name), last) == naive_eval(
        query, oracle.state(last)
    )


def small_state(root: Path, epochs: int = 2, kept: str = "triangles") -> Oracle:
    specs = specs_of("undirected")
    oracle = Oracle(builtin(kept), specs)
    rng = random.Random(3)
    present: list[tuple[int, int]] = []
    for t in range(epochs):
        ups = epoch_ups(rng, present, False)
        oracle.land(t, {"edge": ups})
        Engine(None, str(root), builtin(kept), relations=specs).apply(t, {"edge": table(ups)})
    return oracle


def test_attaching_copies_no_arrangement_and_detaching_drops_only_its_own(tmp_path: Path) -> None:
    """Attaching 4-cliques to a triangles state adds its output and the one counts arrangement
    it reads that triangles does not (the relation's size): every other trace — the relation's
    batches and segments, the shared counts — is the same record. Detaching it drops exactly
    those; triangles goes on, exact."""
    root = tmp_path / "state"
    oracle = small_state(root)
    specs = oracle.specs
    engine = Engine(None, str(root), [builtin("triangles"), builtin("4-cliques")], relations=specs)
    before = engine.store.current()
    engine.attach()
    after = engine.store.current()
    assert sorted(set(after.traces) - set(before.traces)) == ["counts/edge/", "out/cliques4"]
    for name, trace in before.traces.items():
        assert after.traces[name] == trace, name
    assert after.plan is not None and after.plan.queries["cliques4"].since == 1
    with pytest.raises(StateError, match=r"attached to .* at epoch 1: its output before it"):
        engine.output("cliques4", time=0)
    with pytest.raises(QueryError, match="keeps query 'cliques4' already"):
        engine.attach(["cliques4"])
    other = {**specs, **relation_specs({"other": 2})}
    stranger = Engine(
        None, str(root), [builtin("triangles"), parse_query("q(a) :- other(a, b)")], relations=other
    )
    with pytest.raises(QueryError, match=r"reads other, which the state .* does not hold"):
        stranger.attach(["q"])
    engine.detach(["cliques4"])
    assert engine.store.current().traces == before.traces
    assert sorted(engine.queries) == ["triangles"]
    rng = random.Random(11)
    ups = epoch_ups(rng, [], False)
    oracle.land(2, {"edge": ups})
    engine.apply(2, {"edge": table(ups)})
    assert stored(engine, "out/triangles") == oracle.output(2)
    with pytest.raises(StateError, match="a state keeps at least one"):
        engine.detach(["triangles"])


def test_an_engine_attaches_a_new_query_when_asked_to(tmp_path: Path) -> None:
    """`auto_attach` (what the Dagster resource uses): a query added to an engine over a state
    holding epochs is attached before the next epoch, which maintains it."""
    root = tmp_path / "state"
    oracle = small_state(root)
    tri = builtin("triangles-per-vertex")
    engine = Engine(
        None, str(root), [builtin("triangles"), tri], relations=oracle.specs, auto_attach=True
    )
    rng = random.Random(4)
    ups = epoch_ups(rng, [], False)
    oracle.land(2, {"edge": ups})
    engine.apply(2, {"edge": table(ups)})
    assert stored(engine, "out/triangles_per_vertex", 1) == naive_eval(tri, oracle.state(1))
    assert stored(engine, "out/triangles_per_vertex") == naive_eval(tri, oracle.state(2))
    want = signed_difference(naive_eval(tri, oracle.state(2)), naive_eval(tri, oracle.state(1)))
    got = Counter({(r["c0"],): r["diff"] for r in engine.change(tri.name, 2).to_pylist()})
    assert got == want
    # The audit recomputes, by binary joins, the whole output at the epoch it was attached at
    # and the change after it; before it there is nothing to audit.
    for t in (1, 2):
        for mode in (AuditMode.FULL, AuditMode.SAMPLED):
            audit = audit_epoch(engine, tri.name, t, mode)
            assert audit.passed and audit.expected_rows == audit.actual_rows > 0, (t, audit)
    with pytest.raises(StateError, match=r"was attached to .* at epoch 1: it has no change"):
        audit_epoch(engine, tri.name, 0)


def test_the_dagster_delta_rule_check_of_an_attached_query_before_it_says_so(
    tmp_path: Path,
) -> None:
    """The pipeline's delta-rule check at an epoch before a query was attached passes as not
    evaluated, saying why; at and after it, it audits (it raised a TypeError before)."""
    from wcoj_assets import checks

    root = tmp_path / "state"
    oracle = small_state(root)
    tri = builtin("triangles-per-vertex")
    engine = Engine(
        None, str(root), [builtin("triangles"), tri], relations=oracle.specs, auto_attach=True
    )
    ups = epoch_ups(random.Random(4), [], False)
    oracle.land(2, {"edge": ups})
    engine.apply(2, {"edge": table(ups)})
    before = checks.delta_rules(engine, tri.name, 0)
    assert before.passed and before.metadata["checked"] is False
    assert before.description == f"not evaluated: {tri.name} was attached at epoch 1: " + (
        "the state keeps no change of it before"
    )
    after = checks.delta_rules(engine, tri.name, 2)
    assert after.passed and "not evaluated" not in (after.description or "")


def test_wcoj_attach_and_detach(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``wcoj attach`` reads the relations as the state declares them; ``wcoj apply`` of the
    state's first query then maintains both; ``wcoj detach`` removes one; mistakes are one
    line."""
    root = tmp_path / "state"
    oracle = small_state(root)
    capsys.readouterr()
    assert main(["attach", str(root), "--query", "4-cycles", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cycles = builtin("4-cycles")
    want = naive_eval(cycles, oracle.state(1))
    assert (doc["query"], doc["epoch"], doc["rows"]) == ("cycles4", 1, len(want))
    changes = tmp_path / "e2.csv"
    changes.write_text("src,dst,diff\n1,2,1\n3,4,1\n5,1,-1\n")
    oracle.land(2, {"edge": [((1, 2), 1), ((3, 4), 1), ((5, 1), -1)]})
    argv = ["apply", "--query", "triangles", "--state", str(root), "--epoch", "2"]
    assert main([*argv, "--changes", f"edge={changes}", "--undirected", "edge"]) == 0
    engine = Engine(None, str(root), cycles, relations=oracle.specs)
    assert stored(engine, "out/cycles4") == naive_eval(cycles, oracle.state(2))
    assert main(["status", str(root), "--json"]) == 0
    status = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status["queries"]["cycles4"]["since"] == 1
    for argv, fragment in [
        (["attach", str(root), "--query", "4-cycles"], "keeps query 'cycles4' already"),
        (["attach", str(root), "--query", "q(a) :- other(a, b)"], "reads other, which the state"),
        (["detach", str(root), "--query", "nothing"], "keeps no query 'nothing'"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and fragment in err[0], err
    assert main(["detach", str(root), "--query", "4-cycles"]) == 0
    assert "out/cycles4" not in engine.store.current().traces
