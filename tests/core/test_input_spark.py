"""Reading relations (text, CSV, Parquet, generator specs) and the errors bad files raise.

Every file test runs against both readers: ``spark`` (`read_relation`, `read_updates`; marked
``spark``) and ``local`` (`wcoj_core.input_read.read_local`, no JVM). Both must give the same
rows and the same error.
"""

from __future__ import annotations

import gzip
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from wcoj_core import generate
from wcoj_core.errors import InputError
from wcoj_core.input_read import canonical_undirected_local, read_local
from wcoj_core.input_spark import canonical_undirected, read_relation, read_updates


def write(tmp_path: Path, name: str, content: str | bytes) -> str:
    """Write `content` byte for byte (gzip-compressed when the name ends in .gz)."""
    data = content.encode() if isinstance(content, str) else content
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return str(path)


def write_parquet(tmp_path: Path, name: str, columns: dict[str, pa.Array]) -> str:
    path = tmp_path / name
    pq.write_table(pa.table(columns), path)
    return str(path)


def rows(df: DataFrame) -> Counter[tuple[int, ...]]:
    return Counter(tuple(r) for r in df.collect())


def table_rows(table: pa.Table) -> Counter[tuple[int, ...]]:
    return Counter(zip(*(c.to_pylist() for c in table.columns), strict=True))


def assert_relation_schema(df: DataFrame, columns: list[str]) -> None:
    assert [(f.name, f.dataType, f.nullable) for f in df.schema.fields] == [
        (c, T.LongType(), False) for c in columns
    ]


@dataclass(frozen=True)
class Reader:
    """One of the two readers: Spark's, or the local one (`spark` is None)."""

    spark: SparkSession | None

    def read(self, path: str, arity: int, name: str = "E", *, updates: bool = False) -> Counter:
        """The rows read, after checking the columns: int64 ``c0 ..``, [``time``,] ``diff``."""
        columns = [f"c{i}" for i in range(arity)] + (["time"] if updates else []) + ["diff"]
        if self.spark is None:
            table = read_local(path, arity, name, with_time=updates)
            assert table.column_names == columns
            assert all(t == pa.int64() for t in table.schema.types)
            assert not any(c.null_count for c in table.columns)
            return table_rows(table)
        df = (read_updates if updates else read_relation)(self.spark, path, arity, name)
        assert_relation_schema(df, columns)
        return rows(df)

    def error(self, path: str, arity: int = 2, *, updates: bool = False) -> InputError:
        with pytest.raises(InputError) as caught:
            self.read(path, arity, updates=updates)
        assert "\n" not in str(caught.value)
        return caught.value


@pytest.fixture(params=[pytest.param("spark", marks=pytest.mark.spark), "local"])
def reader(request: pytest.FixtureRequest) -> Reader:
    """Each file test twice: through Spark, and through the local reader (no JVM)."""
    if request.param == "spark":
        return Reader(request.getfixturevalue("spark"))
    return Reader(None)


# --- happy paths --------------------------------------------------------------------------------

SNAP_LIKE = "# Directed graph\n# FromNodeId\tToNodeId\n1\t2\n  # indented comment\n\n2 3\n1\t2\n"


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("tabs.txt", SNAP_LIKE),
        ("crlf.txt", SNAP_LIKE.replace("\n", "\r\n")),
        ("gzipped.txt.gz", SNAP_LIKE),
        ("no_final_newline.tsv", SNAP_LIKE.rstrip("\n")),
        ("no_extension", SNAP_LIKE.replace("\t", "   \t ")),
        ("trailing_blanks.el", SNAP_LIKE.replace("\n", " \t\n")),
    ],
)
def test_text_edge_lists(reader: Reader, tmp_path: Path, name: str, content: str) -> None:
    got = reader.read(write(tmp_path, name, content), 2)
    assert got == Counter({(1, 2, 1): 2, (2, 3, 1): 1})


