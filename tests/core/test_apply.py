"""``wcoj apply``: one epoch at a time onto a kept state, against the naive oracle, without Spark.

Every test here runs the command in-process on local files, and an autouse fixture fails it if
anything asks for Spark: ``apply`` reads local files with pyarrow and applies the epoch on the
driver (`wcoj_core.engine.Engine`), and one subprocess test checks that no JVM is even launched
(a fake ``java`` that records being run) while the same harness does catch a run that needs
Spark. Results are compared with the naive oracle as exact multisets read back from the state's
batches.

What changed with the one-pass engine, and why the expectations moved:

* an ``--undirected`` relation is now a **set** (`wcoj_core.meaning.relation_specs`): a
  multiplicity of 2 is presence, inserting a present edge or deleting an absent one changes
  nothing and is reported as such (it used to leave a negative multiplicity); ``--bag`` keeps
  the old signed reading, and its negative-multiplicity warning is checked with it;
* the epoch argument is checked by `epoch_argument` (a whole number from 0 to 2**62) and a
  generator given as changes is refused as "not a file";
* a state records what it serves: another query under the same name, another meaning or another
  query name is refused with one line naming both;
* ``--replace`` replaces an epoch and derives the later ones again; ``--json`` carries the
  hydration figures (``metrics.hydration``) and ``spark`` (null: no Spark was started).

Issue 20 (SNAP-style files listing every edge in both directions) is checked end to end: each
epoch's ``apply`` count equals a from-scratch ``wcoj count`` of the graph at that epoch, with
deletions named in either direction, re-inserts of present edges and deletions of absent ones.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from oracle import fold_epoch, naive_eval, stored

from wcoj_core import cli
from wcoj_core.engine import Engine
from wcoj_core.meaning import relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.session import SparkStarter
from wcoj_core.store.store import Store
from wcoj_core.traces import output_trace_name

TRIANGLES = builtin("triangles")
SPECS = relation_specs({"edge": 2}, undirected=["edge"])
Rows = list[tuple[int, int, int]]
Graph = Counter[tuple[int, ...]]

EPOCHS: list[Rows] = [
    [(1, 2, 1), (2, 3, 1), (1, 3, 1), (3, 4, 1), (2, 4, 1)],
    [(1, 4, 1), (2, 3, -1), (4, 5, 2)],  # a multiplicity of 2 on a set: present
    [(2, 3, 1), (5, 1, 1), (1, 5, 1)],  # an edge named in both directions: once
]


@pytest.fixture(autouse=True)
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything asks for a Spark session."""

    def refuse(self: SparkStarter, reason: str) -> Any:
        raise AssertionError(f"Spark was asked for: {reason}")

    monkeypatch.setattr(SparkStarter, "__call__", refuse)


# --- files, commands and the oracle -------------------------------------------------------------


def write(path: Path, rows: Rows) -> str:
    path.write_text("c0,c1,diff\n" + "".join(f"{a},{b},{d}\n" for a, b, d in rows))
    return str(path)


def write_snap(path: Path, edges: Iterable[tuple[int, int]], *, both: bool = True) -> str:
    """A SNAP-style edge list: comment header, tab-separated ids, every undirected edge in both
    directions (as ca-GrQc, ca-HepPh and email-Enron ship) or once."""
    pairs = sorted({(min(a, b), max(a, b)) for a, b in edges if a != b})
    lines = [(a, b) for a, b in pairs] + ([(b, a) for a, b in pairs] if both else [])
    path.write_text(
        "# Undirected graph, saved in both directions\n"
        f"# Nodes: {len({v for e in pairs for v in e})} Edges: {len(lines)}\n"
        "# FromNodeId\tToNodeId\n" + "".join(f"{a}\t{b}\n" for a, b in sorted(lines))
    )
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], list[str]]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def apply(
    capsys: pytest.CaptureFixture[str], state: Path, epoch: int, changes: str, *extra: str
) -> tuple[int, list[str], list[str]]:
    return run(
        capsys,
        *["apply", "--query", "triangles", "--state", str(state), "--epoch", str(epoch)],
        *["--changes", f"edge={changes}", "--undirected", "edge", "--json", *extra],
    )


