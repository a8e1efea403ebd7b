"""The ``wcoj`` command line: results against the naive oracle, JSON output, every error path.

Most tests call `main` in-process; those that only read local files run with Spark refused
(`no_spark`: ``count``, ``apply`` and ``verify`` on local files need no JVM since the one-pass
engine), the others reuse the session-scoped SparkSession (``replay``, ``--deploy executors``).
Three run the installed console script in a subprocess, one of them starting its own JVM for the
executors, announced with the reason. Also covered: the version, each command's help, bad input
files refused before Spark starts, ``--output``, interruptions, ``verify``, and issue 20 (``count``,
``replay --check`` and ``apply`` epoch by epoch agree on one SNAP-style file).

Expectations that changed with the one-pass engine: an ``--undirected`` relation is a set (a
both-directions file counts what the graph counts; ``--bag`` counts each triangle 8 times); the
meaning errors come from `relation_specs` (``undirected relation 'x' is read by no query``);
an undirected replay stream names each edge once (the engine reads both directions); Spark is
announced as ``starting Spark (MASTER): REASON…`` and only when some work needs it; ``verify``'s
examples start with the state (a positional argument).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from oracle import naive_eval
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from wcoj_core import cli, input_read
from wcoj_core import replay as replay_module
from wcoj_core import spark as wspark
from wcoj_core.cli import workspace
from wcoj_core.engine import Engine
from wcoj_core.input_spark import read_relation
from wcoj_core.query.builtins import BUILTINS, builtin
from wcoj_core.query.explain import explain
from wcoj_core.query.plan import plan_query
from wcoj_core.replay import CheckOutcome, ReplayError, ReplayResult, check_parameters, epoch_stream
from wcoj_core.session import SparkStarter
from wcoj_core.store.store import Store

# A small directed multigraph: a duplicate line (multiplicity 2), a self-loop and both
# directions of 1-3.
EDGES = [(1, 2), (2, 3), (1, 3), (3, 4), (2, 4), (1, 4), (4, 5), (5, 1), (2, 2), (3, 1), (1, 2)]
EDGE_TEXT = "# a tiny graph\n" + "".join(f"{a}\t{b}\n" for a, b in EDGES)
WCOJ_SCRIPT = Path(sys.executable).with_name("wcoj")


@pytest.fixture()
def fast_spark(small: SparkSession) -> SparkSession:
    """The shared session tuned for tiny data (see the `small` fixture in conftest)."""
    return small


@pytest.fixture
def edge_file(tmp_path: Path) -> str:
    path = tmp_path / "edges.txt"
    path.write_text(EDGE_TEXT)
    return str(path)


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the CLI asks for a Spark session (every command gets it through a
    `SparkStarter`, `workspace.start_spark` included)."""

    def refuse(self: SparkStarter, reason: str) -> SparkSession:
        raise AssertionError(f"Spark was asked for: {reason}")

    monkeypatch.setattr(SparkStarter, "__call__", refuse)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], list[str]]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def last_json(out: list[str]) -> dict[str, Any]:
    assert out, "nothing printed"
    payload = json.loads(out[-1])
    assert isinstance(payload, dict)
    return payload


def assert_one_line_error(err: list[str], *fragments: str) -> None:
    assert len(err) == 1, err
    assert err[0].startswith("wcoj: error: "), err
    assert "Traceback" not in err[0]
    for fragment in fragments:
        assert fragment in err[0], (fragment, err[0])


def symmetric(edges: list[tuple[int, int]]) -> Counter[tuple[int, ...]]:
    """The oracle's view of ``--undirected``: each undirected edge once per direction."""
    undirected = {(min(a, b), max(a, b)) for a, b in edges if a != b}
    return Counter([*undirected, *((b, a) for a, b in undirected)])


def collect(df: DataFrame) -> Counter[tuple[int, ...]]:
    """Update triples as a multiset of (c0, c1, time) with summed diffs, zeros dropped."""
    total: Counter[tuple[int, ...]] = Counter()
    for row in df.collect():
        total[(row["c0"], row["c1"], row["time"])] += row["diff"]
    return Counter({k: v for k, v in total.items() if v != 0})


def final_relation(stream: Counter[tuple[int, ...]]) -> Counter[tuple[int, ...]]:
    final: Counter[tuple[int, ...]] = Counter()
    for (a, b, _), diff in stream.items():
        final[(a, b)] += diff
    return Counter({k: v for k, v in final.items() if v != 0})


# --- count --------------------------------------------------------------------------------------


@pytest.mark.parametrize("deploy", ["auto", "executors"])
def test_count_matches_the_oracle_and_ends_with_json(
    fast_spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
    edge_file: str,
    tmp_path: Path,
    deploy: str,
) -> None:
    query = builtin("directed-triangles")
    expected = sum(naive_eval(query, {"edge": Counter(EDGES)}).values())
    assert expected > 0
    state = tmp_path / "kept"
    code, out, err = run(
        capsys,
        "count",
        "--query",
        "directed-triangles",
        "--input",
        f"edge={edge_file}",
        "--state",
        str(state),
        "--json",
        *["--deploy", deploy],
    )
    assert code == 0, err
    assert out[0].startswith(f"count: {expected} (seconds ")
    assert "proposed" in out[0] and "validated" in out[0]
    payload = last_json(out)
    assert payload["count"] == expected
    assert payload["query"] == "directed_triangles"
    assert isinstance(payload["seconds"], float)
    assert payload["output_rows"] == len(naive_eval(query, {"edge": Counter(EDGES)}))
    assert payload["proposed"] >= payload["validated"] >= 0
    assert payload["metrics"]["deployment"] == ("driver" if deploy == "auto" else "executors")
    assert payload["metrics"]["reason"]
    # Local files on the driver need no Spark; the executors do, and the reason is recorded.
    if deploy == "auto":
        assert payload["spark"] is None
    else:
        assert payload["spark"].startswith("the kernel runs in Spark's executors")
    assert (state / "wcoj-state.json").is_file(), "--state DIR is kept, as a state"
    assert (state / "manifests").is_dir()


