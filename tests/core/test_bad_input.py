"""Bad input, end to end: every kind is refused with a message saying where, and nothing is written.

Four parts:

* files given to ``wcoj count`` (text, CSV, Parquet): exit 2, one line naming the file, the line
  (for Parquet the row) and the column, and a ``--state`` directory left empty;
* files that delete absent tuples: accepted, and flagged by a warning listing the tuples;
* queries that do not parse or do not make sense, alone or against the inputs and the engine's
  state: a message with the query position or the relation, and no state written;
* hypothesis fuzzing of the readers and of the query checks: any input gives rows or a
  `WcojError` with a message, never another exception.

Refusals at the Dagster level (landing folders, the sensor, asset checks) are tested in
``tests/assets/test_bad_input_assets.py``; a re-applied or older epoch in ``test_engine_state.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import naive_eval
from pyspark.sql import DataFrame, SparkSession

from wcoj_core import cli
from wcoj_core.cli import workspace
from wcoj_core.cli.inputs import parse_inputs
from wcoj_core.engine import Engine, evaluate_static
from wcoj_core.errors import InputError, QueryError, QuerySyntaxError, StateError, WcojError
from wcoj_core.input_read import check_locally, read_local
from wcoj_core.input_spark import negative_tuples, read_relation, read_updates
from wcoj_core.query.builtins import builtin, resolve_query
from wcoj_core.query.ir import Var
from wcoj_core.query.parse import parse_query

# Examples per fuzz test. The readers start Spark jobs (a few tenths of a second each), so they
# get fewer than the pure-Python query checks: the profile's (25 in CI, `tests/conftest.py`; the
# same examples every run there), at most 40 (20 s a test under CI's load).
READER_EXAMPLES = min(40, settings().max_examples)
QUERY_EXAMPLES = 300

Content = str | bytes | pa.Table | Callable[[Path], None]


@pytest.fixture()
def fast_spark(small: SparkSession) -> SparkSession:
    """The shared session tuned for tiny data (see the `small` fixture in conftest)."""
    return small


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the CLI gets as far as starting Spark."""

    def refuse(master: str | None) -> SparkSession:
        raise AssertionError("Spark was started although the arguments are invalid")

    monkeypatch.setattr(workspace, "start_spark", refuse)