def count(capsys: pytest.CaptureFixture[str], path: str) -> int:
    """A from-scratch ``wcoj count`` of an undirected graph file."""
    code, out, err = run(
        capsys,
        "count",
        "--query",
        "triangles",
        "--input",
        f"edge={path}",
        "--undirected",
        "edge",
        "--json",
    )
    assert code == 0, err
    payload = json.loads(out[-1])
    assert payload["spark"] is None
    return payload["count"]


def fold(graph: Graph, rows: Rows, *, as_set: bool = True) -> Graph:
    """The oracle's undirected relation after an epoch of landed rows (a set by default)."""
    landed = [x for a, b, d in rows if a != b for x in (((a, b), d), ((b, a), d))]
    return fold_epoch(graph, landed, as_set=as_set)


def symmetric(edges: Iterable[tuple[int, int]]) -> Graph:
    pairs = {(min(a, b), max(a, b)) for a, b in edges if a != b}
    return Counter([*pairs, *((b, a) for a, b in pairs)])


def engine_of(state: Path) -> Engine:
    return Engine(None, str(state), TRIANGLES, relations=SPECS, create=False)


def manifests(state: Path) -> list[str]:
    return sorted(p.name for p in (state / "manifests").iterdir())


def one_line_error(err: list[str], *fragments: str) -> None:
    assert len(err) == 1 and err[0].startswith("wcoj: error: "), err
    for fragment in fragments:
        assert fragment in err[0], (fragment, err[0])


# --- epochs against the oracle ------------------------------------------------------------------


def test_epochs_applied_one_by_one_match_the_oracle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    graph: Graph = Counter()
    for t, rows in enumerate(EPOCHS):
        code, out, err = apply(capsys, state, t, write(tmp_path / f"e{t}.csv", rows))
        assert code == 0, err
        graph = fold(graph, rows)
        assert set(graph.values()) <= {1}, "an undirected relation is a set"
        expected = naive_eval(TRIANGLES, {"edge": graph})
        engine = engine_of(state)
        assert stored(engine, output_trace_name("triangles")) == expected, f"epoch {t}"
        assert stored(engine, "rel/edge") == graph, f"epoch {t}"
        payload = json.loads(out[-1])
        assert payload["epoch"] == t and payload["count"] == sum(expected.values())
        assert payload["rows"] == len(expected)
        assert payload["negative"] == {"edge": []}
        assert payload["spark"] is None
        assert payload["metrics"]["deployment"] == "driver"
        assert out[0].startswith(f"epoch {t}: changes ")


def test_an_applied_or_older_epoch_is_refused_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    for t in (0, 1):
        assert apply(capsys, state, t, write(tmp_path / f"e{t}.csv", EPOCHS[t]))[0] == 0
    before_files = manifests(state)
    before = stored(engine_of(state), output_trace_name("triangles"))
    assert before
    for t in (1, 0):  # the same epoch again, and an older one
        code, out, err = apply(capsys, state, t, write(tmp_path / "again.csv", EPOCHS[2]))
        assert code == 2 and out == []
        assert err == [
            f"wcoj: error: epoch {t} cannot be applied to {state}: epoch 1 is already applied "
            "(epochs are applied once, in increasing order)"
        ]
    assert manifests(state) == before_files
    assert stored(engine_of(state), output_trace_name("triangles")) == before


