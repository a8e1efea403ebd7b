"""Pieces of the pipeline on their own: pandera schemas, the binary-join reference, the Spark
settings of the resource, doctests."""

from __future__ import annotations

import doctest
import importlib
import random
from collections import Counter

import pandas as pd
import pytest
from oracle import naive_eval
from pandera.config import config_context
from pyspark.sql import SparkSession
from wcoj_support import multiset

from wcoj_assets.schemas import Depth, problems, triples_schema
from wcoj_core.query.builtins import BUILTINS
from wcoj_core.query.parse import parse_query
from wcoj_core.reference import compare, reference_output

MODULES = [
    "wcoj_assets.epochs",
    "wcoj_assets.specs",
    "wcoj_assets.graph",
    "wcoj_assets.report",
    "wcoj_assets.checks",
    "wcoj_assets.landing_read",
    "wcoj_assets.demo",
    "wcoj_core.reference",
    "wcoj_assets.resources",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0 and result.attempted > 0


SCHEMA = "c0 long, c1 long, time long, diff long"


def test_good_update_triples_pass_in_full(small: SparkSession) -> None:
    df = small.createDataFrame([(1, 2, 3, 1), (2, 1, 3, -2)], SCHEMA)
    assert problems(df, triples_schema(["c0", "c1"], epoch=3, unique=True), Depth.FULL) == []


@pytest.mark.parametrize(
    "rows, ddl, expected",
    [
        ([(1, 2, 3, 0)], SCHEMA, "not_equal_to(0)"),
        ([(1, None, 3, 1)], SCHEMA, "contains null"),
        ([("x", 2, 3, 1)], "c0 string, c1 long, time long, diff long", "StringType"),
        ([(1, 2, 4, 1)], SCHEMA, "equal_to(3)"),
        ([(1, 2, 3, 1), (1, 2, 3, 2)], SCHEMA, "Duplicated rows"),
        ([(1, 2, 3, 1, 9)], SCHEMA + ", extra long", "not in DataFrameSchema"),
    ],
    ids=["zero-diff", "null", "string-id", "wrong-time", "not-consolidated", "extra-column"],
)
def test_bad_update_triples_are_reported(small: SparkSession, rows, ddl: str, expected: str):
    df = small.createDataFrame(rows, ddl)
    found = problems(df, triples_schema(["c0", "c1"], epoch=3, unique=True), Depth.FULL)
    assert any(expected in p for p in found), found


def test_validation_cannot_be_switched_off_from_outside(small: SparkSession) -> None:
    """pandera.pyspark records errors instead of raising; a disabled config must not hide them."""
    df = small.createDataFrame([(1, 2, 3, 0)], SCHEMA)
    with config_context(validation_enabled=False, validation_depth="SCHEMA_ONLY"):
        found = problems(df, triples_schema(["c0", "c1"], epoch=3), Depth.FULL)
    assert any("not_equal_to(0)" in p for p in found)


def test_schema_only_depth_skips_data_checks(small: SparkSession) -> None:
    df = small.createDataFrame([(1, 2, 4, 0)], SCHEMA)
    schema = triples_schema(["c0", "c1"], epoch=3)
    assert problems(df, schema, Depth.SCHEMA) == []
    wrong = small.createDataFrame([(1, 2, 3, 1)], "c0 int, c1 long, time long, diff long")
    assert any("IntegerType" in p for p in problems(wrong, schema, Depth.SCHEMA))


# The same cases for the pandas twin of each schema (what a small epoch is checked with on the
# driver); pandera.pandas words its errors differently.
LOCAL_CASES = [
    ({"c0": [1], "c1": [2], "time": [3], "diff": [0]}, "not_equal_to(0)"),
    ({"c0": [1], "c1": pd.array([None], dtype="Int64"), "time": [3], "diff": [1]}, "contains null"),
    ({"c0": ["x"], "c1": [2], "time": [3], "diff": [1]}, "to have type int64"),
    ({"c0": [1], "c1": [2], "time": [4], "diff": [1]}, "equal_to(3)"),
    ({"c0": [1, 1], "c1": [2, 2], "time": [3, 3], "diff": [1, 2]}, "not unique"),
    ({"c0": [1], "c1": [2], "time": [3], "diff": [1], "extra": [9]}, "not in DataFrameSchema"),
]


def test_good_update_triples_pass_in_full_locally() -> None:
    df = pd.DataFrame({"c0": [1, 2], "c1": [2, 1], "time": [3, 3], "diff": [1, -2]})
    schema = triples_schema(["c0", "c1"], epoch=3, unique=True, local=True)
    assert problems(df, schema, Depth.FULL) == []


@pytest.mark.parametrize(
    "columns, expected",
    LOCAL_CASES,
    ids=["zero-diff", "null", "string-id", "wrong-time", "not-consolidated", "extra-column"],
)
def test_bad_update_triples_are_reported_locally(columns, expected: str) -> None:
    found = problems(
        pd.DataFrame(columns),
        triples_schema(["c0", "c1"], epoch=3, unique=True, local=True),
        Depth.FULL,
    )
    assert any(expected in p for p in found), found


def test_local_validation_cannot_be_switched_off_and_schema_depth_skips_data() -> None:
    bad = pd.DataFrame({"c0": [1], "c1": [2], "time": [4], "diff": [0]})
    schema = triples_schema(["c0", "c1"], epoch=3, local=True)
    with config_context(validation_enabled=False, validation_depth="SCHEMA_ONLY"):
        found = problems(bad, schema, Depth.FULL)
    assert any("not_equal_to(0)" in p for p in found) and any("equal_to(3)" in p for p in found)
    assert problems(bad, schema, Depth.SCHEMA) == []
    wrong = bad.astype({"c0": "int32"})
    assert any("int32" in p for p in problems(wrong, schema, Depth.SCHEMA))


QUERIES = [
    BUILTINS["triangles"],
    BUILTINS["4-cycles"],
    BUILTINS["2-paths"],
    "loops(a, b) :- edge(a, a), edge(a, b), b != a",
    "fixed(b) :- edge(3, b), edge(b, c), c >= 2",
    "pairs(a, d) :- edge(a, b), other(d, 1, a)",
    "any() :- edge(a, b), edge(b, a)",
    BUILTINS["triangles-per-vertex"],
    "weighed(a, sum(c)) :- edge(a, b), edge(b, c), c > 1",
]


@pytest.mark.parametrize("text", QUERIES)
def test_binary_join_reference_equals_the_naive_oracle(small: SparkSession, text: str) -> None:
    query = parse_query(text)
    rng = random.Random(len(text))
    relations: dict[str, dict[tuple[int, ...], int]] = {}
    for rel, arity in query.relations.items():
        tuples: Counter = Counter()
        for _ in range(40):
            tuples[tuple(rng.randrange(6) for _ in range(arity))] += rng.choice([1, 1, 2, -1])
        relations[rel] = {t: m for t, m in tuples.items() if m}
    frames = {
        rel: small.createDataFrame(
            [(*t, m) for t, m in tuples.items()],
            ", ".join(f"c{i} long" for i in range(query.relations[rel])) + ", diff long",
        )
        for rel, tuples in relations.items()
    }
    got = reference_output(small, query, frames)
    assert multiset(got) == naive_eval(query, relations)
    width = len(query.head)
    assert compare(got, got, [f"c{i}" for i in range(width)]).equal


def test_compare_reports_multiplicity_differences(small: SparkSession) -> None:
    ddl = "c0 long, diff long"
    expected = small.createDataFrame([(1, 2), (2, 1), (3, 1)], ddl)
    actual = small.createDataFrame([(1, 1), (2, 1), (4, 5)], ddl)
    result = compare(expected, actual, ["c0"])
    assert not result.equal
    assert result.mismatches == 3
    assert result.examples == (((1,), 2, 1), ((3,), 1, 0), ((4,), 0, 5))
    assert (result.expected_total, result.actual_total) == (4, 7)


def test_landed_rows_are_checked_in_full_on_the_driver() -> None:
    import pyarrow as pa

    from wcoj_assets.schemas import landed_problems

    good = pa.table({"c0": [1, 2, 1], "c1": [2, 1, 2], "diff": [1, -1, 1]})
    assert landed_problems(good, ["c0", "c1"], 3) == []  # a tuple landed twice is fine
    zero = pa.table({"c0": [1], "c1": [2], "diff": [0]})
    assert any("not_equal_to(0)" in p for p in landed_problems(zero, ["c0", "c1"], 3))
    null = pa.table({"c0": pa.array([1, None], pa.int64()), "c1": [2, 3], "diff": [1, 1]})
    assert any("null" in p for p in landed_problems(null, ["c0", "c1"], 3))


def test_landed_rows_in_spark_are_checked_by_pandera_pyspark(small: SparkSession) -> None:
    from wcoj_assets.schemas import landed_problems

    bad = small.createDataFrame([(1, 2, 0)], "c0 long, c1 long, diff long")
    assert any("not_equal_to(0)" in p for p in landed_problems(bad, ["c0", "c1"], 3))
    good = small.createDataFrame([(1, 2, 1)], "c0 long, c1 long, diff long")
    assert landed_problems(good, ["c0", "c1"], 3) == []


def test_the_resource_takes_spark_settings_from_dagster_pyspark() -> None:
    from dagster_pyspark import LazyPySparkResource

    from wcoj_assets.resources import WcojResource

    lazy = LazyPySparkResource(
        spark_config={"spark.master": "local[1]", "spark.executor.memory": "1g", "spark.a": "x"}
    )
    resource = WcojResource(master="local[*]", spark_conf={"spark.a": "mine"}, pyspark=lazy)
    starter = resource.starter()
    assert starter.master == "local[1]"
    assert starter.conf == {"spark.executor.memory": "1g", "spark.a": "mine"}
    assert not starter.started  # nothing starts Spark until a step needs it
    assert WcojResource().starter().master == "local[*]"


def test_the_resource_stops_only_a_session_it_started(spark: SparkSession) -> None:
    from wcoj_assets.resources import WcojResource

    resource = WcojResource(master=spark.sparkContext.master)
    starter = resource.starter()
    assert starter("a test asked") is spark  # the running session is reused ...
    assert not starter.owned
    starter.stop()  # ... and never stopped by the resource
    assert spark.sparkContext._jsc is not None


def test_landed_files_are_read_by_the_driver_and_by_spark_alike(
    small: SparkSession, tmp_path
) -> None:
    """`read_epoch` reads local files with pyarrow, starting nothing; past its byte limit (or
    for remote files) with Spark, through the starter, saying why."""
    from wcoj_assets.landing_read import read_epoch

    folder = tmp_path / "edge" / "2020-01-02"
    folder.mkdir(parents=True)
    (folder / "a.csv").write_text("src,dst,diff\n1,2,1\n2,3,-1\n")
    (folder / "b.txt").write_text("# edges\n4\t5\n")
    asked: list[str] = []

    def starter(reason: str) -> SparkSession:
        asked.append(reason)
        return small

    local = read_epoch(str(tmp_path), "edge", 2, "2020-01-02", starter)
    assert asked == [] and local.files == 2 and local.count == 3
    by_spark = read_epoch(str(tmp_path), "edge", 2, "2020-01-02", starter, local_bytes=0)
    assert len(asked) == 1 and "landed files of" in asked[0] and "edge at 2020-01-02" in asked[0]
    assert by_spark.count is None
    rows = sorted(tuple(r) for r in by_spark.rows.select("c0", "c1", "diff").collect())
    assert rows == sorted(
        zip(*(local.rows[c].to_pylist() for c in ("c0", "c1", "diff")), strict=True)
    )
    assert read_epoch(str(tmp_path), "edge", 2, "2020-01-09", starter).rows is None


def test_installing_wcoj_alone_brings_every_command_of_the_quick_start() -> None:
    """``pip install -e <clone>``, no extra, installs ``dg`` (the quick start's ``dg scaffold``,
    ``dg check defs``, ``dg dev``) and ``dagster dev``'s webserver: the distributions of those
    commands are among what pyproject.toml's dependencies require, directly or through theirs."""
    import tomllib
    from importlib.metadata import PackageNotFoundError, entry_points, requires
    from pathlib import Path

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    wanted = list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])
    closure: set[str] = set()
    while wanted:
        requirement = Requirement(wanted.pop())
        name = canonicalize_name(requirement.name)
        if name in closure or (
            requirement.marker and not requirement.marker.evaluate({"extra": ""})
        ):
            continue
        closure.add(name)
        try:
            wanted += requires(name) or []
        except PackageNotFoundError:  # an optional platform's package, not installed here
            continue
    scripts = {e.name: e.dist for e in entry_points(group="console_scripts")}
    for command in ("dg", "dagster", "dagster-webserver"):
        dist = scripts[command]
        assert dist is not None and canonicalize_name(dist.name) in closure, command
