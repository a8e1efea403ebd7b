"""``wcoj status``: what a state holds, from its manifest alone, with exact expected values.

A small undirected graph goes through three epochs of ``wcoj apply`` (in-process): the status
names the query and its text, the relation's meaning, the epochs held, the count at each of
them (checked against the naive oracle too), every trace's rows and tuples, its bytes (checked
against the files on disk) and the last commit. A state with two queries, a compaction frontier
and a stale epoch (an epoch replaced without deriving its successors) says so. A fresh process
imports neither pyarrow nor pandas nor pyspark to say it. No JVM starts here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from oracle import fold_epoch, naive_eval

from wcoj_core import cli
from wcoj_core.engine import Engine
from wcoj_core.meaning import relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.query.parse import parse_query
from wcoj_core.store.names import trace_dir

TRIANGLES = builtin("triangles")
# Three epochs of an undirected edge list: (a, b, diff).
EPOCHS = [
    [(1, 2, 1), (2, 3, 1), (1, 3, 1), (3, 4, 1), (2, 4, 1)],
    [(1, 4, 1), (2, 3, -1)],
    [(3, 2, 1)],  # re-inserted in the other direction
]


def status(state: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], dict[str, Any]]:
    """``wcoj status STATE --json``: its lines for people and its JSON document."""
    assert cli.main(["status", str(state), "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    return out[:-1], json.loads(out[-1])


def applied(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    state = tmp_path / "state"
    for t, rows in enumerate(EPOCHS):
        changes = tmp_path / f"changes-{t}.csv"
        changes.write_text("c0,c1,diff\n" + "".join(f"{a},{b},{d}\n" for a, b, d in rows))
        argv = ["apply", "--query", "triangles", "--state", str(state), "--epoch", str(t)]
        assert cli.main([*argv, "--changes", f"edge={changes}", "--undirected", "edge"]) == 0
    capsys.readouterr()
    return state


def listed(state: Path, manifest: dict[str, Any], trace: str | None = None) -> set[Path]:
    """Every file the manifest lists (for `trace`: in its own folders — an undirected
    relation's reversed view and a second counts trace list segments another view or trace
    holds, once on disk), each once."""
    out: set[Path] = set()
    for name, t in manifest["traces"].items():
        if trace is not None and name != trace:
            continue
        own = f"arrangements/{trace_dir(name)}/"
        paths = [state / b["path"] for b in t["batches"]]
        segs = (t["index"] or {"segments": []})["segments"]
        paths += [state / s["path"] for s in segs if s["path"].startswith(own)]
        out |= {
            f for p in paths for f in (p.iterdir() if p.is_dir() else [p] if p.exists() else [])
        }
    return out


def on_disk(state: Path, manifest: dict[str, Any], trace: str | None = None) -> int:
    """The bytes of `listed` files, read from disk."""
    return sum(f.stat().st_size for f in listed(state, manifest, trace))


def test_three_epochs_of_an_undirected_graph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = applied(tmp_path, capsys)
    lines, doc = status(state, capsys)

    # The oracle's counts: the set of undirected edges after each epoch, triangles over it.
    graph: Counter[tuple[int, ...]] = Counter()
    counts = []
    for rows in EPOCHS:
        landed = [x for a, b, d in rows for x in (((a, b), d), ((b, a), d))]
        graph = fold_epoch(graph, landed, as_set=True)
        counts.append(sum(naive_eval(TRIANGLES, {"edge": graph}).values()))
    assert counts == [2, 2, 4]

    manifest_file = state / "manifests" / "0000000003.json"
    manifest = json.loads(manifest_file.read_text())
    assert doc["command"] == "status" and doc["state"] == str(state)
    assert (doc["generation"], doc["epoch"], doc["epochs"]) == (3, 2, [0, 1, 2])
    assert (doc["frontier"], doc["stale"]) == (None, [])
    committed = datetime.fromtimestamp(manifest_file.stat().st_mtime, UTC)
    assert doc["committed"] == committed.isoformat(timespec="seconds").replace("+00:00", "Z")
    assert doc["relations"] == {"edge": {"arity": 2, "meaning": "set", "undirected": True}}
    assert doc["queries"] == {
        "triangles": {
            "text": "triangles(a, b, c) :- edge(a, b), edge(b, c), edge(a, c), a < b, b < c",
            "relations": ["edge"],
            "since": None,
            "count": 4,
            "counts": [{"epoch": t, "count": c} for t, c in enumerate(counts)],
        }
    }
    # Rows: every stored update (the relation's edges in both directions, the output's
    # changes: 2 triangles, then 2 out and 2 in, then 2 in); tuples: distinct ones now.
    traces = doc["traces"]
    assert {name: (t["rows"], t["tuples"], t["batches"]) for name, t in traces.items()} == {
        "counts/edge/0": (10, 4, 3),
        "counts/edge/1": (10, 4, 3),
        "out/triangles": (8, 4, 3),
        "rel/edge": (16, 12, 3),
    }
    for name, t in traces.items():
        assert t["bytes"] == on_disk(state, manifest, name) > 0, name
        index = manifest["traces"][name]["index"]
        assert t["segments"] == (len(index["segments"]) if index else 0), name

    when = doc["committed"].replace("T", " ").replace("Z", " UTC")
    assert lines[:10] == [
        f"state {state}",
        f"last commit: generation 3, {when}",
        "epochs held: 0-2 (3), latest 2; compaction frontier: none; stale: none",
        "relation edge: arity 2, an undirected set",
        "query triangles: triangles(a, b, c) :- edge(a, b), edge(b, c), edge(a, c), a < b, b < c",
        "  count 4 at epoch 2",
        "  epoch  count  change",
        "      0      2      +2",
        "      1      2      +0",
        "      2      4      +2",
    ]
    assert lines[10].split() == ["trace", "rows", "tuples", "bytes", "batches", "segments"]
    assert lines[13].split()[:3] == ["out/triangles", "8", "4"]
    total = sum(t["bytes"] for t in traces.values())
    assert total == on_disk(state, manifest)  # each file once: the state's files on disk
    assert lines[-1].split()[:3] == ["total", "44", f"{total:,}"]


def table(rows: list[tuple[int, int, int]]) -> pa.Table:
    return pa.table(
        {
            "c0": pa.array([a for a, _, _ in rows], pa.int64()),
            "c1": pa.array([b for _, b, _ in rows], pa.int64()),
            "diff": pa.array([d for _, _, d in rows], pa.int64()),
        }
    )


def test_two_queries_a_frontier_and_a_stale_epoch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Epochs 0-3 of a bag, compacted up to 1, then epoch 2 replaced without deriving epoch 3
    again (`Engine.apply` alone, as an epoch-addressed Dagster step does): epoch 3 is stale."""
    paths = parse_query("paths(a, c) :- e(a, b), e(b, c)")
    loops = parse_query("loops(a) :- e(a, a)")
    specs = relation_specs({"e": 2})  # a bag
    engine = Engine(None, str(tmp_path / "state"), [paths, loops], relations=specs)
    epochs = [
        [(1, 2, 1), (2, 3, 1)],
        [(2, 3, 1), (3, 3, 1)],
        [(3, 4, 1)],
        [(1, 2, -1)],
    ]
    for t, rows in enumerate(epochs):
        engine.apply(t, {"e": table(rows)})
    engine.compact(1)
    engine.apply(2, {"e": table([(3, 1, 2)])}, replace=True)

    lines, doc = status(tmp_path / "state", capsys)
    assert (doc["epoch"], doc["epochs"], doc["frontier"], doc["stale"]) == (3, [1, 2, 3], 1, [3])
    assert doc["relations"] == {"e": {"arity": 2, "meaning": "bag", "undirected": False}}
    # paths: e as a bag {12: 1, 23: 2, 33: 1} at 1; + {31: 2} at 2; epoch 3 as first derived
    # from the first epoch 2 ({23: 2, 33: 1, 34: 1}), not yet again from the corrected one.
    expected = {"paths": [(1, 5), (2, 13), (3, 6)], "loops": [(1, 1), (2, 1), (3, 1)]}
    for name, pairs in expected.items():
        q = doc["queries"][name]
        assert [(c["epoch"], c["count"]) for c in q["counts"]] == pairs, name
        assert q["count"] == pairs[-1][1]
    assert "epochs held: 1-3 (3), latest 3; compaction frontier: 1; stale: 3" in lines
    assert "relation e: arity 2, a bag" in lines
    at = lines.index("query paths: paths(a, c) :- e(a, b), e(b, c)")
    assert [line.split() for line in lines[at + 2 : at + 6]] == [
        ["epoch", "count", "change"],
        ["1", "5"],  # the frontier: what changed at it is merged away
        ["2", "13", "+8"],
        ["3", "6", "-7", "(stale)"],
    ]


def test_a_new_state_and_a_path_that_is_not_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Engine(None, str(tmp_path / "new"), TRIANGLES, undirected=["edge"])
    lines, doc = status(tmp_path / "new", capsys)
    assert lines == [f"state {tmp_path / 'new'}", "no epoch applied yet (generation 0)"]
    assert (doc["generation"], doc["epochs"], doc["queries"], doc["traces"]) == (0, [], {}, {})

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert cli.main(["status", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"wcoj: error: no wcoj state at {tmp_path / 'other'} (no wcoj-state.json)"]


def test_a_fresh_process_reads_the_manifest_without_arrow_pandas_or_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = applied(tmp_path, capsys)
    probe = (
        "import sys\n"
        "from wcoj_core.cli import main\n"
        "sys.argv = ['wcoj', 'status', sys.argv[1], '--json']\n"
        "code = main()\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'pyarrow', 'pandas', 'pyspark'})\n"
        "print(code, loaded, file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    done = subprocess.run(
        [sys.executable, "-c", probe, str(state)], capture_output=True, text=True, env=env
    )
    assert done.stderr.strip() == "0 []", done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["queries"]["triangles"]["count"] == 4
