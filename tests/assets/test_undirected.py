"""An edge list landed in one direction, as a user lands it, through the pipeline; then read back.

The scenario declares ``edge`` undirected (a set, by default) and starts its epochs on 2024-03-01.
Each landed change ``(a, b, diff)`` stands for an edge in no direction: epoch 0 lands a SNAP edge
list, epoch 1 a Parquet file with deletions and a self-loop, epoch 2 a CSV file of the edges
written the other way round. Every output must equal the oracle on the undirected set graph, on
both deployments (the kernel on the driver, and on Spark's executors; the landed files are read
by pyarrow either way). The same runs are then checked for Dagster's standard metadata, and read
by assets of a user's own through the IO manager.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest
from dagster import AssetKey, Definitions, MaterializeResult, asset, materialize
from pyspark.sql import DataFrame, SparkSession
from wcoj_support import (
    Changes,
    Pipeline,
    checks,
    failures,
    materializations,
    multiset,
    oracle,
    set_edges,
    set_oracle,
    updates,
)

from wcoj_assets.report import INTERNAL

START = "2024-03-01"
EPOCHS = 3
LOOP: Changes = [((4, 4), 1)]


@dataclass
class Scenario:
    pipeline: Pipeline
    landed: list[Changes]
    results: list
    deployment: str


@pytest.fixture(scope="module", params=["driver", "executors"])
def scenario(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Scenario]:
    previous = spark.conf.get("spark.sql.codegen.wholeStage")
    spark.conf.set("spark.sql.codegen.wholeStage", "false")
    p = Pipeline(
        spark,
        tmp_path_factory.mktemp("undirected"),
        deployment=request.param,
        undirected=["edge"],
        start=START,
    )
    both = updates(seed=13, epochs=EPOCHS)
    one_way = [[(e, d) for e, d in ups if e[0] < e[1]] for ups in both]
    landed = [
        one_way[0],
        [*one_way[1], *LOOP],
        [((b, a), d) for (a, b), d in one_way[2]],
    ]
    for n, fmt in enumerate(("txt", "parquet", "csv")):
        p.land(n, landed[n], fmt)
    results = [p.run(n) for n in range(EPOCHS)]
    yield Scenario(p, landed, results, request.param)
    spark.conf.set("spark.sql.codegen.wholeStage", previous or "true")


def test_one_direction_edges_give_the_undirected_answer(scenario: Scenario) -> None:
    p = scenario.pipeline
    for result in scenario.results:
        assert result.success, failures(result)
        assert all(c.passed for c in checks(result)), [c for c in checks(result) if not c.passed]
        assert {m.partition for m in materializations(result)} <= {
            p.epochs.key(n) for n in range(EPOCHS)
        }
    for t in range(EPOCHS):
        expected = set_oracle(p.topology, "triangles", scenario.landed, t)
        assert p.output("triangles", t) == expected, t
    edges = scenario.landed
    assert sum(set_oracle(p.topology, "triangles", edges, EPOCHS - 1).values()) > 0
    # The same edges landed without declaring them undirected miss most triangles: with a < b
    # kept, edge(b, c) and edge(a, c) are never both there for a < b < c... only by chance.
    one_way = oracle(p.topology, "triangles", scenario.landed, EPOCHS - 1)
    assert one_way != set_oracle(p.topology, "triangles", edges, EPOCHS - 1)


def test_the_run_log_and_ignored_rows_speak_in_edges(tmp_path: Path) -> None:
    """The run's line per epoch counts edges (the engine holds each edge both ways), and
    `ignored` names a landed row once, not once per direction."""
    p = Pipeline(None, tmp_path, undirected=["edge"], start=START)
    p.land(0, [((1, 2), 1), ((2, 3), 1), ((1, 3), 1)], "csv")
    p.land(1, [((1, 2), 1), ((3, 2), 1), ((3, 4), 1)], "csv")  # two present, one either way
    for n, edges in enumerate((3, 1)):
        result = p.run(n)
        assert result.success, failures(result)
        said = [e.user_message for e in p.instance.all_logs(result.run_id)]
        line = f"epoch {n} ({p.epochs.key(n)}): edge {edges} edges changed; triangles 1 "
        assert any(line in m for m in said), said
    (deltas,) = [m for m in materializations(result) if m.asset_key.path == ["edge_deltas"]]
    assert deltas.metadata["ignored (already present)"].value == 2
    assert deltas.metadata["ignored"].value == ["(1, 2): landed +", "(2, 3): landed +"]


def test_the_dropped_self_loop_is_reported(scenario: Scenario) -> None:
    (deltas,) = [
        m
        for m in materializations(scenario.results[1])
        if m.asset_key.to_user_string() == "edge_deltas"
    ]
    assert deltas.metadata["self-loops dropped"].value == 1
    for n in (0, 2):
        (deltas,) = [
            m
            for m in materializations(scenario.results[n])
            if m.asset_key.to_user_string() == "edge_deltas"
        ]
        assert "self-loops dropped" not in deltas.metadata


HEAD = ["a", "b", "c", "diff"]
COLUMNS = {
    "edge_deltas": ["src", "dst", "diff"],  # as the landed CSV's header names them
    "edge_snapshot": ["src", "dst", "diff"],
    "edge_forward": ["c0", "c1", "diff"],
    "edge_reverse": ["c1", "c0", "diff"],
    "edge_counts_c0": ["c0", "diff"],
    "edge_counts_c1": ["c1", "diff"],
    "triangles_rule_0": HEAD,
    "triangles_rule_1": HEAD,
    "triangles_rule_2": HEAD,
    "triangles_deltas": HEAD,
    "triangles": HEAD,
}


def test_materializations_carry_dagsters_standard_metadata(scenario: Scenario) -> None:
    p = scenario.pipeline
    last = EPOCHS - 1
    by_asset = {m.asset_key.to_user_string(): m for m in materializations(scenario.results[last])}
    assert set(by_asset) == set(COLUMNS)
    for name, m in by_asset.items():
        schema = m.metadata["dagster/column_schema"].schema
        assert [c.name for c in schema.columns] == COLUMNS[name], name
        assert {c.type for c in schema.columns} == {"long"}, name
        uri = m.metadata["dagster/uri"].value
        assert uri.startswith("file://") and Path(urlparse(uri).path).is_dir(), (name, uri)
        assert Path(urlparse(uri).path).is_relative_to(p.storage), (name, uri)
    rows = {n: m.metadata["dagster/row_count"].value for n, m in by_asset.items()}
    expected = set_oracle(p.topology, "triangles", scenario.landed, last)
    assert rows["triangles"] == len(expected)
    assert by_asset["triangles"].metadata["count"].value == sum(expected.values())
    deltas = by_asset["edge_deltas"].metadata
    assert rows["edge_deltas"] == deltas["edges inserted"].value + deltas["edges deleted"].value
    assert rows["triangles_deltas"] == p.engine.change("triangles", last).num_rows
    edges = set_edges(scenario.landed, last)
    assert rows["edge_snapshot"] == len(edges)  # tuples held as of the epoch, both directions
    assert rows["edge_forward"] >= len(edges)
    assert by_asset["edge_forward"].metadata[INTERNAL].value["bytes"]
    # Labels read as words.
    ran = {by_asset[f"triangles_rule_{i}"].metadata[INTERNAL].value["ran on"] for i in range(3)}
    assert ran == {scenario.deployment}
    depths = {c.metadata["depth"] for c in checks(scenario.results[last]) if "depth" in c.metadata}
    assert depths == {"schema and data"}


def test_a_range_run_gives_each_partition_its_own_figures(scenario: Scenario) -> None:
    p = scenario.pipeline
    result = p.run((0, EPOCHS - 1))  # as a backfill runs it; applying an epoch again is exact
    assert result.success, failures(result)
    uris = set()
    for m in materializations(result):
        t = p.epochs.number(m.partition)
        name = m.asset_key.to_user_string()
        assert m.metadata["epoch"].value == t, (name, m.partition)
        if name == "triangles":
            expected = len(set_oracle(p.topology, "triangles", scenario.landed, t))
            assert m.metadata["dagster/row_count"].value == expected, t
        if name == "edge_deltas":
            changed = m.metadata["edges inserted"].value + m.metadata["edges deleted"].value
            assert m.metadata["dagster/row_count"].value == changed
        if name == "triangles_rule_0":
            if t == 0:  # its later atoms read the edges before epoch 0: nothing to join
                assert "dagster/uri" not in m.metadata and "not run" in m.metadata
            else:
                uris.add(m.metadata["dagster/uri"].value)
    assert len(uris) == EPOCHS - 1  # one batch per epoch it ran
    for t in range(EPOCHS):
        expected = set_oracle(p.topology, "triangles", scenario.landed, t)
        assert p.output("triangles", t) == expected, t


def test_a_downstream_asset_reads_a_query_as_a_dataframe(scenario: Scenario) -> None:
    p = scenario.pipeline
    seen: dict[str, tuple[list[str], Counter, Counter]] = {}

    @asset(partitions_def=p.epochs.partitions())
    def top_triangles(context, triangles: DataFrame, triangles_deltas: DataFrame):
        seen[context.partition_key] = (
            triangles.columns,
            multiset(triangles),
            multiset(triangles_deltas),
        )
        return MaterializeResult(metadata={"rows": triangles.count()})

    @asset
    def latest_triangles(triangles: DataFrame):  # no partitions: the last epoch's output
        seen["latest"] = (triangles.columns, multiset(triangles), Counter())
        return MaterializeResult()

    upstream = list(p.defs.assets or [])
    edges = scenario.landed
    for n in range(EPOCHS):
        key = p.epochs.key(n)
        result = materialize(
            [*upstream, top_triangles],
            selection=[top_triangles],
            partition_key=key,
            resources=p.defs.resources,
            instance=p.instance,
        )
        assert result.success
        columns, output, change = seen[key]
        assert columns == HEAD
        assert output == set_oracle(p.topology, "triangles", edges, n)
        before = set_oracle(p.topology, "triangles", edges, n - 1) if n else Counter()
        after = set_oracle(p.topology, "triangles", edges, n)
        delta = Counter(after)
        delta.subtract(before)
        assert change == Counter({k: v for k, v in delta.items() if v})
    result = materialize(
        [*upstream, latest_triangles],
        selection=[latest_triangles],
        resources=p.defs.resources,
        instance=p.instance,
    )
    assert result.success
    assert seen["latest"][1] == set_oracle(p.topology, "triangles", edges, EPOCHS - 1)


def test_the_change_is_read_one_epoch_at_a_time(scenario: Scenario) -> None:
    p = scenario.pipeline

    @asset
    def all_changes(triangles_deltas: DataFrame):
        return MaterializeResult()

    defs = Definitions(assets=[*(p.defs.assets or []), all_changes], resources=p.defs.resources)
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        asset_selection=[AssetKey("all_changes")], instance=p.instance, raise_on_error=False
    )
    assert not result.success
    assert any("the change at one epoch" in f for f in failures(result)), failures(result)
