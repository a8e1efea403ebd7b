"""Changes given as Spark DataFrames, Arrow tables or files read by the driver.

The engine's results must not depend on which way its input was read. A relation file read by
the driver (`wcoj_core.input_read.read_local`) gives Spark's rows, or Spark's error.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from oracle import naive_eval
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from wcoj_core.engine import Engine, evaluate_static
from wcoj_core.errors import InputError
from wcoj_core.input_read import read_local
from wcoj_core.input_spark import read_relation
from wcoj_core.query.builtins import builtin
from wcoj_core.query.ir import Query

ROWS = [(1, 2, 1), (2, 3, 1), (1, 3, 2), (3, 4, -1), (2, 4, 1)]


def _rows(table: pa.Table) -> Counter[tuple[int, ...]]:
    return Counter(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))


def test_engine_results_do_not_depend_on_how_the_input_was_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    rng = random.Random(7)
    edges = {(rng.randrange(40), rng.randrange(40)) for _ in range(400)}
    rows = [(a, b, rng.choice([1, 1, 2])) for a, b in sorted(edges) if a != b]
    path = str(tmp_path / "edge")
    spark.createDataFrame(rows, "c0 long, c1 long, diff long").write.parquet(path)
    scan = spark.read.parquet(path)
    query = builtin("directed-triangles")
    want = naive_eval(query, {"edge": {(a, b): d for a, b, d in rows}})
    files = read_local(path, 2, "edge")  # the caller hands the driver the files' rows
    for name, df in [("files", files), ("spark", scan.where(F.lit(True) == F.lit(True)).cache())]:
        result = evaluate_static(spark, query, {"edge": df}, str(tmp_path / name))
        assert result.metrics.deployment == "driver"
        assert _stored_change(spark, tmp_path / name, query, 0) == want, name
    scan.unpersist()
    # A later epoch: every edge deleted. Its rows count against the driver's limit: within it,
    # the driver collects them; over it, the executors read them.
    deletions = str(tmp_path / "deletions")
    spark.createDataFrame(
        [(a, b, -d) for a, b, d in rows], "c0 long, c1 long, diff long"
    ).write.parquet(deletions)
    gone = Counter({k: -v for k, v in want.items()})
    for name, limit, where in [
        ("files", 10_000, "driver"),
        ("spark", len(rows) - 1, "executors"),
    ]:
        engine = Engine(spark, str(tmp_path / name), query, driver_epoch_rows=limit)
        later = engine.apply(1, {"edge": spark.read.parquet(deletions)})
        assert later.metrics.deployment == where
        assert _table_change(engine.change(query.name, 1)) == gone, name


def _stored_change(
    spark: SparkSession, state: Path, query: Query, epoch: int
) -> Counter[tuple[int, ...]]:
    """A query's output change at `epoch`, as the engine stored it in `state`."""
    return _table_change(Engine(spark, str(state), query).change(query.name, epoch))


def _table_change(table: pa.Table) -> Counter[tuple[int, ...]]:
    out: Counter[tuple[int, ...]] = Counter()
    for *data, diff in zip(*(c.to_pylist() for c in table.columns), strict=True):
        out[tuple(data)] += diff
    return Counter({k: v for k, v in out.items() if v})


# -- a landed relation file read by the driver (`read_local`) ----------------------------------


def _write(folder: Path, name: str, table: pa.Table) -> str:
    import pyarrow.parquet as pq

    path = folder / name
    pq.write_table(table, path)
    return str(path)