def test_text_ternary_and_extreme_values(reader: Reader, tmp_path: Path) -> None:
    lo, hi = -(2**63), 2**63 - 1
    path = write(tmp_path, "t.txt", f"{lo} +5 {hi}\n-0 007 3\n")
    assert reader.read(path, 3, "T") == Counter({(lo, 5, hi, 1): 1, (0, 7, 3, 1): 1})


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("bom.txt", "\ufeff1 2\n"),
        ("lone-cr.txt", "# old Mac\r1 2\r\r3\t4"),
        ("mid-comments.txt", "1 2\n# note\n\t# indented\n3 4 # not a field?\n"),
        ("unicode-comment.txt.gz", "# é ∑ \x00\n1 2\n"),
    ],
)
def test_text_quirks_read_alike(reader: Reader, tmp_path: Path, name: str, content: str) -> None:
    """Byte order marks, lone CRs, comments anywhere: each reader sees the same lines."""
    path = write(tmp_path, name, content)
    if "not a field" in content:
        error = reader.error(path)
        assert (error.line, error.column) == (4, 5) and "expected 2 fields, found 6" in str(error)
        return
    expected = {"bom.txt": {(1, 2, 1): 1}, "lone-cr.txt": {(1, 2, 1): 1, (3, 4, 1): 1}}
    assert reader.read(path, 2) == Counter(expected.get(name, {(1, 2, 1): 1}))


@pytest.mark.parametrize("name", ["e.csv", "e.csv.gz"])
def test_csv_without_diff(reader: Reader, tmp_path: Path, name: str) -> None:
    path = write(tmp_path, name, "from,to\r\n1,2\r\n1,2\r\n 3 , 4\r\n")
    assert reader.read(path, 2) == Counter({(1, 2, 1): 2, (3, 4, 1): 1})


def test_csv_with_diff_in_the_middle(reader: Reader, tmp_path: Path) -> None:
    path = write(tmp_path, "e.csv", "x,diff,y\n1,3,2\n5,-2,6\n")
    assert reader.read(path, 2) == Counter({(1, 2, 3): 1, (5, 6, -2): 1})


@pytest.mark.parametrize(
    ("line", "row"),
    [
        ('"1","2"', (1, 2)),
        ('" 1",+2', (1, 2)),  # blanks inside quotes and a leading sign
        ('"-1","2"', (-1, 2)),
        (" 1 ,\t2", (1, 2)),
    ],
)
def test_csv_quoting(reader: Reader, tmp_path: Path, line: str, row: tuple[int, int]) -> None:
    """The dialect (`wcoj_core.input_read.csv_fields`): a quote encloses a whole field."""
    path = write(tmp_path, "e.csv", f"a,b\n{line}\n")
    assert reader.read(path, 2) == Counter({(*row, 1): 1})


@pytest.mark.parametrize("line", ['"1" ,2', '1,"2', '1,2,,"x', '1,2,"",3'])
def test_csv_lines_spark_read_are_refused(reader: Reader, tmp_path: Path, line: str) -> None:
    """Lines Spark's own CSV parser read (blanks after a closing quote, a quote left open,
    fields past the header's dropped): the project's dialect refuses them, on both sides."""
    error = reader.error(write(tmp_path, "e.csv", f"a,b\n{line}\n"))
    assert error.line == 2
    assert "malformed quoting" in str(error) or "fields but the header has 2" in str(error)


def test_csv_header_after_blank_lines(reader: Reader, tmp_path: Path) -> None:
    """Spark drops the first non-blank line as the header; the names come from the first
    non-empty line (here a blank one: one column named ' ')."""
    assert reader.read(write(tmp_path, "e.csv", "\n \na\n5\n"), 1) == Counter({(5, 1): 1})
    assert reader.read(write(tmp_path, "f.csv", "\n\na,b\r\n1,2"), 2) == Counter({(1, 2, 1): 1})


@pytest.mark.parametrize("int_type", [pa.int32(), pa.int64(), pa.int8()])
def test_parquet_integer_columns(reader: Reader, tmp_path: Path, int_type: pa.DataType) -> None:
    path = write_parquet(
        tmp_path,
        "e.parquet",
        {"a": pa.array([1, 1, 7], int_type), "b": pa.array([2, 2, 9], int_type)},
    )
    assert reader.read(path, 2) == Counter({(1, 2, 1): 2, (7, 9, 1): 1})


def test_parquet_unsigned_columns_spark_widens(reader: Reader, tmp_path: Path) -> None:
    columns = {
        "a": pa.array([200], pa.uint8()),
        "b": pa.array([60000], pa.uint16()),
        "c": pa.array([4_000_000_000], pa.uint32()),
    }
    path = write_parquet(tmp_path, "u.parquet", columns)
    assert reader.read(path, 3) == Counter({(200, 60000, 4_000_000_000, 1): 1})


def test_parquet_folder_written_by_pyarrow(reader: Reader, tmp_path: Path) -> None:
    out = tmp_path / "rel"
    out.mkdir()
    pq.write_table(pa.table({"s": [1, 3], "t": [2, 4], "diff": [4, -1]}), out / "part-0.parquet")
    pq.write_table(pa.table({"s": [5], "t": [6], "diff": [1]}), out / "part-1.parquet")
    (out / "_SUCCESS").write_bytes(b"")
    (out / ".hidden").write_bytes(b"not parquet")
    got = reader.read(str(out), 2)
    assert got == Counter({(1, 2, 4): 1, (3, 4, -1): 1, (5, 6, 1): 1})


