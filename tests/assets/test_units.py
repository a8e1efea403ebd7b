"""Pieces of the pipeline on their own: pandera schemas, the binary-join reference, doctests."""

from __future__ import annotations

import doctest
import importlib
import random
from collections import Counter

import pandas as pd
import pytest
from pandera.config import config_context
from pyspark.sql import SparkSession
from wcoj_support import multiset

from wcoj_assets.schemas import Depth, problems, triples_schema
from wcoj_core.naive import naive_eval
from wcoj_core.query.builtins import BUILTINS
from wcoj_core.query.parse import parse_query
from wcoj_core.reference import compare, reference_output

MODULES = [
    "wcoj_assets.epochs",
    "wcoj_assets.specs",
    "wcoj_assets.intake",
    "wcoj_assets.steps",
    "wcoj_assets.component",
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


@pytest.mark.parametrize("name", ["triangles", "4-cycles", "4-cliques", "directed-triangles"])
def test_provenance_follows_the_dependencies_the_assets_declare(
    small: SparkSession, tmp_path, name: str
) -> None:
    """A rule's batch is stale only through the counts it reads, as of the version it reads.

    The daemon runs a rule at t as soon as the assets it declares are ready; provenance that
    named more (every counts of the query, or counts at t when only t - 1 is read) would report
    a freshly rebuilt rule stale. Checked against `Topology.rule_reads`, which declares the deps.
    """
    from wcoj_assets.specs import QuerySpec, Topology, counts_asset_name
    from wcoj_core.engine import Engine
    from wcoj_core.history import derivations, rule_trace_name
    from wcoj_core.traces import counts_trace_name

    topo = Topology.of([QuerySpec("q", BUILTINS[name], ("edge",))])
    query = topo.query("q")
    engine = Engine(small, str(tmp_path / "state"), topo.queries)
    sources = derivations(engine)
    by_asset = {counts_asset_name(a): counts_trace_name(a) for a in engine.arrangements}
    for atom in range(len(query.atoms)):
        declared = {
            by_asset[asset]: "upto" if 0 in offsets else "before"
            for asset, offsets in topo.rule_reads("q", atom).items()
            if asset in by_asset
        }
        derived = {
            n: mode for n, mode in sources[rule_trace_name("q", atom)] if n.startswith("counts/")
        }
        assert derived == declared, f"rule {atom}"


def test_written_batches_are_checked_from_their_parquet_footers(small, tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wcoj_assets.steps import batch_schema_check
    from wcoj_core.engine import Engine
    from wcoj_core.history import History
    from wcoj_core.query.builtins import builtin
    from wcoj_core.state import Batch

    h = History(Engine(small, str(tmp_path / "state"), builtin("triangles")))
    assert h.local_root is not None
    good = h.ingest(0, "edge", pa.table({"c0": [1, 2], "c1": [2, 1], "diff": [1, 1]}))
    assert batch_schema_check(h, [good], ["c0", "c1"], "edge_deltas").passed

    bad_dir = tmp_path / "state" / "bad"
    bad_dir.mkdir()
    columns = {"c0": pa.array([1], pa.int32()), "c1": pa.array([2], pa.int64())}
    columns |= {"time": pa.array([1], pa.int64()), "diff": pa.array([1], pa.int64())}
    pq.write_table(pa.table(columns), bad_dir / "part-0.parquet")
    (tmp_path / "state" / "empty").mkdir()
    result = batch_schema_check(
        h, [good, Batch("bad", 1, 1), Batch("empty", 2, 0)], ["c0", "c1"], "edge_deltas"
    )
    assert not result.passed
    errors = result.metadata["errors"].value
    assert len(errors) == 2, errors
    assert errors[0].startswith("epoch 1: ") and "int32" in errors[0], errors
    assert errors[1] == "epoch 2: no Parquet file in empty", errors