def test_changes_that_change_a_set_nothing_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On an undirected set, deleting an absent edge and re-inserting a present one change
    nothing: reported per direction, with examples, and nothing goes negative."""
    state = tmp_path / "state"
    assert apply(capsys, state, 0, write(tmp_path / "e0.csv", EPOCHS[0]))[0] == 0
    rows = [(7, 8, -1), (1, 2, -1), (3, 2, 1)]  # absent, present (deleted), present (again)
    code, out, err = apply(capsys, state, 1, write(tmp_path / "e1.csv", rows))
    assert code == 0, err
    (warning,) = err
    assert warning.startswith(
        "wcoj: warning: epoch 1: 4 change(s) to set 'edge' changed nothing (2 insert(s) of "
        "present tuples, 2 delete(s) of absent ones): "
    ), warning
    assert "(7, 8) -" in warning and "(8, 7) -" in warning and "(2, 3) +" in warning
    payload = json.loads(out[-1])
    assert payload["negative"] == {"edge": []}
    assert payload["relations"]["edge"] == {
        "landed": 6,
        "changed": 2,
        "self_loops_dropped": 0,
        "inserted_present": 2,
        "deleted_absent": 2,
        "negative": 0,
    }
    graph = fold(fold(Counter(), EPOCHS[0]), rows)
    assert stored(engine_of(state), "rel/edge") == graph
    assert payload["count"] == sum(naive_eval(TRIANGLES, {"edge": graph}).values())


def test_a_bag_keeps_deletions_of_absent_tuples_and_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--bag`` keeps the signed reading: a deletion of an absent edge leaves it held -1
    times (in both directions), warned about and listed in the JSON."""
    state = tmp_path / "state"
    code, _, err = apply(capsys, state, 0, write(tmp_path / "e0.csv", EPOCHS[0]), "--bag", "edge")
    assert code == 0, err
    code, out, err = apply(
        capsys, state, 1, write(tmp_path / "e1.csv", [(7, 8, -1), (1, 2, -1)]), "--bag", "edge"
    )
    assert code == 0
    (warning,) = err
    assert warning.startswith("wcoj: warning: epoch 1 deleted tuples relation 'edge' did not hold")
    assert "2 now have a negative multiplicity: (7, 8): -1, (8, 7): -1" in warning
    assert json.loads(out[-1])["negative"] == {"edge": [[[7, 8], -1], [[8, 7], -1]]}
    bags = relation_specs({"edge": 2}, undirected=["edge"], bags=["edge"])
    engine = Engine(None, str(state), TRIANGLES, relations=bags, create=False)
    expected = fold(
        fold(Counter(), EPOCHS[0], as_set=False), [(7, 8, -1), (1, 2, -1)], as_set=False
    )
    assert stored(engine, "rel/edge") == expected
    assert engine.figures("rel/edge")[2] == 2  # tuples held a negative number of times


# --- issue 20: a SNAP-style graph in both directions --------------------------------------------


def named(edge: tuple[int, int], rng: random.Random) -> list[tuple[int, int]]:
    """An undirected edge as a change file names it: one way, the other, or both."""
    a, b = edge
    return rng.choice([[(a, b)], [(b, a)], [(a, b), (b, a)]])


def issue20_epochs(
    seed: int, nodes: int = 11, edges: int = 26, epochs: int = 4
) -> tuple[set[tuple[int, int]], list[tuple[Rows, dict[str, int]]]]:
    """A random undirected graph, then epochs of changes naming edges in either direction:
    deletions of present edges, re-inserts of present ones, deletions of absent ones, inserts
    of new ones and a self-loop. Each epoch comes with the report the engine must give."""
    rng = random.Random(seed)
    universe = [(a, b) for a in range(nodes) for b in range(a + 1, nodes)]
    graph = set(rng.sample(universe, edges))
    initial = set(graph)
    out = []
    for _ in range(epochs):
        present = sorted(graph)
        absent = sorted(set(universe) - graph)
        deleted = rng.sample(present, 3)
        again = rng.sample(sorted(set(present) - set(deleted)), 2)
        gone = rng.sample(absent, 2)
        added = rng.sample(sorted(set(absent) - set(gone)), 3)
        rows: Rows = [(a, b, -1) for e in deleted for a, b in named(e, rng)]
        rows += [(a, b, 1) for e in again for a, b in named(e, rng)]
        rows += [(a, b, -1) for e in gone for a, b in named(e, rng)]
        rows += [(a, b, 1) for e in added for a, b in named(e, rng)]
        loop = rng.randrange(nodes)
        rows.append((loop, loop, 1))
        rng.shuffle(rows)
        graph = (graph - set(deleted)) | set(added)
        report = {
            "changed": 2 * (len(deleted) + len(added)),
            "self_loops_dropped": 1,
            "inserted_present": 2 * len(again),
            "deleted_absent": 2 * len(gone),
            "negative": 0,
        }
        out.append((rows, report))
    return initial, out