def test_count_undirected_and_query_text(
    no_spark: None,
    capsys: pytest.CaptureFixture[str],
    edge_file: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Query text, ``--undirected`` (a set: the duplicate line, the self-loop and both
    directions of 1-3 count once) and the temporary state, removed at exit; local files are
    read without Spark."""
    made: list[str] = []
    real_mkdtemp = workspace.tempfile.mkdtemp

    def recording_mkdtemp(*args: Any, **kwargs: Any) -> str:
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(workspace.tempfile, "mkdtemp", recording_mkdtemp)
    text = "tri(a, b, c) :- edge(a, b), edge(b, c), edge(a, c), a < b, b < c"
    query = builtin("triangles")
    expected = sum(naive_eval(query, {"edge": symmetric(EDGES)}).values())
    assert expected > 0
    code, out, err = run(
        capsys, "count", "--query", text, "--input", f"edge={edge_file}", "--undirected", "edge"
    )
    assert code == 0, err
    assert out == [out[0]] and out[0].startswith(f"count: {expected} ")
    assert made and not any(Path(p).exists() for p in made), "the default state dir is removed"
    assert err == ["wcoj: warning: epoch 0: 1 self-loop(s) of undirected relation 'edge' dropped"]


def test_count_reads_an_undirected_relation_as_a_set(
    no_spark: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``count --undirected`` reads the set of undirected edges: a file listing every edge in
    both directions (as SNAP's ca-GrQc does) counts what the same graph listed once counts.
    With ``--bag`` the old reading comes back: each direction then holds every edge twice, and
    each triangle counts 2**3 = 8 times."""
    pairs = [(1, 2), (2, 3), (1, 3), (3, 4), (2, 4), (4, 5)]
    once = tmp_path / "once.txt"
    once.write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
    both = tmp_path / "both.txt"
    both.write_text("".join(f"{a}\t{b}\n{b}\t{a}\n" for a, b in pairs))
    expected = sum(naive_eval(builtin("triangles"), {"edge": symmetric(pairs)}).values())
    assert expected == 2

    def counted(path: Path, *extra: str) -> int:
        code, out, err = run(
            capsys, *_file_args(str(path)), "--undirected", "edge", "--json", *extra
        )
        assert code == 0, err
        payload = last_json(out)
        assert payload["spark"] is None
        return payload["count"]

    assert counted(once) == counted(both) == expected
    assert counted(once, "--bag", "edge") == expected
    assert counted(both, "--bag", "edge") == 8 * expected


# --- replay -------------------------------------------------------------------------------------


def test_replay_with_deletions_passes_the_check(
    fast_spark: SparkSession, capsys: pytest.CaptureFixture[str], edge_file: str, tmp_path: Path
) -> None:
    epochs, fraction, seed = 3, 0.5, 4
    # The oracle's final input: the same stream, accumulated in Python.
    relation = fast_spark.createDataFrame(
        [(a, b, 1) for a, b in EDGES], "c0 long, c1 long, diff long"
    )
    stream = collect(epoch_stream(relation, epochs, fraction, seed, undirected=True))
    assert any(diff < 0 for diff in stream.values()), "pick a seed that deletes something"
    expected = sum(naive_eval(builtin("triangles"), {"edge": final_relation(stream)}).values())
    state = tmp_path / "state"
    argv = [
        "replay",
        "--query",
        "triangles",
        "--input",
        f"edge={edge_file}",
        "--undirected",
        "edge",
        "--epochs",
        str(epochs),
        "--delete-fraction",
        str(fraction),
        "--seed",
        str(seed),
        "--check",
        "--state",
        str(state),
        "--json",
    ]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    progress = [line for line in out if line.startswith("epoch ")]
    assert [p.split(":")[0] for p in progress] == [f"epoch {i}/{epochs}" for i in (1, 2, 3)]
    assert all("changes" in p and "output change" in p and "seconds" in p for p in progress)
    assert any(line.startswith(f"final count: {expected}; check: passed") for line in out)
    payload = last_json(out)
    assert payload["check"] == "passed"
    assert payload["mismatches"] == 0
    assert payload["final_count"] == expected
    assert payload["epochs"] == epochs
    assert len(payload["seconds_per_epoch"]) == epochs
    assert payload["median_seconds"] == pytest.approx(
        sorted(payload["seconds_per_epoch"])[1], abs=1e-3
    )
    assert (state / "stream" / "edge").is_dir() and (state / "engine").is_dir()
    # The state is kept, so it cannot be reused for another replay.
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert_one_line_error(err, "--state", "not empty")


def test_replay_inserts_only_skips_the_check(
    fast_spark: SparkSession, capsys: pytest.CaptureFixture[str], edge_file: str
) -> None:
    query = builtin("2-paths")
    expected = sum(naive_eval(query, {"edge": Counter(EDGES)}).values())
    code, out, err = run(
        capsys,
        "replay",
        "--query",
        "2-paths",
        "--input",
        f"edge={edge_file}",
        "--epochs",
        "2",
        "--json",
    )
    assert code == 0, err
    payload = last_json(out)
    assert payload["check"] == "skipped" and payload["mismatches"] is None
    assert payload["final_count"] == expected
    assert [m["epoch"] for m in payload["epoch_metrics"]] == [0, 1]


def test_replay_exits_1_when_the_check_fails(
    fast_spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
    edge_file: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def failing(*args: Any, **kwargs: Any) -> ReplayResult:
        return ReplayResult("triangles", (), (), 5, CheckOutcome.FAILED, 3)

    monkeypatch.setattr(replay_module, "replay", failing)  # imported when the command runs
    code, out, err = run(
        capsys,
        "replay",
        "--query",
        "triangles",
        "--input",
        f"edge={edge_file}",
        "--epochs",
        "2",
        "--check",
        "--json",
    )
    assert code == 1
    assert last_json(out)["check"] == "failed"
    assert_one_line_error(err, "check failed", "3 output tuples differ")


def _snap_file(path: Path, seed: int, nodes: int = 14, edges: int = 40) -> set[tuple[int, int]]:
    """A random undirected graph written as SNAP's ca-GrQc is: a comment header, every edge in
    both directions, plus a self-loop. Its edges, each once."""
    rng = random.Random(seed)
    universe = [(a, b) for a in range(nodes) for b in range(a + 1, nodes)]
    pairs = set(rng.sample(universe, edges))
    lines = sorted([*pairs, *((b, a) for a, b in pairs), (3, 3)])
    path.write_text(
        "# Directed graph (each unordered pair of nodes is saved once): both directions here\n"
        f"# Nodes: {nodes} Edges: {len(lines)}\n# FromNodeId\tToNodeId\n"
        + "".join(f"{a}\t{b}\n" for a, b in lines)
    )
    return pairs


def test_count_replay_and_apply_agree_on_the_same_file(
    fast_spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 20: on one SNAP-style file (both directions, a self-loop), ``count``, ``replay
    --check`` (with and without deletions) and ``apply`` epoch by epoch of the same stream give
    the same numbers, which are the oracle's on the graph as a set. Before, ``apply`` read an
    undirected relation as a bag and counted each triangle 8 times."""
    snap = tmp_path / "graph.txt"
    pairs = _snap_file(snap, seed=20)
    tri = builtin("triangles")
    whole = sum(naive_eval(tri, {"edge": symmetric(list(pairs))}).values())
    assert whole >= 5, "pick a seed with triangles"
    undirected = ["--input", f"edge={snap}", "--undirected", "edge", "--json"]

    code, out, err = run(capsys, "count", "--query", "triangles", *undirected)
    assert code == 0, err
    assert last_json(out)["count"] == whole

    code, out, err = run(
        capsys, "replay", "--query", "triangles", *undirected, "--epochs", "3", "--check"
    )
    assert code == 0, err
    assert (last_json(out)["final_count"], last_json(out)["check"]) == (whole, "passed")

    epochs, fraction, seed = 3, 0.4, 5
    code, out, err = run(
        capsys,
        *["replay", "--query", "triangles", *undirected, "--epochs", str(epochs)],
        *["--delete-fraction", str(fraction), "--seed", str(seed), "--check"],
    )
    assert code == 0, err
    replayed = last_json(out)
    assert replayed["check"] == "passed"

    # The same stream, applied with `wcoj apply` one epoch file at a time.
    relation = read_relation(fast_spark, str(snap), 2, "edge")
    stream = collect(epoch_stream(relation, epochs, fraction, seed, undirected=True))
    assert any(d < 0 for d in stream.values()), "the stream should delete edges"
    state = tmp_path / "state"
    graph: set[tuple[int, int]] = set()
    for t in range(epochs):
        rows = [(a, b, d) for (a, b, time), d in sorted(stream.items()) if time == t]
        changes = tmp_path / f"epoch-{t}.csv"
        changes.write_text("a,b,diff\n" + "".join(f"{a},{b},{d}\n" for a, b, d in rows))
        code, out, err = run(
            capsys,
            *["apply", "--query", "triangles", "--state", str(state), "--epoch", str(t)],
            *["--changes", f"edge={changes}", "--undirected", "edge", "--json"],
        )
        assert code == 0, err
        graph = {(a, b) for a, b in graph if (a, b, t) not in stream or stream[(a, b, t)] > 0}
        graph |= {(a, b) for a, b, d in rows if d > 0}
        expected = sum(naive_eval(tri, {"edge": symmetric(list(graph))}).values())
        at_t = tmp_path / f"graph-{t}.txt"
        at_t.write_text("".join(f"{a}\t{b}\n" for a, b in sorted(graph)))
        code, counted, err = run(
            capsys,
            *["count", "--query", "triangles", "--input", f"edge={at_t}"],
            *["--undirected", "edge", "--json"],
        )
        assert code == 0, err
        assert last_json(out)["count"] == last_json(counted)["count"] == expected, f"epoch {t}"
    assert last_json(out)["count"] == replayed["final_count"] < whole


# --- the stream ---------------------------------------------------------------------------------


def test_epoch_stream_is_seeded_and_partitioning_free(fast_spark: SparkSession) -> None:
    rows = [(a, b, 1) for a in range(12) for b in range(a % 3, 12, 5)]
    relation = fast_spark.createDataFrame(rows, "c0 long, c1 long, diff long")
    epochs = 4
    stream = collect(epoch_stream(relation, epochs, 0.6, 11))
    assert stream == collect(epoch_stream(relation.repartition(5), epochs, 0.6, 11))
    assert stream != collect(epoch_stream(relation, epochs, 0.6, 12))
    inserted = {(a, b): t for (a, b, t), d in stream.items() if d > 0}
    deleted = {(a, b): t for (a, b, t), d in stream.items() if d < 0}
    assert set(inserted) == {(a, b) for a, b, _ in rows}
    assert all(0 <= t < epochs for t in inserted.values())
    assert deleted and all(inserted[k] < t <= epochs - 1 for k, t in deleted.items())
    everything = collect(epoch_stream(relation, epochs, 1.0, 11))
    assert {(a, b) for (a, b, _), d in everything.items() if d < 0} == {
        k for k, t in inserted.items() if t < epochs - 1
    }
    assert all(d > 0 for d in collect(epoch_stream(relation, epochs, 0.0, 11)).values())


def test_epoch_stream_undirected_names_each_edge_once(fast_spark: SparkSession) -> None:
    """An undirected stream holds each undirected edge once, as ``(least, greatest)``, self-loops
    dropped: the engine reads an undirected relation's changes in both directions itself (the
    stream used to carry both directions)."""
    relation = fast_spark.createDataFrame(
        [(a, b, 1) for a, b in EDGES], "c0 long, c1 long, diff long"
    )
    stream = collect(epoch_stream(relation, 3, 0.5, 2, undirected=True))
    assert all(a < b for a, b, _ in stream), stream
    inserted = [(a, b) for (a, b, _), d in stream.items() if d > 0]
    assert sorted(inserted) == sorted({(a, b) for a, b in symmetric(EDGES) if a < b})
    assert all(d in (1, -1) for d in stream.values())
    assert any(d < 0 for d in stream.values()), "pick a seed that deletes something"
    final = final_relation(stream)
    assert symmetric(list(final)) <= symmetric(EDGES)


def test_replay_parameters_are_checked() -> None:
    check_parameters(1, 0.0, -5)
    for epochs, fraction, seed in [(0, 0.0, 1), (2, -0.1, 1), (2, 1.01, 1), (2, 0.5, 2**63)]:
        with pytest.raises(ReplayError):
            check_parameters(epochs, fraction, seed)


# --- explain ------------------------------------------------------------------------------------


def test_explain_prints_the_plan(capsys: pytest.CaptureFixture[str], no_spark: None) -> None:
    code = cli.main(["explain", "--query", "triangles"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert out == explain(plan_query(builtin("triangles")))
    assert out.startswith("query triangles(a, b, c) :- edge(a, b)")


# --- errors found before Spark starts -----------------------------------------------------------


def _file_args(path: str) -> list[str]:
    return ["count", "--query", "triangles", "--input", f"edge={path}"]


def _written(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _apply_args(folder: Path, changes: str) -> list[str]:
    return [
        *["apply", "--query", "triangles", "--state", str(folder / "state"), "--epoch", "0"],
        *["--changes", f"edge={changes}"],
    ]


PRE_SPARK_ERRORS: list[tuple[str, Callable[[str, Path], list[str]], tuple[str, ...]]] = [
    ("no command", lambda f, d: [], ("required: COMMAND",)),
    ("unknown command", lambda f, d: ["counts"], ("invalid choice",)),
    ("no query", lambda f, d: ["count", "--input", f"edge={f}"], ("--query",)),
    ("no input", lambda f, d: ["count", "--query", "triangles"], ("--input",)),
    (
        "query syntax",
        lambda f, d: ["count", "--query", "p(a) :- edge(a b)", "--input", f"edge={f}"],
        ("query line 1, column 16", "found 'b'"),
    ),
    (
        "query syntax on line 2",
        lambda f, d: ["explain", "--query", "p(a) :-\n  edge(a, b) edge(b, a)"],
        ("query line 2, column 14",),
    ),
    (
        "query arity clash",
        lambda f, d: ["count", "--query", "p(a) :- edge(a, b), edge(a)", "--input", f"edge={f}"],
        ("query line 1, column 21", "arity"),
    ),
    ("unknown built-in", lambda f, d: ["explain", "--query", "triangle"], ("'triangle'",)),
    (
        "input without '='",
        lambda f, d: ["count", "--query", "triangles", "--input", f],
        ("REL=PATH",),
    ),
    (
        "input with empty path",
        lambda f, d: ["count", "--query", "triangles", "--input", "edge="],
        ("REL=PATH",),
    ),
    (
        "input with a bad name",
        lambda f, d: ["count", "--query", "triangles", "--input", f"1edge={f}"],
        ("'1edge' is not a relation name",),
    ),
    (
        "duplicate input",
        lambda f, d: [*_file_args(f), "--input", f"edge={f}"],
        ("'edge' twice",),
    ),
    (
        "input the query does not use",
        lambda f, d: [*_file_args(f), "--input", f"other={f}"],
        ("'other'", "does not use"),
    ),
    (
        "relation without input",
        lambda f, d: ["count", "--query", "p(a) :- edge(a, b), w(b)", "--input", f"edge={f}"],
        ("'w'", "--input w=PATH"),
    ),
    (
        "missing file",
        lambda f, d: _file_args(str(d / "absent.txt")),
        ("absent.txt (relation edge): no such file",),
    ),
    (
        "missing file behind file://",
        lambda f, d: _file_args((d / "absent.txt").as_uri()),
        ("absent.txt (relation edge): no such file",),
    ),
    (
        "bad generator spec",
        lambda f, d: _file_args("rmat:scale=4,edgs=9"),
        ("rmat:scale=4,edgs=9, column 14", "unknown key 'edgs'"),
    ),
    (
        "generator for a ternary relation",
        lambda f, d: ["count", "--query", "p(a) :- t(a, b, c)", "--input", "t=rmat:scale=3"],
        ("binary", "arity 3"),
    ),
    (
        "undirected relation not given",
        lambda f, d: [*_file_args(f), "--undirected", "friends"],
        ("undirected relation 'friends' is read by no query (the relations: edge)",),
    ),
    (
        "set relation not given",
        lambda f, d: [*_file_args(f), "--set", "friends"],
        ("set relation 'friends' is read by no query",),
    ),
    (
        "a set and a bag",
        lambda f, d: [*_file_args(f), "--set", "edge", "--bag", "edge"],
        ("relation 'edge' is declared both a set and a bag",),
    ),
    (
        "undirected relation not binary",
        lambda f, d: [
            "count",
            "--query",
            "p(a) :- t(a, b, c)",
            "--input",
            f"t={f}",
            "--undirected",
            "t",
        ],
        ("undirected relation 't' has arity 3", "only a binary relation"),
    ),
    (
        "state is a file",
        lambda f, d: [*_file_args(f), "--state", f],
        ("not a directory",),
    ),
    (
        "state cannot be created",
        lambda f, d: [*_file_args(f), "--state", f"{f}/state"],
        ("cannot create the directory",),
    ),
    (
        "state not empty",
        lambda f, d: [*_file_args(f), "--state", str(d)],
        ("not empty",),
    ),
    (
        "apply to a folder that is not a state",
        lambda f, d: [  # the test's folder holds the edge file
            *["apply", "--query", "triangles", "--state", str(d), "--epoch", "0"],
            *["--changes", f"edge={f}"],
        ],
        ("is not a wcoj state", "pass a new or empty directory"),
    ),
    (
        "verify a folder that is not a state",
        lambda f, d: ["verify", str(d)],
        ("no wcoj state at", "wcoj-state.json"),
    ),
    (
        "epochs zero",
        lambda f, d: ["replay", "--query", "triangles", "--input", f"edge={f}", "--epochs", "0"],
        ("--epochs must be at least 1",),
    ),
    (
        "epochs not an integer",
        lambda f, d: ["replay", "--query", "triangles", "--input", f"edge={f}", "--epochs", "2.5"],
        ("--epochs", "'2.5'"),
    ),
    (
        "epochs missing",
        lambda f, d: ["replay", "--query", "triangles", "--input", f"edge={f}"],
        ("--epochs",),
    ),
    *[
        (
            f"delete fraction {value}",
            lambda f, d, value=value: [
                *["replay", "--query", "triangles", "--input", f"edge={f}", "--epochs", "2"],
                *["--delete-fraction", value],
            ],
            ("--delete-fraction must be between 0 and 1",),
        )
        for value in ("1.5", "-0.25", "nan")
    ],
    (
        "seed out of range",
        lambda f, d: [
            *["replay", "--query", "triangles", "--input", f"edge={f}", "--epochs", "2"],
            *["--seed", str(2**63)],
        ],
        ("--seed",),
    ),
    (
        "output neither Parquet nor CSV",
        lambda f, d: [*_file_args(f), "--output", str(d / "out.txt")],
        ("--output", "give a path ending in .parquet or .csv"),
    ),
    (
        "output in a missing folder",
        lambda f, d: [*_file_args(f), "--output", str(d / "none" / "out.csv")],
        ("--output", "does not exist"),
    ),
    (
        "apply output neither Parquet nor CSV",
        lambda f, d: [*_apply_args(d, f), "--output", str(d / "change.json")],
        ("--output", "give a path ending in .parquet or .csv"),
    ),
    (
        "CSV without the relation's columns",
        lambda f, d: _file_args(_written(d / "e.csv", "a\n1\n2\n")),
        ("e.csv (relation edge), line 1", "has 1 data columns ['a']"),
    ),
    (
        "CSV with a bad value",
        lambda f, d: _file_args(_written(d / "e.csv", "a,b\n1,2\n3,x\n")),
        ("e.csv (relation edge), line 3, column 2", "value in column 'b' is not an integer: 'x'"),
    ),
    (
        "CSV with a zero diff",
        lambda f, d: _file_args(_written(d / "e.csv", "a,b,diff\n1,2,0\n")),
        ("line 2, column 3", "is zero"),
    ),
    (
        "empty text file",
        lambda f, d: _file_args(_written(d / "e.txt", "# nothing\n")),
        ("e.txt (relation edge): has no data rows",),
    ),
    (
        "bad changes file",
        lambda f, d: _apply_args(d, _written(d / "c.csv", "a,b\n1,2,3\n")),
        ("c.csv (relation edge), line 2, column 3", "has 3 fields but the header has 2"),
    ),
    (
        "bad second input",
        lambda f, d: [
            *["count", "--query", "p(a) :- r(a, b), s(b, a)", "--input", f"r={f}"],
            *["--input", "s=" + _written(d / "s.txt", "1 2\n2\n")],
        ],
        ("s.txt (relation s), line 2, column 2", "expected 2 fields, found 1"),
    ),
]


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [pytest.param(argv, fragments, id=name) for name, argv, fragments in PRE_SPARK_ERRORS],
)
def test_errors_before_spark_are_one_line(
    capsys: pytest.CaptureFixture[str],
    no_spark: None,
    edge_file: str,
    tmp_path: Path,
    argv: Callable[[str, Path], list[str]],
    fragments: tuple[str, ...],
) -> None:
    code, out, err = run(capsys, *argv(edge_file, tmp_path))
    assert code == 2
    assert out == []
    assert_one_line_error(err, *fragments)


# --- bad files, found before Spark starts ------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "content", "fragments"),
    [
        pytest.param(
            "triangles", "1 2\n2 3 4\n", ("line 2, column 5", "expected 2 fields"), id="malformed"
        ),
        pytest.param(
            "triangles",
            "# ids\n1 2\n3 x7\n",
            ("line 3, column 3", "not an integer: 'x7'"),
            id="non-integer id",
        ),
        pytest.param(
            "p(a) :- edge(a, b, c)",
            "1 2 3\n4 5\n",
            ("line 2, column 4", "expected 3 fields, found 2"),
            id="arity mismatch",
        ),
    ],
)
@pytest.mark.parametrize("command", ["count", "replay"])
def test_bad_files_name_file_line_and_column_before_spark(
    no_spark: None,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    command: str,
    query: str,
    content: str,
    fragments: tuple[str, ...],
) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(content)
    extra = ["--epochs", "2"] if command == "replay" else []
    code, out, err = run(capsys, command, "--query", query, "--input", f"edge={path}", *extra)
    assert code == 2
    assert out == []
    assert_one_line_error(err, f"{path} (relation edge)", *fragments)


# --- Spark failures and interruptions -----------------------------------------------------------


class _FakeJavaException:
    """Enough of a Py4J Java exception object for `Py4JJavaError` and the CLI."""

    _target_id = "o0"
    _gateway_client = None

    def toString(self) -> str:  # the Java method name
        return "java.lang.IllegalStateException: executor lost\n\tat org.apache.Spark.run"


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        (PySparkException("[BOOM] the job failed\nmore detail"), "[BOOM] the job failed"),
        (
            Py4JJavaError("An error occurred while calling o1.parquet.\n", _FakeJavaException()),
            "java.lang.IllegalStateException: executor lost",
        ),
    ],
    ids=["pyspark", "py4j"],
)
@pytest.mark.parametrize("debug", [False, True], ids=["quiet", "debug"])
def test_spark_failures_are_one_line_exit_1(
    no_spark: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    edge_file: str,
    failure: Exception,
    message: str,
    debug: bool,
) -> None:
    """A Spark failure while the epoch runs (the engine's executors, a remote read) is one
    line and exit 1; ``WCOJ_DEBUG=1`` adds the traceback."""

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise failure

    if debug:
        monkeypatch.setenv("WCOJ_DEBUG", "1")
    else:
        monkeypatch.delenv("WCOJ_DEBUG", raising=False)
    monkeypatch.setattr(Engine, "apply", fail)
    monkeypatch.setattr(Engine, "evaluate", fail)  # `count` without a state evaluates
    code, _, err = run(capsys, *_file_args(edge_file))
    assert code == 1
    if debug:
        assert err[0].startswith("Traceback") and err[-1] == f"wcoj: error: spark failed: {message}"
    else:
        assert_one_line_error(err, f"spark failed: {message}")


def _interrupt(*args: Any, **kwargs: Any) -> Any:
    raise KeyboardInterrupt


def test_interrupt_exits_130(
    no_spark: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    edge_file: str,
) -> None:
    monkeypatch.setattr(input_read, "read_local_batches", _interrupt)
    code, _, err = run(capsys, *_file_args(edge_file))
    assert code == 130
    assert_one_line_error(err, "interrupted")


def _apply(
    capsys: pytest.CaptureFixture[str], state: Path, epoch: int, changes: Path, *extra: str
) -> tuple[int, list[str], list[str]]:
    return run(
        capsys,
        *["apply", "--query", "triangles", "--state", str(state), "--epoch", str(epoch)],
        *["--changes", f"edge={changes}", "--undirected", "edge", "--json", *extra],
    )


def test_an_interrupted_apply_says_whether_the_epoch_was_applied(
    no_spark: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Interrupted before its commit, an epoch applies nothing (its staged files removed);
    interrupted after it (a ``--replace`` deriving the later epochs again), it is applied and
    the stale epochs are derived before the next one."""
    state = tmp_path / "state"
    epochs = ["a,b\n1,2\n2,3\n1,3\n", "a,b\n3,4\n2,4\n", "a,b\n1,4\n"]
    files = []
    for t, text in enumerate(epochs):
        files.append(tmp_path / f"e{t}.csv")
        files[-1].write_text(text)
    for t in (0, 1):
        assert _apply(capsys, state, t, files[t])[0] == 0
    manifests = sorted(p.name for p in (state / "manifests").iterdir())
    folders = sorted(str(p) for p in state.glob("*/*/*"))

    with monkeypatch.context() as patch:
        patch.setattr(Store, "commit", _interrupt)
        code, out, err = _apply(capsys, state, 2, files[2])
    assert code == 130 and out == []
    assert err == ["wcoj: error: interrupted: epoch 2 was not applied; the state is as it was"]
    assert sorted(p.name for p in (state / "manifests").iterdir()) == manifests
    assert sorted(str(p) for p in state.glob("*/*/*")) == folders, "staged files removed"

    fix = tmp_path / "fix.csv"
    fix.write_text("a,b\n3,4\n")  # epoch 1 without 2-4
    with monkeypatch.context() as patch:
        patch.setattr(Engine, "refresh", _interrupt)
        code, out, err = _apply(capsys, state, 0, fix, "--replace")
    assert code == 130
    (line,) = err
    assert line == (
        "wcoj: error: interrupted after epoch 0 was replaced; the later epochs it made stale "
        "are derived again before the next epoch is applied"
    )

    code, out, err = _apply(capsys, state, 2, files[2])
    assert code == 0, err
    payload = last_json(out)
    assert payload["rebuilt"] == [1]
    # Epoch 0 is now {3-4}; epoch 1 adds 3-4 (present) and 2-4; epoch 2 adds 1-4: no triangle.
    assert payload["count"] == 0


def test_help_exits_0(capsys: pytest.CaptureFixture[str], no_spark: None) -> None:
    code, out, _ = run(capsys, "replay", "--help")
    assert code == 0
    assert any("--delete-fraction" in line for line in out)


@pytest.mark.parametrize("command", ["count", "replay", "apply", "verify", "explain"])
def test_each_help_ends_with_examples_and_the_built_in_queries(
    capsys: pytest.CaptureFixture[str], no_spark: None, command: str
) -> None:
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    tail = out[out.index("examples:") + 1 :]
    examples = [line.strip() for line in tail if line.startswith("  wcoj ")]
    assert 2 <= len(examples) <= 3
    assert all(e.startswith(f"wcoj {command} ") for e in examples), examples
    assert out[-1] == f"built-in queries (--query NAME): {', '.join(BUILTINS)}"


def test_apply_help_names_the_meanings_and_replace(
    capsys: pytest.CaptureFixture[str], no_spark: None
) -> None:
    code, out, _ = run(capsys, "apply", "--help")
    assert code == 0
    text = " ".join(" ".join(out).split())
    for flag in ("--undirected", "--set", "--bag", "--replace", "--force", "--deploy"):
        assert flag in text, flag
    assert any("--replace" in e for e in out[out.index("examples:") :])


def test_version_is_the_installed_package_version(
    capsys: pytest.CaptureFixture[str], no_spark: None
) -> None:
    code, out, err = run(capsys, "--version")
    assert code == 0 and err == []
    assert out == [f"wcoj {metadata.version('wcoj')}"]


def test_spark_starts_once_when_asked_announced_with_its_reason(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command's `SparkStarter` starts nothing until some work asks, then starts one session
    with the ``--conf`` settings, announced on one stderr line with the reason; a running
    session is reused silently. (No JVM: the session maker is a stand-in.)"""
    fake = object()
    made: list[tuple[str | None, dict[str, str]]] = []

    def session(master: str | None, conf: dict[str, str], **_: Any) -> Any:
        made.append((master, dict(conf)))
        return fake

    monkeypatch.setattr(wspark, "active_session", lambda master=None: None)
    monkeypatch.setattr(wspark, "session", session)
    starter = workspace.starter(None, ["spark.executor.memory=1g"])
    assert not starter.started and starter.reason is None
    assert capsys.readouterr().err == ""
    assert starter("the kernel runs in Spark's executors") is fake
    assert starter("another reason") is fake
    assert made == [(None, {"spark.executor.memory": "1g"})]
    assert starter.reason == "the kernel runs in Spark's executors"
    assert workspace.start_spark("spark://127.0.0.1:7077", (), "replay splits its inputs") is fake
    assert capsys.readouterr().err.splitlines() == [
        "starting Spark (local[*]): the kernel runs in Spark's executors…",
        "starting Spark (spark://127.0.0.1:7077): replay splits its inputs…",
    ]
    monkeypatch.setattr(wspark, "active_session", lambda master=None: fake)
    assert workspace.start_spark(None) is fake
    assert capsys.readouterr().err == "", "the running session is reused silently"
    assert len(made) == 2


# --- verify -------------------------------------------------------------------------------------


def _flip_last_byte(path: Path) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _verified_state(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> tuple[Path, Path]:
    """A state of two epochs that verifies, and the changes of a third epoch."""
    state = tmp_path / "state"
    epochs = ["a,b\n1,2\n2,3\n1,3\n3,4\n", "a,b\n2,4\n", "a,b\n1,4\n"]
    files = []
    for t, text in enumerate(epochs):
        files.append(tmp_path / f"e{t}.csv")
        files[-1].write_text(text)
    for t in (0, 1):
        assert _apply(capsys, state, t, files[t])[0] == 0
    code, out, err = run(capsys, "verify", str(state), "--json")
    assert code == 0 and err == [], err
    payload = last_json(out)
    assert set(payload) >= {"command", "ok", "generation", "files", "bytes", "damaged", "repaired"}
    assert payload["ok"] is True and payload["damaged"] == [] and payload["files"] > 0
    assert out[0].startswith("verify: ok (")
    return state, files[2]


def test_verify_names_damage_and_repairs_arrangements(
    no_spark: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Exit 0 on a sound state, 1 with one ``damaged:`` line per damaged file; ``--repair``
    rebuilds a damaged arrangement file of the current generation (epochs then stay exact)
    but cannot rebuild a batch, the source of truth."""
    state, third = _verified_state(capsys, tmp_path)
    segment = Store.open(state, create=False).current().traces["rel/edge"].index.segments[0]
    _flip_last_byte(state / segment.file_path("layer"))
    code, out, err = run(capsys, "verify", str(state))
    assert code == 1
    damaged = [line for line in out if line.startswith("damaged: ")]
    assert len(damaged) == 1 and segment.file_path("layer") in damaged[0], out
    assert "rebuildable from the batches" in damaged[0]

    code, out, err = run(capsys, "verify", str(state), "--repair", "--json")
    payload = last_json(out)
    assert payload["repaired"] == ["rel/edge"]
    assert err == ["rebuilt the arrangements of rel/edge from its batches"]
    assert payload["damaged"] and not any(d["current"] for d in payload["damaged"]), (
        "only earlier generations still name the damaged file"
    )
    code, out, err = _apply(capsys, state, 2, third)
    assert code == 0, err
    graph = symmetric([(1, 2), (2, 3), (1, 3), (3, 4), (2, 4), (1, 4)])
    expected = sum(naive_eval(builtin("triangles"), {"edge": graph}).values())
    assert last_json(out)["count"] == expected == 4

    batch = Store.open(state, create=False).current().traces["rel/edge"].batches[0]
    _flip_last_byte(state / batch.path / batch.files[0].name)
    code, out, err = run(capsys, "verify", str(state), "--repair")
    assert code == 1
    assert any("not rebuildable" in line for line in out if line.startswith("damaged: ")), out


def test_verify_repair_leaves_a_state_that_verifies(
    no_spark: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state, _ = _verified_state(capsys, tmp_path)
    segment = Store.open(state, create=False).current().traces["rel/edge"].index.segments[0]
    _flip_last_byte(state / segment.file_path("layer"))
    code, out, _ = run(capsys, "verify", str(state), "--repair", "--json")
    assert last_json(out)["repaired"] == ["rel/edge"]
    assert code == 0, out
    assert run(capsys, "verify", str(state))[0] == 0


# --- --output -----------------------------------------------------------------------------------


def read_tuples(path: Path) -> Counter[tuple[int, ...]]:
    """A written output file as a multiset: data columns to their diff."""
    table = pq.read_table(path) if path.suffix == ".parquet" else pacsv.read_csv(path)
    assert table.column_names[-1] == "diff"
    assert all(name == f"c{i}" for i, name in enumerate(table.column_names[:-1]))
    columns = table.to_pydict().values()
    return Counter({tuple(row[:-1]): row[-1] for row in zip(*columns, strict=True)})


@pytest.mark.parametrize(
    ("suffix", "deploy"), [(".parquet", "driver"), (".csv", "driver"), (".parquet", "executors")]
)
def test_count_writes_the_output_tuples(
    fast_spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
    edge_file: str,
    tmp_path: Path,
    suffix: str,
    deploy: str,
) -> None:
    target = tmp_path / f"out{suffix.upper() if suffix == '.csv' else suffix}"
    code, out, err = run(
        capsys,
        *["count", "--query", "directed-triangles", "--input", f"edge={edge_file}"],
        *["--output", str(target), "--json", "--deploy", deploy],
    )
    assert code == 0, err
    expected = naive_eval(builtin("directed-triangles"), {"edge": Counter(EDGES)})
    assert read_tuples(target) == expected
    assert f"output: {len(expected)} tuples written to {target}" in out
    assert last_json(out)["output"] == str(target)
    if suffix == ".csv":
        assert target.read_text().splitlines()[0] == "c0,c1,c2,diff"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no scratch left"


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_apply_writes_the_epochs_output_change(
    no_spark: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, suffix: str
) -> None:
    state = tmp_path / "state"
    epochs = ["a,b\n1,2\n2,3\n", "a,b\n1,3\n", "a,b,diff\n2,1,-1\n"]
    written: list[Counter[tuple[int, ...]]] = []
    for epoch, text in enumerate(epochs):
        changes = tmp_path / f"changes-{epoch}.csv"
        changes.write_text(text)
        target = tmp_path / f"change-{epoch}{suffix}"
        code, _, err = run(
            capsys,
            *["apply", "--query", "triangles", "--state", str(state), "--epoch", str(epoch)],
            *["--changes", f"edge={changes}", "--undirected", "edge", "--output", str(target)],
        )
        assert code == 0, err
        written.append(read_tuples(target))
    assert written == [Counter(), Counter({(1, 2, 3): 1}), Counter({(1, 2, 3): -1})]


# --- the installed console script ---------------------------------------------------------------

needs_script = pytest.mark.skipif(not WCOJ_SCRIPT.exists(), reason=f"{WCOJ_SCRIPT} not installed")


@needs_script
def test_console_script_explain() -> None:
    done = subprocess.run(
        [str(WCOJ_SCRIPT), "explain", "--query", "triangles"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == explain(plan_query(builtin("triangles")))


@needs_script
@pytest.mark.spark  # its own JVM, in the subprocess
def test_console_script_errors_and_counts(tmp_path: Path) -> None:
    """A bad query is one line; a count of a local file needs no Spark and says nothing about
    it (``spark`` null); the same count on the executors starts its own JVM, announced first
    with the master and the reason."""
    bad = subprocess.run(
        [str(WCOJ_SCRIPT), "count", "--query", "p(a :- edge(a, b)", "--input", "edge=x.txt"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [
        "wcoj: error: query line 1, column 5: expected ',' or ')' after a head variable, found ':-'"
    ]
    path = tmp_path / "edges.txt"
    path.write_text(EDGE_TEXT)
    expected = sum(naive_eval(builtin("directed-triangles"), {"edge": Counter(EDGES)}).values())
    argv = [
        str(WCOJ_SCRIPT),
        *["count", "--query", "directed-triangles", "--input", f"edge={path}"],
        *["--master", "local[1]", "--json"],
    ]
    local = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert local.returncode == 0, local.stderr
    payload = json.loads(local.stdout.splitlines()[-1])
    assert payload["count"] == expected and payload["spark"] is None
    assert local.stderr == ""
    done = subprocess.run(
        [*argv, "--deploy", "executors"], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout.splitlines()[-1])
    assert payload["count"] == expected
    assert payload["metrics"]["deployment"] == "executors"
    reason = "the kernel runs in Spark's executors (executors asked for)"
    assert payload["spark"] == reason
    assert done.stderr.splitlines()[0] == f"starting Spark (local[1]): {reason}…"
    assert "Traceback" not in done.stderr


@needs_script
def test_console_script_refuses_a_bad_csv_before_starting_spark(tmp_path: Path) -> None:
    """No JVM: the file is refused from its first lines, with no "starting Spark" line."""
    bad = tmp_path / "edges.csv"
    bad.write_text("src,dst\n1,2\n2,3\n3,x\n4,5\n")
    start = time.monotonic()
    done = subprocess.run(
        [str(WCOJ_SCRIPT), "count", "--query", "triangles", "--input", f"edge={bad}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    seconds = time.monotonic() - start
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"wcoj: error: {bad} (relation edge), line 4, column 2: value in column 'dst' is not an "
        "integer: 'x'"
    ]
    assert seconds < 60, f"took {seconds:.1f} s"


def test_a_command_that_ended_ignores_ctrl_c_while_the_process_exits() -> None:
    """Python gives a handled signal its default action back while the process exits; a
    Ctrl-C landing then killed a process that had reported success (exit -2, no message).
    Once the command has ended, SIGINT is ignored, which stays so through the exit."""
    probe = (
        "import signal, sys\n"
        "from wcoj_core.cli import main\n"
        "sys.argv = ['wcoj', '--version']\n"
        "code = main()\n"
        "print(code, signal.getsignal(signal.SIGINT) is signal.SIG_IGN)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.splitlines()[-1] == "0 True", done.stdout + done.stderr


def test_a_process_that_is_the_command_leaves_with_its_status_and_output() -> None:
    """A process that is the command leaves without tearing itself down (`_leave`): its
    output is flushed and its status is the command's; an error raised after the command
    returned still ends the process as Python ends it (status 1)."""
    for after, code in (("sys.exit(main())", 2), ("main(); raise ValueError('after')", 1)):
        probe = f"import sys\nfrom wcoj_core.cli import main\nprint('before')\n{after}\n"
        done = subprocess.run(
            [sys.executable, "-c", probe, "explain", "--query", "p(a) :- e(a"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == code, done.stderr
        assert done.stdout == "before\n" and "wcoj: error:" in done.stderr, done