def test_parquet_directory_with_diff(spark: SparkSession, tmp_path: Path) -> None:
    out = tmp_path / "rel"
    spark.createDataFrame([(1, 2, 4), (3, 4, -1)], "s long, t long, diff long").coalesce(
        1
    ).write.parquet(str(out))
    assert rows(read_relation(spark, str(out), 2, "E")) == Counter({(1, 2, 4): 1, (3, 4, -1): 1})


def test_updates_from_csv_and_parquet(reader: Reader, tmp_path: Path) -> None:
    csv_path = write(tmp_path, "u.csv", "src,dst,time,diff\n1,2,0,1\n1,2,3,-1\n")
    got = reader.read(csv_path, 2, updates=True)
    assert got == Counter({(1, 2, 0, 1): 1, (1, 2, 3, -1): 1})
    pq_path = write_parquet(
        tmp_path,
        "u.parquet",
        {"time": pa.array([5], pa.int32()), "v": pa.array([9]), "diff": pa.array([2])},
    )
    assert reader.read(pq_path, 1, "V", updates=True) == Counter({(9, 5, 2): 1})


CANONICAL = [(1, 2, 1), (2, 1, 1), (3, 3, 1), (5, 4, 2), (6, 7, 1), (7, 6, -1)]


def test_canonical_undirected(spark: SparkSession) -> None:
    df = spark.createDataFrame(CANONICAL, "c0 long, c1 long, diff long")
    assert rows(canonical_undirected(df)) == Counter({(1, 2, 1): 1, (4, 5, 1): 1})


def test_canonical_undirected_local() -> None:
    table = pa.table({n: [r[i] for r in CANONICAL] for i, n in enumerate(("c0", "c1", "diff"))})
    got, loops = canonical_undirected_local(table)
    assert table_rows(got) == Counter({(1, 2, 1): 1, (4, 5, 1): 1}) and loops == 1


@pytest.mark.slow
def test_real_snap_files(reader: Reader, shared_data: Path) -> None:
    facebook = reader.read(str(shared_data / "facebook_combined.txt.gz"), 2, "F")
    assert sum(facebook.values()) == 88234
    grqc = str(shared_data / "ca-GrQc.txt.gz")
    if reader.spark is None:
        assert canonical_undirected_local(read_local(grqc, 2, "G"))[0].num_rows == 14484
    else:
        assert canonical_undirected(read_relation(reader.spark, grqc, 2, "G")).count() == 14484


# --- errors in text files -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "line", "column", "fragment"),
    [
        ("e.txt", "1 2\n3 4 5\n", 2, 5, "expected 2 fields, found 3"),
        ("e.txt", "# c\n1 2\n3\n", 3, 2, "expected 2 fields, found 1"),
        ("e.txt", "1 2\n\n1\tabc\n", 3, 3, "field 2 is not an integer: 'abc'"),
        ("e.txt", "1.0 2\n", 1, 1, "field 1 is not an integer: '1.0'"),
        ("e.txt", "1 9223372036854775808\n", 1, 3, "out of the signed 64-bit range"),
        ("e.txt", "-9223372036854775809 1\n", 1, 1, "out of the signed 64-bit range"),
        ("e.txt.gz", "# h\r\n1\t2\r\n# x\r\n  7\tseven\r\n", 4, 5, "'seven'"),
        ("e.txt", "1 2\r\n2 x", 2, 3, "field 2 is not an integer: 'x'"),
    ],
)
def test_text_errors_name_line_and_column(
    reader: Reader,
    tmp_path: Path,
    name: str,
    content: str,
    line: int,
    column: int,
    fragment: str,
) -> None:
    path = write(tmp_path, name, content)
    error = reader.error(path)
    assert (error.line, error.column) == (line, column)
    assert fragment in str(error)
    assert str(error).startswith(f"{path} (relation E), line {line}, column {column}: ")


def test_long_bad_field_is_truncated(reader: Reader, tmp_path: Path) -> None:
    error = reader.error(write(tmp_path, "e.txt", "1 " + "z" * 500 + "\n"))
    assert (error.line, error.column) == (1, 3)
    assert "zzz..." in str(error) and len(str(error)) < 200


@pytest.mark.parametrize("content", ["", "# only\n# comments\n", "\n  \n"])
def test_text_without_data_rows(reader: Reader, tmp_path: Path, content: str) -> None:
    error = reader.error(write(tmp_path, "e.txt", content))
    assert "has no data rows" in str(error) and error.line is None