def test_issue_20_apply_epochs_equal_counts_from_scratch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Epoch 0 is a SNAP file listing every edge in both directions; each later epoch deletes
    edges named in either direction, re-inserts present ones, deletes absent ones. After each,
    the count ``apply`` reports equals a from-scratch ``wcoj count`` of the graph as a set at
    that epoch (written in both directions, and once), and the stored output equals the
    oracle's. Before the relation was a set, the both-directions file counted every triangle
    8 times and the deletions left negative multiplicities."""
    initial, epochs = issue20_epochs(seed=20)
    state = tmp_path / "state"
    snap = write_snap(tmp_path / "graph-0.txt", initial)
    code, out, err = apply(capsys, state, 0, snap)
    assert code == 0, err
    graph = symmetric(initial)
    expected = naive_eval(TRIANGLES, {"edge": graph})
    assert sum(expected.values()) >= 3, "pick a seed with triangles"
    payload = json.loads(out[-1])
    assert payload["count"] == sum(expected.values()) == count(capsys, snap)
    assert (
        count(capsys, write_snap(tmp_path / "once-0.txt", initial, both=False)) == payload["count"]
    )
    assert payload["relations"]["edge"]["inserted_present"] == 0
    edges = set(initial)
    counts = [payload["count"]]
    for t, (rows, report) in enumerate(epochs, start=1):
        code, out, err = apply(capsys, state, t, write(tmp_path / f"e{t}.csv", rows))
        assert code == 0, err
        assert all(line.startswith("wcoj: warning: ") for line in err), err
        payload = json.loads(out[-1])
        assert {k: payload["relations"]["edge"][k] for k in report} == report, f"epoch {t}"
        graph = fold(graph, rows)
        edges = {(a, b) for a, b in graph if a < b}
        expected = naive_eval(TRIANGLES, {"edge": graph})
        fresh = count(capsys, write_snap(tmp_path / f"graph-{t}.txt", edges, both=t % 2 == 0))
        assert payload["count"] == fresh == sum(expected.values()), f"epoch {t}"
        assert stored(engine_of(state), output_trace_name("triangles")) == expected, f"epoch {t}"
        counts.append(payload["count"])
    assert len(set(counts)) > 1, "the epochs should change the count"
    engine = engine_of(state)
    assert [engine.count("triangles", t) for t in range(len(counts))] == counts


# --- replacing an epoch -------------------------------------------------------------------------

REPLACED: list[Rows] = [
    [(1, 2, 1), (2, 3, 1), (1, 3, 1), (3, 4, 1), (2, 4, 1)],  # 123, 234
    [(2, 3, -1), (1, 4, 1)],  # 134, 124
    [(4, 5, 1), (5, 1, 1)],  # + 145
    [(3, 1, -1)],  # - 134
]
CORRECTED: Rows = [(4, 1, 1)]  # epoch 1 without the deletion of 2-3


def test_replace_derives_the_later_epochs_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    files = [write(tmp_path / f"e{t}.csv", rows) for t, rows in enumerate(REPLACED)]
    for t, path in enumerate(files):
        assert apply(capsys, state, t, path)[0] == 0

    def oracle(epochs: Sequence[Rows]) -> list[Graph]:
        graph: Graph = Counter()
        outputs = []
        for rows in epochs:
            graph = fold(graph, rows)
            outputs.append(naive_eval(TRIANGLES, {"edge": graph}))
        return outputs

    original = oracle(REPLACED)
    corrected = oracle([REPLACED[0], CORRECTED, *REPLACED[2:]])
    assert [sum(o.values()) for o in original] == [2, 2, 3, 2]
    assert [sum(o.values()) for o in corrected] == [2, 4, 5, 3]

    code, out, err = apply(capsys, state, 1, write(tmp_path / "fix.csv", CORRECTED), "--replace")
    assert code == 0, err
    payload = json.loads(out[-1])
    assert payload["epoch"] == 1 and payload["count"] == 4
    assert payload["rebuilt"] == [2, 3]
    assert "derived again: epochs 2, 3 (stale after a correction)" in out
    engine = engine_of(state)
    assert engine.stale() == []
    assert engine.epoch == 3
    for t, expected in enumerate(corrected):
        assert stored(engine, output_trace_name("triangles"), t) == expected, f"epoch {t}"
        assert engine.count("triangles", t) == sum(expected.values()), f"epoch {t}"

    # A re-run with the same changes makes nothing stale and changes no count.
    code, out, err = apply(capsys, state, 2, files[2], "--replace")
    assert code == 0, err
    assert json.loads(out[-1])["rebuilt"] == []
    engine = engine_of(state)
    assert [engine.count("triangles", t) for t in range(4)] == [2, 4, 5, 3]
    assert stored(engine, output_trace_name("triangles")) == corrected[-1]


def test_a_different_query_or_meaning_is_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    changes = write(tmp_path / "e0.csv", EPOCHS[0])
    assert apply(capsys, state, 0, changes)[0] == 0
    before = manifests(state)
    reordered = "triangles(a, b, c) :- edge(a, b), edge(b, c), edge(a, c)"
    base = ["apply", "--state", str(state), "--epoch", "1", "--changes", f"edge={changes}"]
    refusals = [
        (
            [*base, "--query", reordered, "--undirected", "edge"],
            (
                "maintains query 'triangles' as `triangles(a, b, c) :- edge(a, b), edge(b, c), "
                "edge(a, c), a < b, b < c`",
                f"this run gives `{reordered}`",
            ),
        ),
        (
            [*base, "--query", "triangles", "--undirected", "edge", "--bag", "edge"],
            (
                "holds relation 'edge' as an undirected set of arity 2",
                "this run declares it an undirected bag of arity 2",
            ),
        ),
        (
            [*base, "--query", "triangles"],
            ("holds relation 'edge' as an undirected set", "this run declares it a bag"),
        ),
        (
            [*base, "--query", "2-paths", "--undirected", "edge"],
            ("does not keep query paths2", "attach it first (wcoj attach"),
        ),
    ]
    for argv, fragments in refusals:
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == [], argv
        one_line_error(err, str(state), *fragments)
    assert manifests(state) == before
    # The same query spelled otherwise (the built-in's text, laid out freely) is the same query.
    respelled = "triangles(a,b,c) :-\n  edge(a,b), edge(b,c),\n  edge(a,c), a<b, b<c"
    code, _, err = run(capsys, *base, "--query", respelled, "--undirected", "edge")
    assert code == 0, err


# --- without Spark ------------------------------------------------------------------------------


def test_json_carries_hydration_and_no_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The usual epoch maps the previous epoch's arrangement files and reads no batch; a
    replaced epoch reads the batches its index holds beyond it."""
    state = tmp_path / "state"
    code, out, _ = apply(capsys, state, 0, write(tmp_path / "e0.csv", EPOCHS[0]))
    first = json.loads(out[-1])
    assert first["spark"] is None
    hydration = first["metrics"]["hydration"]
    assert set(hydration) >= {"seconds", "mapped_bytes", "read_bytes"}
    assert hydration["mapped_bytes"] == 0 and hydration["read_bytes"] == 0, "a new state"

    previous = Store.open(state, create=False).current()
    code, out, err = apply(capsys, state, 1, write(tmp_path / "e1.csv", EPOCHS[1]))
    assert code == 0, err
    second = json.loads(out[-1])
    hydration = second["metrics"]["hydration"]
    indexed = engine_of(state).served.indexed()
    segment_bytes = sum(
        {  # each file once (an undirected relation's views and counts share theirs)
            s.path: sum(f.size for f in s.files.values())
            for name in indexed
            for s in previous.traces[name].index.segments
        }.values()
    )
    assert hydration["mapped_bytes"] == segment_bytes > 0
    assert hydration["read_bytes"] == 0
    assert isinstance(hydration["seconds"], float) and hydration["seconds"] >= 0
    assert second["spark"] is None

    code, out, err = apply(capsys, state, 1, write(tmp_path / "e1b.csv", EPOCHS[2]), "--replace")
    assert code == 0, err
    assert json.loads(out[-1])["metrics"]["hydration"]["read_bytes"] > 0