def test_local_parquet_relations_read_as_spark_reads_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    ints = pa.array([5, 6, 7], pa.int32())
    good = {
        "plain.parquet": pa.table({"a": [1, 2, 3], "b": [2, 3, 1], "diff": [1, -2, 3]}),
        "no_diff.parquet": pa.table({"src": [1, 2, 2], "dst": [2, 3, 3]}),
        "diff_first.parquet": pa.table({"DIFF": [2, 1, 1], "x": [9, 8, 7], "y": [1, 1, 1]}),
        "narrow.parquet": pa.table({"a": ints, "b": pa.array([1, 2, 3], pa.int8())}),
        "unsigned.parquet": pa.table({"a": pa.array([1, 2, 3], pa.uint32()), "b": ints}),
    }
    for name, table in good.items():
        path = _write(tmp_path, name, table)
        got = read_local(path, 2, "edge")
        assert got.column_names == ["c0", "c1", "diff"]
        assert all(t == pa.int64() for t in got.schema.types)
        assert _rows(got) == Counter(
            tuple(r) for r in read_relation(spark, path, 2, "edge").collect()
        ), name
    # A Spark output folder of several files is one relation.
    folder = tmp_path / "folder"
    spark.createDataFrame(ROWS, "c0 long, c1 long, diff long").repartition(3).write.parquet(
        str(folder)
    )
    assert _rows(read_local(str(folder), 2, "edge")) == Counter(ROWS)


def test_what_spark_refuses_is_refused_alike(spark: SparkSession, tmp_path: Path) -> None:
    refused = {
        "null.parquet": pa.table({"a": [1, None], "b": [2, 3]}),
        "zero.parquet": pa.table({"a": [1, 2], "b": [2, 3], "diff": [1, 0]}),
        "text.parquet": pa.table({"a": ["1", "2"], "b": [2, 3]}),
        "float.parquet": pa.table({"a": [1.0, 2.0], "b": [2, 3]}),
        "unsigned.parquet": pa.table({"a": pa.array([1, 2], pa.uint64()), "b": [2, 3]}),
        "empty.parquet": pa.table({"a": pa.array([], pa.int64()), "b": pa.array([], pa.int64())}),
        "time.parquet": pa.table({"a": [1], "b": [2], "time": [3]}),
        "arity.parquet": pa.table({"a": [1], "b": [2], "c": [3]}),
    }
    paths = [_write(tmp_path, name, table) for name, table in refused.items()]
    for path in [*paths, str(tmp_path / "missing.parquet")]:
        with pytest.raises(InputError) as here:
            read_local(path, 2, "edge")
        with pytest.raises(InputError) as there:
            read_relation(spark, path, 2, "edge")
        assert str(here.value) == str(there.value)


def test_changes_given_as_arrow_tables(spark: SparkSession, tmp_path: Path) -> None:
    """An epoch's changes may come as Arrow tables; over the keyed limit they go to Spark."""
    rng = random.Random(11)
    query = builtin("triangles")
    edges = sorted({(rng.randrange(30), rng.randrange(30)) for _ in range(300)})
    first = [(a, b, 1) for a, b in edges if a != b]
    later = [(a, b, -1) for a, b, _ in first[::3]] + [(b, a + 30, 2) for a, b, _ in first[::5]]

    def table(rows: list[tuple[int, int, int]]) -> pa.Table:
        return pa.table({n: [r[i] for r in rows] for i, n in enumerate(("c0", "c1", "diff"))})

    def frame(rows: list[tuple[int, int, int]]) -> DataFrame:
        return spark.createDataFrame(rows, "c0 long, c1 long, diff long")

    changes = {}
    for name, given, limit, where in [
        ("frames", frame, 10_000, "driver"),
        ("tables", table, 10_000, "driver"),
        ("tables-over-limit", table, 10, "executors"),
    ]:
        engine = Engine(spark, str(tmp_path / name), query, driver_epoch_rows=limit)
        engine.apply(0, {"edge": given(first)})
        result = engine.apply(1, {"edge": given(later)})
        assert result.metrics.deployment == where, name
        changes[name] = _table_change(engine.change(query.name, 1))
    before = {(a, b): d for a, b, d in first}
    after = Counter(before)
    for a, b, d in later:
        after[(a, b)] += d
    want = Counter(naive_eval(query, {"edge": after}))
    want.subtract(naive_eval(query, {"edge": before}))
    want = Counter({k: v for k, v in want.items() if v})
    assert want and changes == {name: want for name in changes}
    with pytest.raises(InputError, match="missing"):
        Engine(spark, str(tmp_path / "bad"), query).apply(
            0, {"edge": pa.table({"c0": [1], "c1": [2]})}
        )