def test_missing_file(reader: Reader, tmp_path: Path) -> None:
    for name in ("nope.txt", "nope.csv", "nope.parquet"):
        error = reader.error(str(tmp_path / name))
        assert str(error).endswith(": no such file")


def test_corrupt_gzip_is_an_input_error(reader: Reader, tmp_path: Path) -> None:
    path = tmp_path / "e.txt.gz"
    path.write_bytes(b"this is not gzip")
    assert "cannot be read as text" in str(reader.error(str(path)))
    assert "not a gzip file" in str(reader.error(str(path)))
    path.write_bytes(gzip.compress(b"1 2\n" * 1000)[:-40])
    assert "cannot be read as text" in str(reader.error(str(path)))


def test_text_cannot_carry_updates(reader: Reader, tmp_path: Path) -> None:
    error = reader.error(write(tmp_path, "u.txt", "1 2\n"), updates=True)
    assert "must be CSV or Parquet" in str(error)


# --- errors in CSV files ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "line", "column", "fragment"),
    [
        ("a,b\n1,2\n3,x\n", 3, 2, "value in column 'b' is not an integer: 'x'"),
        ("a,b,diff\n1,2,1\n1,2,0\n", 3, 3, "is zero"),
        ("a,b\r\n1,\r\n", 2, 2, "value in column 'b' is empty"),
        ("a,b\n\n1\n", 3, 2, "has 1 fields but the header has 2"),
        ("a,b\n1,2,3\n", 2, 3, "has 3 fields but the header has 2"),
        ("a,b\n1,99999999999999999999\n", 2, 2, "out of the signed 64-bit range"),
        ("a,b,c\n1,2,3\n", 1, None, "has 3 data columns"),
        ("a,b,time\n1,2,3\n", 1, 3, "must not carry a 'time' column"),
        ("a,diff,b,DIFF\n1,1,2,1\n", 1, 4, "more than one 'diff' column"),
        ("1,2\n3,4\n", 1, 1, "needs a header row"),
    ],
)
def test_csv_errors_name_line_and_column(
    reader: Reader,
    tmp_path: Path,
    content: str,
    line: int,
    column: int | None,
    fragment: str,
) -> None:
    error = reader.error(write(tmp_path, "e.csv", content))
    assert (error.line, error.column) == (line, column)
    assert fragment in str(error)


@pytest.mark.parametrize("content", ["", "a,b\n", "a,b\n\n"])
def test_csv_without_data_rows(reader: Reader, tmp_path: Path, content: str) -> None:
    assert "has no data rows" in str(reader.error(write(tmp_path, "e.csv", content)))


def test_csv_updates_need_time_and_diff(reader: Reader, tmp_path: Path) -> None:
    error = reader.error(write(tmp_path, "u.csv", "a,b,diff\n1,2,1\n"), updates=True)
    assert "needs a 'time' column" in str(error) and error.line == 1


def test_the_first_bad_line_is_named(reader: Reader, tmp_path: Path) -> None:
    """The first line the dialect refuses is named (Spark read lines 2 and 3 and named line
    4; the one reader refuses line 2's blank after a closing quote)."""
    error = reader.error(write(tmp_path, "e.csv", 'a,b\n"1" ,2\n1,"2\n3,x\n'))
    assert (error.line, error.column) == (2, 4) and "malformed quoting" in str(error)


# --- errors in Parquet files --------------------------------------------------------------------


def test_parquet_rejects_non_integer_columns(reader: Reader, tmp_path: Path) -> None:
    path = write_parquet(tmp_path, "e.parquet", {"a": pa.array([1]), "w": pa.array([0.5])})
    error = reader.error(path)
    assert error.column == "w" and "type double" in str(error)


@pytest.mark.parametrize(
    ("columns", "row", "column", "fragment"),
    [
        ({"a": pa.array([1, 2, None]), "b": pa.array([1, 2, 3])}, 3, "a", "is null"),
        (
            {"a": pa.array([1, 2]), "b": pa.array([1, 2]), "diff": pa.array([1, 0])},
            2,
            "diff",
            "is zero",
        ),
        (
            {"a": pa.array([1]), "b": pa.array([1]), "diff": pa.array([None], pa.int64())},
            1,
            "diff",
            "is null",
        ),
    ],
)
def test_parquet_errors_name_row_and_column(
    reader: Reader,
    tmp_path: Path,
    columns: dict[str, pa.Array],
    row: int,
    column: str,
    fragment: str,
) -> None:
    error = reader.error(write_parquet(tmp_path, "e.parquet", columns))
    assert (error.line, error.column) == (row, column)
    assert fragment in str(error)