def test_a_missing_arrangement_file_is_rebuilt_reported_and_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    for t in (0, 1):
        assert apply(capsys, state, t, write(tmp_path / f"e{t}.csv", EPOCHS[t]))[0] == 0
    victim = next(p for p in (state / "arrangements").rglob("*.seg") if "rel-edge" in str(p))
    victim.unlink()
    code, out, err = apply(capsys, state, 2, write(tmp_path / "e2.csv", EPOCHS[2]))
    assert code == 0, err
    graph: Graph = Counter()
    for rows in EPOCHS:
        graph = fold(graph, rows)
    payload = json.loads(out[-1])
    assert payload["count"] == sum(naive_eval(TRIANGLES, {"edge": graph}).values())
    hydration = payload["metrics"]["hydration"]
    assert hydration["read_bytes"] > 0  # holds today: the trace was rebuilt from its batches
    assert any(r.startswith("rel/edge") for r in hydration["rebuilt"]), hydration
    assert any("rel/edge" in line and "rebuilt" in line for line in err), err


def _fake_java(folder: Path) -> tuple[dict[str, str], Path]:
    """An environment whose ``java`` only records that it was run (and fails)."""
    bin_dir = folder / "java" / "bin"
    bin_dir.mkdir(parents=True)
    log = folder / "java-runs.log"
    java = bin_dir / "java"
    java.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexit 1\n')
    java.chmod(0o755)
    env = {
        **os.environ,
        "JAVA_HOME": str(folder / "java"),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }
    env.pop("WCOJ_DEBUG", None)
    return env, log