def write(path: Path, content: Content) -> Path:
    """Write a text, bytes, Parquet table or custom file at `path`."""
    if isinstance(content, pa.Table):
        pq.write_table(content, path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_bytes(content.encode())
    else:
        content(path)
    return path


def files_under(root: Path) -> dict[str, str]:
    """Every file under `root` with a digest of its bytes: what "nothing written" compares."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], list[str]]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def assert_one_line(err: list[str], prefix: str, *fragments: str) -> None:
    assert len(err) == 1, err
    assert err[0].startswith(prefix), err
    assert "Traceback" not in err[0]
    for fragment in fragments:
        assert fragment in err[0], (fragment, err[0])


# --- bad files given to the CLI ---------------------------------------------------------------


def _int64(*values: int | None) -> pa.Array:
    return pa.array(values, pa.int64())


def _truncated_parquet(path: Path) -> None:
    pq.write_table(pa.table({"a": _int64(1, 2), "b": _int64(2, 3)}), path)
    path.write_bytes(path.read_bytes()[:-12])


# (id, file name, content, query, fragments after "<path> (relation edge)")
BAD_FILES: list[tuple[str, str, Content, str, tuple[str, ...]]] = [
    # malformed lines
    ("text-extra-field", "e.txt", "1 2\n2 3 4\n", "triangles", ("line 2, column 5", "found 3")),
    ("text-missing-field", "e.txt", "# c\n1 2\n3\n", "triangles", ("line 3, column 2", "found 1")),
    (
        "csv-short-row",
        "e.csv",
        "a,b\n1,2\n3\n",
        "triangles",
        ("line 3, column 2", "has 1 fields but the header has 2"),
    ),
    (
        "csv-long-row",
        "e.csv",
        "a,b\n1,2,3\n",
        "triangles",
        ("line 2, column 3", "has 3 fields but the header has 2"),
    ),
    (
        "csv-bad-quoting",
        "e.csv",
        'a,b\n1,2\n"3"4,5\n',
        "triangles",
        ("line 3, column 4", "has malformed quoting"),
    ),
    (
        "arity-mismatch",
        "e.txt",
        "1 2 3\n4 5\n",
        "p(a) :- edge(a, b, c)",
        ("line 2, column 4", "expected 3 fields, found 2"),
    ),
    # non-integer or out-of-range ids
    ("text-word", "e.txt", "1 2\n3 x7\n", "triangles", ("line 2, column 3", "'x7'")),
    ("text-decimal", "e.txt", "1.0 2\n", "triangles", ("line 1, column 1", "'1.0'")),
    ("csv-decimal", "e.csv", "a,b\n1,2.5\n", "triangles", ("line 2, column 2", "'2.5'")),
    (
        "text-too-large",
        "e.txt",
        "1 9223372036854775808\n",
        "triangles",
        ("line 1, column 3", "out of the signed 64-bit range"),
    ),
    (
        "csv-too-small",
        "e.csv",
        "a,b\n-9223372036854775809,1\n",
        "triangles",
        ("line 2, column 1", "out of the signed 64-bit range"),
    ),
    # empty files
    ("text-empty", "e.txt", "", "triangles", ("has no data rows",)),
    ("text-comments-only", "e.txt", "# nodes\n\n# edges\n", "triangles", ("has no data rows",)),
    ("csv-empty", "e.csv", "", "triangles", ("has no data rows (the file is empty)",)),
    ("csv-header-only", "e.csv", "a,b\n", "triangles", ("has no data rows",)),
    (
        "parquet-no-rows",
        "e.parquet",
        pa.table({"a": _int64(), "b": _int64()}),
        "triangles",
        ("has no data rows",),
    ),
    # wrong or missing columns
    ("csv-missing-column", "e.csv", "a\n1\n", "triangles", ("line 1", "has 1 data columns ['a']")),
    ("csv-extra-column", "e.csv", "a,b,c\n1,2,3\n", "triangles", ("line 1", "has 3 data columns")),
    ("csv-no-header", "e.csv", "1,2\n3,4\n", "triangles", ("line 1, column 1", "header row")),
    (
        "csv-time-column",
        "e.csv",
        "a,b,time\n1,2,0\n",
        "triangles",
        ("line 1, column 3", "must not carry a 'time' column"),
    ),
    (
        "csv-two-diffs",
        "e.csv",
        "a,diff,b,DIFF\n1,1,2,1\n",
        "triangles",
        ("line 1, column 4", "more than one 'diff' column"),
    ),
    (
        "parquet-missing-column",
        "e.parquet",
        pa.table({"a": _int64(1)}),
        "triangles",
        ("has 1 data columns ['a']",),
    ),
    # wrong column types
    (
        "parquet-double",
        "e.parquet",
        pa.table({"a": _int64(1), "w": pa.array([0.5])}),
        "triangles",
        ("column w", "has type double"),
    ),
    (
        "parquet-string",
        "e.parquet",
        pa.table({"a": pa.array(["1"]), "b": _int64(2)}),
        "triangles",
        ("column a", "has type string"),
    ),
    (
        "parquet-uint64",
        "e.parquet",
        pa.table({"a": pa.array([1], pa.uint64()), "b": _int64(2)}),
        "triangles",
        ("column a", "has type uint64"),  # Arrow's name: Spark's was decimal(20,0)
    ),
    # zero diffs
    (
        "csv-zero-diff",
        "e.csv",
        "a,b,diff\n1,2,1\n1,2,0\n",
        "triangles",
        ("line 3, column 3", "is zero"),
    ),
    (
        "parquet-zero-diff",
        "e.parquet",
        pa.table({"a": _int64(1, 2), "b": _int64(2, 3), "diff": _int64(1, 0)}),
        "triangles",
        ("line 2, column diff", "is zero"),
    ),
    # NaN and null values
    ("text-nan", "e.txt", "1 nan\n", "triangles", ("line 1, column 3", "'nan'")),
    ("csv-nan", "e.csv", "a,b\n1,NaN\n", "triangles", ("line 2, column 2", "'NaN'")),
    (
        "parquet-nan",
        "e.parquet",
        pa.table({"a": pa.array([1.0, float("nan")]), "b": _int64(1, 2)}),
        "triangles",
        ("column a", "has type double"),
    ),
    ("csv-null", "e.csv", "a,b\r\n1,\r\n", "triangles", ("line 2, column 2", "is empty")),
    (
        "parquet-null",
        "e.parquet",
        pa.table({"a": _int64(1, None), "b": _int64(1, 2)}),
        "triangles",
        ("line 2, column a", "is null"),
    ),
    (
        "parquet-null-diff",
        "e.parquet",
        pa.table({"a": _int64(1), "b": _int64(2), "diff": _int64(None)}),
        "triangles",
        ("line 1, column diff", "is null"),
    ),
    # unreadable files
    (
        "parquet-truncated",
        "e.parquet",
        _truncated_parquet,
        "triangles",
        ("cannot be read as Parquet",),
    ),
    ("gzip-corrupt", "e.txt.gz", b"\x1f\x8bnot really gzip", "triangles", ("cannot be read",)),
]


@pytest.mark.parametrize(
    ("name", "content", "query", "fragments"),
    [pytest.param(n, c, q, f, id=i) for i, n, c, q, f in BAD_FILES],
)
def test_bad_files_are_refused_and_nothing_is_written(
    fast_spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    name: str,
    content: Content,
    query: str,
    fragments: tuple[str, ...],
) -> None:
    path = write(tmp_path / name, content)
    state = tmp_path / "state"
    code, out, err = run_cli(
        capsys, "count", "--query", query, "--input", f"edge={path}", "--state", str(state)
    )
    assert code == 2
    assert out == []
    assert_one_line(err, f"wcoj: error: {path} (relation edge)", *fragments)
    assert files_under(state) == {}, "a refused input must not write any state"


@pytest.mark.parametrize(
    ("name", "content", "query", "fragments"),
    [pytest.param(n, c, q, f, id=i) for i, n, c, q, f in BAD_FILES],
)
def test_bad_files_are_refused_without_spark(
    tmp_path: Path, name: str, content: Content, query: str, fragments: tuple[str, ...]
) -> None:
    """The same files, read by `read_local` and checked by `check_locally` (no JVM): the same
    one-line refusal. The pre-flight check leaves a file that does not decompress or parse to
    the full read."""
    path = write(tmp_path / name, content)
    arity = resolve_query(query).relations["edge"]
    for check in (read_local, check_locally):
        try:
            check(str(path), arity, "edge")
        except InputError as error:
            message = str(error)
        else:
            assert check is check_locally and "cannot be read" in fragments[0], check
            continue
        assert "\n" not in message
        assert message.startswith(f"{path} (relation edge)"), message
        for fragment in fragments:
            assert fragment in message, (fragment, message)


@pytest.mark.parametrize(
    ("name", "content", "query"),
    [pytest.param(n, c, q, id=i) for i, n, c, q, _ in BAD_FILES],
)
def test_both_readers_give_the_same_message(
    fast_spark: SparkSession, tmp_path: Path, name: str, content: Content, query: str
) -> None:
    """Word for word, but for why a damaged file cannot be read (Java's words or Python's)."""
    path = str(write(tmp_path / name, content))
    arity = resolve_query(query).relations["edge"]
    with pytest.raises(InputError) as spark_error:
        read_relation(fast_spark, path, arity, "edge").collect()
    with pytest.raises(InputError) as local_error:
        read_local(path, arity, "edge")
    assert_same_refusal(str(local_error.value), str(spark_error.value))


def assert_same_refusal(local: str, spark: str) -> None:
    """The same message, or both `cannot be read as <format>` (the reasons are each library's)."""
    if "cannot be read as" in spark:
        prefix = spark[: spark.index("cannot be read as") + len("cannot be read as ")]
        assert local.startswith(prefix), (local, spark)
    else:
        assert local == spark


def test_a_bad_second_input_leaves_the_state_empty(
    fast_spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    good = write(tmp_path / "r.txt", "1 2\n2 3\n")
    bad = write(tmp_path / "s.csv", "a,b\n1,2\n2,x\n")
    state = tmp_path / "state"
    for command in (["count"], ["replay", "--epochs", "2"]):
        code, out, err = run_cli(
            capsys,
            *command,
            *["--query", "p(a) :- r(a, b), s(b, a)", "--input", f"r={good}"],
            *["--input", f"s={bad}", "--state", str(state)],
        )
        assert code == 2 and out == []
        assert_one_line(err, f"wcoj: error: {bad} (relation s), line 3, column 2")
        assert files_under(state) == {}


# --- deletions of absent tuples ---------------------------------------------------------------

SIGNED = "src,dst,diff\n1,2,1\n2,3,1\n1,3,2\n7,8,-1\n5,6,-2\n9,9,1\n9,9,-1\n1,2,-1\n1,2,1\n"
SIGNED_EDGES = Counter({(1, 2): 1, (2, 3): 1, (1, 3): 2, (7, 8): -1, (5, 6): -2})


def test_negative_tuples_lists_what_sums_below_zero(fast_spark: SparkSession) -> None:
    rows = [(k, 0, -1) for k in range(30)] + [(1, 0, 1), (1, 0, 1), (50, 1, 5)]
    df = fast_spark.createDataFrame(rows, "c0 long, c1 long, diff long")
    count, examples = negative_tuples(df, limit=3)
    assert count == 29  # (1, 0) sums to +1
    assert examples == [((0, 0), -1), ((2, 0), -1), ((3, 0), -1)]
    assert negative_tuples(df.where("diff > 0")) == (0, [])


@pytest.mark.parametrize("command", ["count", "replay"])
def test_deleting_absent_tuples_is_accepted_and_flagged(
    fast_spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    path = write(tmp_path / "signed.csv", SIGNED)
    extra = ["--epochs", "1"] if command == "replay" else []
    code, out, err = run_cli(
        capsys, command, "--query", "2-paths", "--input", f"edge={path}", *extra, "--json"
    )
    assert code == 0, err
    if command == "count":  # the engine reports what the epoch left negative
        assert_one_line(
            err,
            "wcoj: warning: epoch 0 deleted tuples relation 'edge' did not hold; "
            "2 now have a negative multiplicity",
            "(5, 6): -2, (7, 8): -1",
        )
    else:
        assert_one_line(
            err,
            f"wcoj: warning: {path} (relation edge): 2 tuple(s) have a negative multiplicity",
            "(5, 6) -2; (7, 8) -1",
        )
    payload = json.loads(out[-1])
    assert payload["negative_tuples"] == {"edge": 2}
    expected = sum(naive_eval(builtin("2-paths"), {"edge": SIGNED_EDGES}).values())
    assert payload["count" if command == "count" else "final_count"] == expected


def test_files_without_negative_tuples_give_no_warning(
    fast_spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(tmp_path / "e.csv", "a,b,diff\n1,2,2\n2,3,1\n2,3,-1\n")
    code, out, err = run_cli(
        capsys, "count", "--query", "2-paths", "--input", f"edge={path}", "--json"
    )
    assert code == 0 and err == []
    assert json.loads(out[-1])["negative_tuples"] == {}


# --- bad queries --------------------------------------------------------------------------------

# (id, query, relations given, fragments of the one-line error)
BAD_QUERIES: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = [
    ("syntax", "p(a) :- edge(a b)", ("edge",), ("query line 1, column 16", "found 'b'")),
    ("syntax-line-2", "p(a) :-\n edge(a, b),, edge(b, a)", ("edge",), ("query line 2, column 13",)),
    ("unknown-builtin", "triangle", ("edge",), ("unknown built-in query 'triangle'",)),
    (
        "arity",
        "p(a) :- edge(a, b), edge(a)",
        ("edge",),
        ("query line 1, column 21", "arity 1 (edge(a)) but with arity 2"),
    ),
    (
        "unbound-head",
        "p(a, z) :- edge(a, b)",
        ("edge",),
        ("query line 1, column 6", "head variable 'z'"),
    ),
    (
        "unbound-filter",
        "p(a) :- edge(a, b), a < z",
        ("edge",),
        ("query line 1, column 21", "filter a < z uses variable 'z'"),
    ),
    ("two-constants", "p(a) :- edge(a, b), 1 < 2", ("edge",), ("compares two constants",)),
    ("no-atom", "p() :- 1 < a", ("edge",), ("needs at least one atom",)),
    (
        "relation-without-input",
        "p(a) :- edge(a, b), w(b)",
        ("edge",),
        ("uses relation 'w', but no --input gives it",),
    ),
    (
        "input-not-used",
        "p(a) :- edge(a, b)",
        ("edge", "other"),
        ("--input gives relation 'other', which query p does not use",),
    ),
]


@pytest.mark.parametrize(
    ("query", "relations", "fragments"),
    [pytest.param(q, r, f, id=i) for i, q, r, f in BAD_QUERIES],
)
def test_bad_queries_are_refused_before_spark(
    capsys: pytest.CaptureFixture[str],
    no_spark: None,
    tmp_path: Path,
    query: str,
    relations: tuple[str, ...],
    fragments: tuple[str, ...],
) -> None:
    edges = write(tmp_path / "e.txt", "1 2\n")
    inputs = [arg for rel in relations for arg in ("--input", f"{rel}={edges}")]
    state = tmp_path / "state"
    code, out, err = run_cli(capsys, "count", "--query", query, *inputs, "--state", str(state))
    assert code == 2 and out == []
    assert_one_line(err, "wcoj: error: ", *fragments)
    assert not state.exists(), "the state directory is not even created"


# --- bad changes and queries in an engine's context ------------------------------------------


@pytest.fixture(scope="module")
def two_epochs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state of the triangles query holding two epochs, built once for the module."""
    state = tmp_path_factory.mktemp("two_epochs") / "state"
    engine = Engine(spark, str(state), builtin("triangles"))
    schema = "c0 long, c1 long, diff long"
    first = [(a, b, 1) for a, b in ((1, 2), (2, 3), (1, 3))]
    engine.apply(0, {"edge": spark.createDataFrame(first, schema)})
    engine.apply(1, {"edge": spark.createDataFrame([(3, 4, 1)], schema)})
    return state


@pytest.fixture()
def engine_state(fast_spark: SparkSession, two_epochs: Path, tmp_path: Path) -> tuple[Engine, Path]:
    """An engine over this test's own copy of the two-epoch state."""
    state = tmp_path / "state"
    shutil.copytree(two_epochs, state)
    return Engine(fast_spark, str(state), builtin("triangles")), state


def test_changes_for_an_unknown_relation_change_nothing(
    fast_spark: SparkSession, engine_state: tuple[Engine, Path]
) -> None:
    engine, state = engine_state
    before = files_under(state)
    schema = "c0 long, c1 long, diff long"
    changes = {
        "edge": fast_spark.createDataFrame([(5, 6, 1)], schema),
        "friends": fast_spark.createDataFrame([(1, 2, 1)], schema),
    }
    with pytest.raises(QueryError, match="changes given for relation 'friends', which no query"):
        engine.apply(2, changes)
    assert files_under(state) == before


def test_changes_with_wrong_columns_change_nothing(
    fast_spark: SparkSession, engine_state: tuple[Engine, Path]
) -> None:
    engine, state = engine_state
    before = files_under(state)
    bad = fast_spark.createDataFrame([(5, 6, 1)], "src long, dst long, diff long")
    with pytest.raises(InputError) as caught:
        engine.apply(2, {"edge": bad})
    message = str(caught.value)
    assert message.startswith("relation 'edge' at epoch 2: ")
    assert "missing ['c0', 'c1']" in message and "unexpected ['src', 'dst']" in message
    assert files_under(state) == before


def test_a_query_with_another_arity_than_the_state_changes_nothing(
    fast_spark: SparkSession, engine_state: tuple[Engine, Path]
) -> None:
    _, state = engine_state
    before = files_under(state)
    ternary = parse_query("triangles(a, b, c) :- edge(a, b, c)")
    with pytest.raises(StateError, match="holds relation 'edge' as a bag of arity 2; this run"):
        Engine(fast_spark, str(state), ternary).apply(
            2,
            {
                "edge": fast_spark.createDataFrame(
                    [(1, 2, 3, 1)], "c0 long, c1 long, c2 long, diff long"
                )
            },
        )
    assert files_under(state) == before


def test_two_queries_with_clashing_arities_are_refused(
    fast_spark: SparkSession, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    queries = [parse_query("p(a) :- edge(a, b)"), parse_query("q(a) :- edge(a, b, c)")]
    with pytest.raises(QueryError, match="relation 'edge' has arity 2 in one query and 3 in 'q'"):
        Engine(fast_spark, str(state), queries)
    assert files_under(state) == {}


def test_a_static_evaluation_needs_every_relation(fast_spark: SparkSession, tmp_path: Path) -> None:
    edges = fast_spark.createDataFrame([(1, 2, 1)], "c0 long, c1 long, diff long")
    query = parse_query("p(a) :- edge(a, b), w(b)")
    with pytest.raises(QueryError, match="no input given for relation\\(s\\) w of p"):
        evaluate_static(fast_spark, query, {"edge": edges}, str(tmp_path / "state"))
    assert files_under(tmp_path / "state") == {}


# --- fuzzing the file readers -------------------------------------------------------------------

_TEXT_SAMPLES = [
    "# Directed graph\n# FromNodeId\tToNodeId\n1\t2\n2 3\n\n1\t2\n",
    "1 2 3\r\n-4 5 +6\r\n",
    "7\n8\n",
]
_CSV_SAMPLES = [
    "a,b\n1,2\n2,3\n",
    "src,dst,diff\n1,2,1\n3,4,-1\n",
    'x,"y",diff\n"1",2,3\n',
    "a,time,b,diff\n1,0,2,1\n2,1,3,-2\n",
]
_NOISE = st.sampled_from(
    [
        *"0123456789-+ \t\r\n#,.\"'\\xe",
        "\ufeff",
        "\x00",
        "\u2028",
        "\x85",
        "\x0b",
        "\u0663",  # an Arabic-Indic digit
        "\uff11",  # a full-width digit
        "é",
        "9" * 20,
        "nan",
        "diff",
        "time",
        ",,",
        '""',
    ]
)


@st.composite
def mutated(draw: st.DrawFn, samples: list[str]) -> str:
    """A valid sample with a few characters deleted, inserted or replaced."""
    text = draw(st.sampled_from(samples))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["delete", "insert", "replace"]))
        if action == "delete":
            text = text[: max(i - 1, 0)] + text[i:]
        elif action == "insert":
            text = text[:i] + draw(_NOISE) + text[i:]
        else:
            text = text[:i] + draw(_NOISE) + text[i + 1 :]
    return text


@contextlib.contextmanager
def scratch_file(name: str, content: Content) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="wcoj-fuzz-") as folder:
        yield write(Path(folder) / name, content)


def check_read(
    spark: SparkSession, path: Path, arity: int, *, updates: bool = False
) -> list[tuple[int, ...]] | InputError:
    """Read `path` and force the frame: well-formed rows, or an `InputError` saying where.

    The file is also checked and read without Spark (`check_locally`, what the CLI runs first;
    `read_local`): each must accept what Spark accepts, with the same rows, and refuse only
    with Spark's message.
    """
    reader = read_updates if updates else read_relation
    try:
        early = None if updates else check_locally(str(path), arity, "r")
    except InputError as error:
        early = error
    try:
        table = read_local(str(path), arity, "r", with_time=updates)
        local: Counter[tuple[int, ...]] | InputError = Counter(
            zip(*(c.to_pylist() for c in table.columns), strict=True)
        )
    except InputError as error:
        local = error
    try:
        df: DataFrame = reader(spark, str(path), arity, "r")
        rows = [tuple(r) for r in df.collect()]
    except WcojError as error:
        message = str(error)
        assert isinstance(error, InputError), message
        assert message.startswith(f"{path} (relation r)"), message
        assert message.split(": ", 1)[1].strip(), message
        # Spark and the local rescan must agree on which row is bad.
        assert "could not be located" not in message, message
        assert early is None or str(early) == message, (str(early), message)
        assert isinstance(local, InputError), f"read without Spark, refused by Spark: {message}"
        assert_same_refusal(str(local), message)
        return error
    assert early is None, f"refused without Spark but read by Spark: {early}"
    assert local == Counter(rows), f"read otherwise without Spark: {local}"
    width = arity + (2 if updates else 1)
    assert rows, "an accepted file has data rows"
    for row in rows:
        assert len(row) == width and all(isinstance(v, int) for v in row), row
        assert row[-1] != 0, row
    return rows


def expected_text_rows(text: str, arity: int) -> Counter[tuple[int, ...]]:
    """What a text edge list holds, by the module contract, computed without Spark."""
    rows: Counter[tuple[int, ...]] = Counter()
    for line in io.StringIO(text, newline=None):
        fields = line.split()  # accepted lines hold ASCII integers separated by blanks
        if fields and not fields[0].startswith("#"):
            rows[(*map(int, fields), 1)] += 1
    assert all(len(r) == arity + 1 for r in rows)
    return rows


@pytest.mark.parametrize(
    ("last_line", "rows"),
    [(" \t ", 1), ("\x0c", 1), ("\x00", 1), ("1,2,", None), ('1,2,"",3', None)],
    ids=["blanks", "form-feed", "nul", "empty-extra", "dropped"],
)
def test_csv_lines_read_alike_with_and_without_spark(
    fast_spark: SparkSession, tmp_path: Path, last_line: str, rows: int | None
) -> None:
    """Blank lines are skipped by both readers alike; a field past the header (Spark's CSV
    parser dropped it) is refused by both alike: they are one reader."""
    path = write(tmp_path / "e.csv", f"a,b\n1,2\n{last_line}\n")
    result = check_read(fast_spark, path, 2)
    if rows is None:
        assert isinstance(result, InputError) and "fields but the header has 2" in str(result)
    else:
        assert result == [(1, 2, 1)] * rows


@settings(max_examples=READER_EXAMPLES)
@given(content=st.binary(max_size=120), arity=st.integers(1, 3))
def test_fuzz_text_bytes(fast_spark: SparkSession, content: bytes, arity: int) -> None:
    with scratch_file("e.txt", content) as path:
        check_read(fast_spark, path, arity)


@settings(max_examples=READER_EXAMPLES)
@given(text=mutated(_TEXT_SAMPLES), arity=st.integers(1, 3))
def test_fuzz_mutated_text(fast_spark: SparkSession, text: str, arity: int) -> None:
    with scratch_file("e.txt", text) as path:
        result = check_read(fast_spark, path, arity)
    if isinstance(result, list):
        assert Counter(result) == expected_text_rows(text.lstrip("\ufeff"), arity)


@settings(max_examples=READER_EXAMPLES)
@given(text=mutated(_CSV_SAMPLES), arity=st.integers(1, 3), updates=st.booleans())
def test_fuzz_mutated_csv(fast_spark: SparkSession, text: str, arity: int, updates: bool) -> None:
    with scratch_file("e.csv", text) as path:
        check_read(fast_spark, path, arity, updates=updates)


def _valid_parquet() -> bytes:
    sink = pa.BufferOutputStream()
    table = pa.table({"a": _int64(1, 2, 3), "b": _int64(2, 3, 1), "diff": _int64(1, -1, 2)})
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


_PARQUET = _valid_parquet()


@settings(max_examples=READER_EXAMPLES)
@given(
    cut=st.integers(0, len(_PARQUET)),
    flips=st.lists(st.tuples(st.integers(0, len(_PARQUET) - 1), st.integers(1, 255)), max_size=3),
)
def test_fuzz_damaged_parquet(
    fast_spark: SparkSession, cut: int, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(_PARQUET)
    for index, mask in flips:
        data[index] ^= mask
    with scratch_file("e.parquet", bytes(data[: max(cut, 1)])) as path:
        check_read(fast_spark, path, 2)


_ARROW_TYPES = [
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint32(),
    pa.uint64(),
    pa.float64(),
    pa.string(),
    pa.bool_(),
    pa.null(),
    pa.date32(),
]
_COLUMN_NAMES = st.one_of(
    st.sampled_from(["a", "b", "c", "diff", "DIFF", "time", " time ", "c0", "x y", "a.b", "é"]),
    st.text(min_size=1, max_size=6),
)


@st.composite
def arrow_tables(draw: st.DrawFn) -> pa.Table:
    """A small table with random column names, types and values, nulls included."""
    rows = draw(st.integers(0, 4))
    names = draw(st.lists(_COLUMN_NAMES, min_size=1, max_size=4, unique=True))
    columns = []
    for _ in names:
        kind = draw(st.sampled_from(_ARROW_TYPES))
        seed = draw(st.integers(0, 2**32))
        values = _random_values(kind, rows, random.Random(seed))
        columns.append(pa.array(values, kind))
    return pa.Table.from_arrays(columns, names=names)


def _random_values(kind: pa.DataType, rows: int, rng: random.Random) -> list[object]:
    def one() -> object:
        if pa.types.is_null(kind) or rng.random() < 0.15:
            return None
        if pa.types.is_integer(kind):
            info = (
                (0, 2 ** (kind.bit_width) - 1)
                if pa.types.is_unsigned_integer(kind)
                else (-(2 ** (kind.bit_width - 1)), 2 ** (kind.bit_width - 1) - 1)
            )
            return rng.choice([0, 1, -1 if info[0] else 2, info[0], info[1]])
        if pa.types.is_floating(kind):
            return rng.choice([0.5, float("nan"), 1.0])
        if pa.types.is_string(kind):
            return rng.choice(["1", "x", ""])
        if pa.types.is_boolean(kind):
            return rng.random() < 0.5
        return rng.randrange(0, 20000)  # date32: days since 1970

    return [one() for _ in range(rows)]


@settings(max_examples=READER_EXAMPLES)
@given(table=arrow_tables(), arity=st.integers(1, 3), updates=st.booleans())
def test_fuzz_parquet_columns(
    fast_spark: SparkSession, table: pa.Table, arity: int, updates: bool
) -> None:
    with scratch_file("e.parquet", table) as path:
        check_read(fast_spark, path, arity, updates=updates)


# --- fuzzing the query checks -------------------------------------------------------------------

_VARS = ["a", "b", "c", "z"]


@st.composite
def query_texts(draw: st.DrawFn) -> tuple[str, dict[str, int]]:
    """Query text built from random parts, often invalid; with the first column of each part."""
    head = draw(st.lists(st.sampled_from(_VARS), max_size=3))
    term = st.one_of(st.sampled_from(_VARS[:3]), st.integers(-5, 5).map(str))
    atom = st.tuples(st.sampled_from(["e", "f"]), st.lists(term, max_size=3))
    filt = st.tuples(term | st.just("z"), st.sampled_from(["<", "!=", "="]), term | st.just("z"))
    body = draw(st.lists(st.one_of(atom, filt), min_size=1, max_size=4))
    text = f"q({', '.join(head)}) :- "
    columns: dict[str, int] = {}
    for i, var in enumerate(head):
        columns.setdefault(f"head {var}", 3 + sum(len(v) + 2 for v in head[:i]))
    parts = []
    for index, item in enumerate(body):
        start = len(text) + sum(len(p) + 2 for p in parts) + 1
        if len(item) == 2:
            rel, terms = item
            parts.append(f"{rel}({', '.join(terms)})")
        else:
            parts.append(" ".join(item))
        columns[f"item {index}"] = start
    return text + ", ".join(parts), columns


def _problems(text: str, columns: dict[str, int]) -> list[tuple[str, int]]:
    """The semantic problems of a query built by `query_texts`, in the order they are reported."""
    _, _, body_text = text.partition(" :- ")
    items = body_text.split(", ") if body_text else []
    # Items are atoms "r(t, ...)" or filters "l op r"; split the atoms back from their commas.
    merged: list[str] = []
    for part in items:
        if merged and merged[-1].count("(") > merged[-1].count(")"):
            merged[-1] += ", " + part
        else:
            merged.append(part)
    atoms, filters = [], []
    for index, item in enumerate(merged):
        if "(" in item:
            rel, _, args = item.partition("(")
            terms = [t for t in args.rstrip(")").split(", ") if t]
            atoms.append((rel, terms, columns[f"item {index}"]))
        else:
            left, op, right = item.split(" ")
            filters.append((left, op, right, columns[f"item {index}"]))
    found: list[tuple[str, int]] = []
    for left, _, right, column in filters:
        if not left.isalpha() and not right.isalpha():
            return [("compares two constants", column)]
    if not atoms:
        return [("needs at least one atom", filters[0][3])]
    arities: dict[str, int] = {}
    for rel, terms, column in atoms:
        if arities.setdefault(rel, len(terms)) != len(terms):
            found.append(("a relation has one arity", column))
    bound = {t for _, terms, _ in atoms for t in terms if t.isalpha()}
    head = text[2 : text.index(")")].split(", ") if text[2] != ")" else []
    for var in head:
        if var not in bound:
            found.append((f"head variable {var!r}", columns[f"head {var}"]))
    for left, _, right, column in filters:
        unbound = sorted(v for v in (left, right) if v.isalpha() and v not in bound)
        if unbound:
            found.append((f"uses variable {unbound[0]!r}", column))
    return found


@settings(max_examples=QUERY_EXAMPLES)
@given(query_texts())
def test_fuzz_query_checks_report_the_first_problem_where_it_is(
    built: tuple[str, dict[str, int]],
) -> None:
    text, columns = built
    expected = _problems(text, columns)
    try:
        query = resolve_query(text)
    except QuerySyntaxError as error:  # pragma: no cover - the builder only writes valid syntax
        raise AssertionError(f"{text!r} should parse: {error}") from error
    except QueryError as error:
        assert expected, f"{text!r} was refused: {error}"
        fragment, column = expected[0]
        assert str(error).startswith(f"query line 1, column {column}: "), (text, str(error))
        assert fragment in str(error), (text, str(error))
        return
    assert not expected, f"{text!r} was accepted despite {expected}"
    bound = {v for atom in query.atoms for v in atom.vars}
    assert set(query.head) <= bound
    assert all(f.vars <= bound for f in query.filters)
    assert all(isinstance(v, Var) for v in query.head)


@pytest.fixture(scope="module")
def some_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("inputs") / "e.txt"
    path.write_text("1 2\n")
    return str(path)


@settings(max_examples=QUERY_EXAMPLES)
@given(
    built=query_texts(),
    given_relations=st.lists(st.sampled_from(["e", "f", "g"]), max_size=3, unique=True),
)
def test_fuzz_inputs_against_the_query(
    some_file: str, built: tuple[str, dict[str, int]], given_relations: list[str]
) -> None:
    """Unknown relations: an input the query does not read, or a relation read without input."""
    try:
        query = resolve_query(built[0])
    except QueryError:
        return
    specs = [f"{rel}={some_file}" for rel in given_relations]
    try:
        inputs = parse_inputs(specs, query)
    except QueryError as error:
        # Reported in this order: inputs the query does not read, then relations without input.
        extra = [rel for rel in given_relations if rel not in query.relations]
        missing = [rel for rel in query.relations if rel not in given_relations]
        assert extra or missing
        assert f"relation {(extra or missing)[0]!r}" in str(error), str(error)
        return
    assert set(inputs) == set(query.relations)


@settings(max_examples=QUERY_EXAMPLES)
@given(st.one_of(st.text(max_size=60), query_texts().map(lambda built: built[0])))
def test_fuzz_the_cli_reports_every_query_in_one_line(text: str) -> None:
    """`wcoj explain` on any text: the plan (exit 0) or one error line (exit 2), never a crash."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["explain", "--query", text])
    if code == 0:
        assert out.getvalue().startswith("query ") and err.getvalue() == ""
        return
    assert code == 2, err.getvalue()
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wcoj: error: ") and len(lines[0]) > 13
    assert out.getvalue() == ""