def test_parquet_shape_errors(reader: Reader, tmp_path: Path) -> None:
    three = write_parquet(tmp_path, "three.parquet", {k: pa.array([1]) for k in "abc"})
    assert "has 3 data columns" in str(reader.error(three))
    timed = {"a": pa.array([1]), "b": pa.array([1]), "time": pa.array([1])}
    assert "'time'" in str(reader.error(write_parquet(tmp_path, "t.parquet", timed)))
    empty = {"a": pa.array([], pa.int64()), "b": pa.array([], pa.int64())}
    assert "has no data rows" in str(reader.error(write_parquet(tmp_path, "z.parquet", empty)))


@pytest.mark.parametrize(
    ("columns", "fragment"),
    [
        ({"a": pa.array([1]), "b": pa.array([None], pa.null())}, "line 1, column b: value is null"),
        ({"a": pa.array([1]), "A": pa.array([2])}, "cannot be read as Parquet"),
        (
            {"a": pa.array([1]), "b": pa.array([1], pa.timestamp("us"))},
            "column b: column 'b' has type timestamp[us]",
        ),
        (
            {"a": pa.array([1]), "b": pa.array([[1]], pa.list_(pa.int64()))},
            "column b: column 'b' has type list<element: int64>",
        ),
        (
            {"a": pa.array([1]), "b": pa.array(["x"]).dictionary_encode()},
            "column b: column 'b' has type string",
        ),
    ],
)
def test_parquet_types_named_as_arrow_names_them(
    reader: Reader, tmp_path: Path, columns: dict[str, pa.Array], fragment: str
) -> None:
    path = write_parquet(tmp_path, "e.parquet", columns)
    assert str(reader.error(path)).startswith(f"{path} (relation E)")
    assert fragment in str(reader.error(path))


def test_unreadable_parquet_is_an_input_error(reader: Reader, tmp_path: Path) -> None:
    error = reader.error(write(tmp_path, "e.parquet", "1 2\n3 4\n"))
    assert "cannot be read as Parquet" in str(error)


# --- generated graphs ---------------------------------------------------------------------------


def test_generator_is_deterministic_across_partitioning(spark: SparkSession) -> None:
    spec = "rmat:scale=10,edges=3000,seed=7"
    first = rows(read_relation(spark, spec, 2, "G"))
    assert sum(first.values()) == 3000
    assert all(0 <= v < 2**10 for key in first for v in key[:2])
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        spark.conf.set("spark.sql.shuffle.partitions", "5")
        again = generate.generate(spark, spec, num_partitions=7).repartition(3, "c1")
        assert rows(again) == first
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", str(previous))
    assert rows(read_relation(spark, "rmat:scale=10,edges=3000,seed=8", 2, "G")) != first


def test_generator_is_skewed(spark: SparkSession) -> None:
    df = generate.rmat_edges(spark, scale=12, edges=50_000)
    assert_relation_schema(df, ["c0", "c1", "diff"])
    ends = df.select(F.explode(F.array("c0", "c1")).alias("v"))
    degrees = ends.groupBy("v").count().agg(F.max("count"), F.avg("count")).first()
    assert degrees is not None
    assert degrees[0] > 20 * degrees[1]


def test_spark_scramble_matches_python(spark: SparkSession) -> None:
    values = [0, 1, 2**40 + 3, 2**61 + 12345, 2**62 - 1]
    df = spark.createDataFrame([(v,) for v in values], "v long")
    got = [
        r.x for r in df.select(generate._scramble_column(F.col("v"), 62, 5).alias("x")).collect()
    ]
    assert got == [generate.scramble(v, 62, 5) for v in values]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("rmat:scale=0", "scale must be between 1 and 62"),
        ("rmat:scale=4,edges", "expected key=value"),
        ("rmat:edges=-3", "edges must be a non-negative integer"),
        ("rmat:seed=1,seed=2", "given twice"),
        ("rmat:a=0.9,b=0.2", "a + b + c <= 1"),
        ("rmat:size=3", "unknown key 'size'"),
    ],
)
def test_malformed_generator_specs(spark: SparkSession, spec: str, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment.replace("+", r"\+")):
        read_relation(spark, spec, 2, "G")


def test_generated_relation_must_be_binary(spark: SparkSession) -> None:
    with pytest.raises(InputError, match="arity 3"):
        read_relation(spark, "rmat:scale=4", 3, "T")