def test_apply_on_local_files_launches_no_jvm(tmp_path: Path) -> None:
    """In a fresh process whose only ``java`` records being run: CSV, SNAP text and Parquet
    changes applied epoch by epoch run no ``java`` at all and say nothing about Spark, while
    ``--deploy executors`` on the same state does run it, after announcing why."""
    env, log = _fake_java(tmp_path)
    state = tmp_path / "state"
    pq.write_table(pa.table({"c0": [2, 5], "c1": [3, 1], "diff": [1, 1]}), tmp_path / "e2.parquet")
    changes = [
        write_snap(tmp_path / "e0.txt", [(a, b) for a, b, _ in EPOCHS[0]]),
        write(tmp_path / "e1.csv", EPOCHS[1]),
        str(tmp_path / "e2.parquet"),
    ]

    def wcoj(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "wcoj_core.cli", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )

    graph: Graph = Counter()
    for t, path in enumerate(changes):
        done = wcoj(
            *["apply", "--query", "triangles", "--state", str(state), "--epoch", str(t)],
            *["--changes", f"edge={path}", "--undirected", "edge", "--json"],
        )
        assert done.returncode == 0, done.stderr
        assert "Spark" not in done.stderr, done.stderr
        assert not log.exists(), f"java ran: {log.read_text()}"
        payload = json.loads(done.stdout.splitlines()[-1])
        assert payload["spark"] is None
        graph = fold(graph, EPOCHS[t] if t < 2 else [(2, 3, 1), (5, 1, 1)])
        assert payload["count"] == sum(naive_eval(TRIANGLES, {"edge": graph}).values())

    # The control: work that needs Spark does run java here, and says why first.
    done = wcoj(
        *["apply", "--query", "triangles", "--state", str(state), "--epoch", "3"],
        *["--changes", f"edge={changes[1]}", "--undirected", "edge", "--deploy", "executors"],
    )
    assert done.returncode == 1
    assert log.exists(), "the fake java should have been run"
    lines = done.stderr.splitlines()
    assert any(
        line.startswith("starting Spark (local[*]): the kernel runs in Spark's executors")
        for line in lines
    ), lines
    assert lines[-1].startswith("wcoj: error: spark failed: ")
    assert engine_of(state).epoch == 2, "the failed epoch applied nothing"


# --- arguments ----------------------------------------------------------------------------------


def test_apply_arguments_are_checked_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each mistake is one line, exit 2, with no state directory created (and the autouse
    fixture fails the test if Spark is asked for)."""
    good = write(tmp_path / "e.csv", EPOCHS[0])
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n3,x\n")
    state = tmp_path / "s"
    base = ["apply", "--query", "triangles", "--state", str(state)]
    for argv, fragment in [
        ([*base, "--epoch", "-1", "--changes", f"edge={good}"], "--epoch '-1': give a whole"),
        ([*base, "--epoch", "1.5", "--changes", f"edge={good}"], "--epoch '1.5': give a whole"),
        (
            [*base, "--epoch", "0", "--changes", f"nope={good}"],
            "which query triangles does not use",
        ),
        ([*base, "--epoch", "0", "--changes", "edge=missing.csv"], "no such file"),
        ([*base, "--epoch", "0", "--changes", "edge=rmat:scale=3"], "not a generator"),
        (
            [*base, "--epoch", "0", "--changes", f"edge={good}", "--changes", f"edge={good}"],
            "twice",
        ),
        ([*base, "--epoch", "0", "--changes", "edge"], "not of the form REL=PATH"),
        ([*base, "--epoch", "0", "--changes", f"edge={bad}"], "line 3, column 2"),
        (
            [*base, "--epoch", "0", "--changes", f"edge={good}", "--set", "edge", "--bag", "edge"],
            "declared both a set and a bag",
        ),
        (
            [*base, "--epoch", "0", "--changes", f"edge={good}", "--undirected", "friends"],
            "undirected relation 'friends' is read by no query",
        ),
        (
            [
                "apply",
                "--query",
                "p(a) :- t(a, b, c)",
                "--state",
                str(state),
                "--epoch",
                "0",
                "--changes",
                f"t={good}",
                "--undirected",
                "t",
            ],
            "only a binary relation can be undirected",
        ),
        ([*base[:-1], "", "--epoch", "0", "--changes", f"edge={good}"], "--state is empty"),
    ]:
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == [], argv
        one_line_error(err, fragment)
    assert not state.exists()


def test_a_local_apply_never_imports_pandas(tmp_path: Path) -> None:
    """The ``wcoj`` program applying CSV, SNAP text and Parquet changes imports neither pandas
    (pyarrow's shim would: a third of a second, and a Ctrl-C during it was lost) nor pyspark,
    and its counts match the oracle."""
    pq.write_table(pa.table({"c0": [2, 5], "c1": [3, 1], "diff": [1, 1]}), tmp_path / "e2.parquet")
    changes = [
        write_snap(tmp_path / "e0.txt", [(a, b) for a, b, _ in EPOCHS[0]]),
        write(tmp_path / "e1.csv", EPOCHS[1]),
        str(tmp_path / "e2.parquet"),
    ]
    script = (
        "import json, sys\n"
        "from wcoj_core.cli import main\n"
        "code = main()\n"
        "print(json.dumps({m: m in sys.modules for m in ('pandas', 'pyspark')}))\n"
        "sys.exit(code)\n"
    )
    graph: Graph = Counter()
    for t, path in enumerate(changes):
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                script,
                *["apply", "--query", "triangles", "--state", str(tmp_path / "state")],
                *["--epoch", str(t), "--changes", f"edge={path}", "--undirected", "edge"],
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        *lines, imported = done.stdout.splitlines()
        assert json.loads(imported) == {"pandas": False, "pyspark": False}, t
        graph = fold(graph, EPOCHS[t] if t < 2 else [(2, 3, 1), (5, 1, 1)])
        assert json.loads(lines[-1])["count"] == sum(
            naive_eval(TRIANGLES, {"edge": graph}).values()
        )
