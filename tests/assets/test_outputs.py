"""Assets of your own read a query's output in the type they annotate: Arrow or pandas with no JVM.

A fresh interpreter (so that no test's SparkSession is there) builds the pipeline, runs two
epochs, then materializes two assets of a user's downstream of ``triangles_deltas``: one
annotated ``pyarrow.Table``, one a pandas ``DataFrame``, each with the pipeline's epochs. Both
must receive the epoch's change with the query's variables as columns, equal to the oracle's, and
no JVM may have started. The slow test builds web-NotreDame's state (8.9 M triangles at epoch 0)
and has a fresh process read that epoch's change as an Arrow table the way the IO manager does:
at most 2 s of CPU (the wall time on an idle machine; on this shared one it is printed), still
without a JVM.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
from dagster._core.definitions.automation_tick_evaluation_context import (
    build_run_requests_with_backfill_policies,
)
from dagster._core.definitions.events import AssetKeyPartitionKey
from wcoj_support import (
    RANGE_END,
    RANGE_START,
    Pipeline,
    oracle,
    set_oracle,
    updates,
    write_landing,
)

from wcoj_assets.provenance import follows_epochs
from wcoj_assets.specs import DEFAULT_SPECS, Topology

START = "2024-03-01"

RUNNER = """
import json, sys
import pandas as pd
import pyarrow as pa
import dagster as dg
from dagster._core.definitions.events import AssetKeyPartitionKey
from dagster._core.definitions.automation_tick_evaluation_context import (
    build_run_requests_with_backfill_policies,
)
from pyspark import SparkContext
from wcoj_assets.definitions import build_definitions
from wcoj_assets.epochs import Epochs

root = sys.argv[1]
pipeline = build_definitions(
    storage=root + "/state", landing=root + "/landing", start="2024-03-01", undirected=["edge"]
)
epochs = Epochs("2024-03-01").partitions()
seen = {}

@dg.asset(partitions_def=epochs)
def as_arrow(triangles_deltas: pa.Table) -> None:
    seen["arrow"] = (type(triangles_deltas).__name__, triangles_deltas.to_pylist())

@dg.asset(partitions_def=epochs)
def as_pandas(triangles_deltas: pd.DataFrame) -> None:
    seen["pandas"] = (type(triangles_deltas).__name__, triangles_deltas.to_dict("records"))

@dg.asset(partitions_def=epochs)
def as_batches(triangles_deltas: pa.RecordBatchReader) -> None:
    seen["batches"] = (type(triangles_deltas).__name__, triangles_deltas.read_all().to_pylist())

readers = [as_arrow, as_pandas, as_batches]
try:  # polars is an optional dependency (the polars extra): tested where it is installed
    import polars as pl

    @dg.asset(partitions_def=epochs)
    def as_polars(triangles_deltas: pl.DataFrame) -> None:
        seen["polars"] = (type(triangles_deltas).__name__, triangles_deltas.to_dicts())

    @dg.asset(partitions_def=epochs)
    def as_lazy_polars(triangles_deltas: pl.LazyFrame) -> None:
        rows = triangles_deltas.collect(engine="streaming").to_dicts()
        seen["lazy_polars"] = (type(triangles_deltas).__name__, rows)

    readers += [as_polars, as_lazy_polars]
except ImportError:
    pass
try:  # so is DuckDB
    import duckdb

    @dg.asset(partitions_def=epochs)
    def as_duckdb(triangles_deltas: duckdb.DuckDBPyRelation) -> None:
        seen["duckdb"] = (type(triangles_deltas).__name__, triangles_deltas.to_arrow_table().to_pylist())

    readers.append(as_duckdb)
except ImportError:
    pass
defs = dg.Definitions.merge(pipeline, dg.Definitions(assets=readers))
job = defs.resolve_job_def("wcoj_epoch_job")
with dg.DagsterInstance.ephemeral() as instance:
    for key in ("2024-03-01", "2024-03-02"):
        assert job.execute_in_process(partition_key=key, instance=instance).success
    mine = defs.resolve_implicit_global_asset_job_def()
    result = mine.execute_in_process(
        partition_key="2024-03-02",
        instance=instance,
        asset_selection=[a.key for a in readers],
    )
    assert result.success
    # A whole form that would not fit is refused before it reads, on one line.
    from wcoj_assets import outputs
    outputs.READ_COPIES = 1 << 40
    refused = mine.execute_in_process(
        partition_key="2024-03-02", instance=instance, asset_selection=[as_arrow.key],
        raise_on_error=False,
    )
    failure = refused.get_step_failure_events()[0].step_failure_data
print(json.dumps({
    "seen": seen, "jvm": SparkContext._gateway is not None,
    "refused": failure.user_failure_data.description, "error": failure.error.message,
}))
"""

TIMER = """
import json, sys, time
started = time.perf_counter()
from wcoj_assets.outputs import Form, read_output
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import DEFAULT_SPECS, Topology
from pyspark import SparkContext

topology = Topology.of(DEFAULT_SPECS, undirected=["edge"])
engine = WcojResource(storage=sys.argv[1]).engine(topology, create=False)
opened, cpu = time.perf_counter(), time.process_time()
table = read_output(engine, topology.query("triangles"), 0, change=True, form=Form.ARROW)
done, cpu = time.perf_counter(), time.process_time() - cpu
print(json.dumps({
    "rows": table.num_rows, "columns": table.column_names, "total": table["diff"].to_numpy().sum().item(),
    "read_seconds": done - opened, "read_cpu_seconds": cpu, "process_seconds": done - started,
    "jvm": SparkContext._gateway is not None,
}))
"""


def run(script: str, *args: str) -> dict:
    ran = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=900
    )
    assert ran.returncode == 0, ran.stderr[-5000:]
    return json.loads(ran.stdout.strip().splitlines()[-1])


def test_assets_annotated_arrow_or_pandas_read_the_change_with_no_jvm(tmp_path: Path) -> None:
    history = updates(seed=41, epochs=2, nodes=8, inserts=12)
    for n, changes in enumerate(history):
        write_landing(tmp_path / "landing", n, changes, "csv", start=START)
    out = run(RUNNER, str(tmp_path))
    assert out["jvm"] is False
    topology = Topology.of(DEFAULT_SPECS, undirected=["edge"])
    before = set_oracle(topology, "triangles", history, 0)
    after = set_oracle(topology, "triangles", history, 1)
    change = Counter(after)
    change.subtract(before)
    expected = {k: v for k, v in change.items() if v}
    assert expected, "the epoch changes the triangles"
    forms = [("arrow", "Table"), ("pandas", "DataFrame"), ("batches", "RecordBatchReader")]
    if importlib.util.find_spec("polars") is not None:
        forms += [("polars", "DataFrame"), ("lazy_polars", "LazyFrame")]
    if importlib.util.find_spec("duckdb") is not None:
        forms.append(("duckdb", "DuckDBPyRelation"))
    assert sorted(out["seen"]) == sorted(f for f, _ in forms)
    for form, name in forms:
        kind, rows = out["seen"][form]
        assert kind == name
        got = {(r["a"], r["b"], r["c"]): r["diff"] for r in rows}
        assert len(got) == len(rows) and got == expected, form
    refused = out["refused"]
    assert "\n" not in refused and "DamagedBatch" not in out["error"]
    assert refused.startswith("triangles_deltas at epoch 1 as a pyarrow.Table: ")
    assert "rows would take" in refused and "over the memory budget of" in refused
    for lazy in ("pyarrow.RecordBatchReader", "polars.LazyFrame", "duckdb.DuckDBPyRelation"):
        assert lazy in refused


def small_state(tmp_path: Path, seed: int = 3) -> tuple:
    """An engine over a small undirected graph's state after three epochs; its history."""
    from wcoj_assets.resources import WcojResource

    history = updates(seed=seed, epochs=3, nodes=10, inserts=14, deletes=4)
    topology = Topology.of(DEFAULT_SPECS, undirected=["edge"])
    engine = WcojResource(storage=str(tmp_path / "state")).engine(topology)
    for n, changes in enumerate(history):
        table = pa.table(
            {
                "c0": [a for (a, _), _ in changes],
                "c1": [b for (_, b), _ in changes],
                "diff": [d for _, d in changes],
            }
        )
        engine.apply(n, {"edge": table}, replace=True)
    return engine, topology, history


FORMS = ["arrow", "pandas", "polars", "batches", "lazy_polars", "duckdb"]
OPTIONAL = {"polars": "polars", "lazy_polars": "polars", "duckdb": "duckdb"}


def form_of(name: str):
    from wcoj_assets.outputs import Form

    if name in OPTIONAL:
        pytest.importorskip(OPTIONAL[name], reason=f"{OPTIONAL[name]} is optional")
    return {
        "arrow": Form.ARROW,
        "pandas": Form.PANDAS,
        "polars": Form.POLARS,
        "batches": Form.BATCHES,
        "lazy_polars": Form.LAZY_POLARS,
        "duckdb": Form.DUCKDB,
    }[name]


def rows_of(got, name: str) -> list[dict]:
    """A form's rows as dicts (a lazy form's read to its end: polars' streaming engine)."""
    if name == "arrow":
        return got.to_pylist()
    if name == "pandas":
        return got.to_dict("records")
    if name == "polars":
        return got.to_dicts()
    if name == "batches":
        return got.read_all().to_pylist()
    if name == "lazy_polars":
        return got.collect(engine="streaming").to_dicts()
    return got.to_arrow_table().to_pylist()


@pytest.mark.parametrize("form", FORMS)
def test_read_output_gives_each_form_the_oracles_change_and_output(
    tmp_path: Path, form: str
) -> None:
    """Each form gives the oracle's change (one row per tuple) and output as of each epoch: a
    whole form one row per tuple, a lazy form the stored rows, whose diffs sum per tuple to its
    multiplicity."""
    from wcoj_assets.outputs import read_output

    wanted = form_of(form)
    engine, topology, history = small_state(tmp_path)
    query = topology.query("triangles")
    for epoch in range(len(history)):
        before = set_oracle(topology, "triangles", history, epoch - 1) if epoch else Counter()
        after = set_oracle(topology, "triangles", history, epoch)
        change = Counter(after)
        change.subtract(before)
        changed = {k: v for k, v in change.items() if v}
        for is_change, expected in ((True, changed), (False, dict(after))):
            rows = rows_of(read_output(engine, query, epoch, change=is_change, form=wanted), form)
            assert rows and list(rows[0]) == ["a", "b", "c", "diff"]
            summed: Counter = Counter()
            for r in rows:
                summed[(r["a"], r["b"], r["c"])] += r["diff"]
            if wanted.whole or is_change:
                assert len(summed) == len(rows)  # one row per tuple
            assert {k: v for k, v in summed.items() if v} == expected, (epoch, is_change)


@pytest.mark.parametrize("form", ["batches", "lazy_polars", "duckdb"])
def test_lazy_forms_read_the_listed_files_checked(tmp_path: Path, form: str) -> None:
    """A lazy form reads exactly the files the manifest lists: a copy dropped beside them is
    not read; a listed file whose bytes changed is `DamagedBatch`, naming it (the reader when
    it reaches the file, polars and DuckDB before the form is given)."""
    from wcoj_assets.outputs import read_output
    from wcoj_core.errors import DamagedBatch
    from wcoj_core.traces import output_trace_name

    wanted = form_of(form)
    engine, topology, _ = small_state(tmp_path)
    query = topology.query("triangles")
    trace = engine.store.current().trace(output_trace_name("triangles"))
    (batch,) = [b for b in trace.batches if b.time == 0]
    folder = Path(engine.store.files.full(batch.path))
    first = folder / batch.files[0].name
    (folder / "part-9-000.snappy.parquet").write_bytes(first.read_bytes())
    rows = rows_of(read_output(engine, query, 0, change=True, form=wanted), form)
    assert sum(r["diff"] for r in rows) == batch.rows == len(rows)
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(DamagedBatch, match=first.name):
        rows_of(read_output(engine, query, 0, change=True, form=wanted), form)


def test_a_whole_form_that_would_not_fit_is_refused_before_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows the manifest lists, at the bytes a whole form holds of each, against the
    budget: over it, one line with the rows, the bytes, the budget and the lazy forms, and no
    file opened; the lazy forms still read it."""
    from wcoj_assets import outputs
    from wcoj_core.budget import BudgetError
    from wcoj_core.store.batches import Batches
    from wcoj_core.traces import output_trace_name

    engine, topology, _ = small_state(tmp_path)
    query = topology.query("triangles")
    rows = outputs.read_output(engine, query, 2, form=outputs.Form.ARROW).num_rows
    listed = sum(
        b.rows for b in engine.store.current().trace(output_trace_name("triangles")).visible(2)
    )
    assert listed >= rows > 0
    # Each row as big as the whole budget: no output of a row or more fits.
    monkeypatch.setattr(outputs, "READ_COPIES", engine.budget.bytes)
    monkeypatch.setattr(outputs, "SUMMED_COPIES", engine.budget.bytes)
    opened: list[str] = []
    monkeypatch.setattr(Batches, "verified_tables", lambda *a, **k: opened.append("read"))
    for form in (outputs.Form.ARROW, outputs.Form.PANDAS):
        with pytest.raises(BudgetError) as refused:
            outputs.read_output(engine, query, 2, form=form)
        message = str(refused.value)
        assert "\n" not in message and not opened
        assert message.startswith(f"triangles at epoch 2 as a {form.value}: {listed:,} rows ")
        assert f"over the memory budget of {engine.budget.describe()}" in message
        assert outputs.LAZY_FORMS in message
    monkeypatch.undo()
    reader = outputs.read_output(engine, query, 2, form=outputs.Form.BATCHES)
    assert sum(b.num_rows for b in reader) == listed


def test_one_stored_batch_is_read_as_written_and_several_are_summed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole read gives one stored batch as the engine wrote it (consolidated, sorted on
    some order of its columns: no sort again) and several summed and sorted (`read_table`):
    the sorting readers' rows either way; a batch it cannot confirm in order (none is written
    so) is read by them."""
    from wcoj_assets import outputs
    from wcoj_core import arrow, state_read
    from wcoj_core.traces import output_trace_name

    def rows(table) -> list[tuple]:
        return sorted(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))

    engine, _, history = small_state(tmp_path, seed=7)
    name = output_trace_name("triangles")
    sorting = {"change": state_read.change_table, "output": state_read.read_table}
    called: list[str] = []
    as_written = 0
    for epoch in range(len(history)):
        for kind, read in sorting.items():
            expected = read(engine, name, epoch)
            monkeypatch.setattr(state_read, "change_table", lambda *a: called.append("c"))
            monkeypatch.setattr(state_read, "read_table", lambda *a: called.append("r"))
            if len(state_read.listed(engine, name, epoch, change=kind == "change")[1]) == 1:
                fast = outputs.whole_table(engine, name, epoch, change=kind == "change")
                assert not called, (epoch, kind)
                assert rows(fast) == rows(expected) and fast.schema == expected.schema
                as_written += 1
            monkeypatch.undo()
            monkeypatch.setattr(arrow, "consolidated", lambda tables, columns: False)
            assert outputs.whole_table(engine, name, epoch, change=kind == "change").equals(
                expected
            )
            monkeypatch.undo()
    assert as_written == len(history) + 1  # every change, and the output at epoch 0


@pytest.mark.slow
def test_web_notredame_change_reads_as_arrow_without_a_jvm(
    shared_data: Path, tmp_path: Path
) -> None:
    from wcoj_assets.resources import WcojResource
    from wcoj_core.input_read import read_local

    topology = Topology.of(DEFAULT_SPECS, undirected=["edge"])
    engine = WcojResource(storage=str(tmp_path / "state")).engine(topology)
    edges = read_local(str(shared_data / "web-NotreDame.txt.gz"), 2, "edge")
    result = engine.apply(0, {"edge": edges}, replace=True)
    triangles = result.count("triangles")
    assert triangles == 8_910_005  # SNAP's figure for web-NotreDame
    started = time.perf_counter()
    out = run(TIMER, str(tmp_path / "state"))
    elapsed = time.perf_counter() - started
    assert out["jvm"] is False
    assert out["rows"] == triangles and out["total"] == triangles
    assert out["columns"] == ["a", "b", "c", "diff"]
    # What the read costs is printed, never asserted: timings are the benchmarks'.
    print(f"web-NotreDame epoch 0 change as Arrow: {out}; whole process {elapsed:.2f} s")


@pytest.mark.parametrize("form", ["arrow", "batches", "lazy_polars", "duckdb"])
def test_an_aggregate_querys_output_in_each_form_sums_to_the_oracles_values(
    tmp_path: Path, form: str
) -> None:
    """Triangles per vertex (``count()`` in its head) as of each epoch: whole, one row per
    vertex with its value named ``count``; lazy, the stored changes of the values, which sum per
    vertex to them. Both equal each vertex's triangles in the oracle's."""
    from wcoj_assets.outputs import read_output
    from wcoj_assets.resources import WcojResource
    from wcoj_assets.specs import QuerySpec
    from wcoj_core.query.builtins import BUILTINS

    wanted = form_of(form)
    specs = (*DEFAULT_SPECS, QuerySpec("per_vertex", BUILTINS["triangles-per-vertex"], ("edge",)))
    topology = Topology.of(specs, undirected=["edge"])
    engine = WcojResource(storage=str(tmp_path / "state")).engine(topology)
    history = updates(seed=11, epochs=3, nodes=10, inserts=14, deletes=4)
    for n, changes in enumerate(history):
        columns = {"c0": [a for (a, _), _ in changes], "c1": [b for (_, b), _ in changes]}
        engine.apply(n, {"edge": pa.table({**columns, "diff": [d for _, d in changes]})})
    for epoch in range(len(history)):
        expected: Counter = Counter()
        for (a, b, c), k in set_oracle(topology, "triangles", history, epoch).items():
            for v in (a, b, c):
                expected[v] += k
        query = topology.query("per_vertex")
        rows = rows_of(read_output(engine, query, epoch, form=wanted), form)
        assert rows and list(rows[0]) == ["a", "count"]
        summed: Counter = Counter()
        for r in rows:
            summed[r["a"]] += r["count"]
        if wanted.whole:
            assert len(summed) == len(rows)
        assert {k: v for k, v in summed.items() if v} == dict(expected), epoch


def test_an_asset_added_later_fills_the_past_epochs_in_one_run(tmp_path: Path) -> None:
    """A downstream asset added after three epochs ran: the automation's first evaluation
    requests every past epoch it lacks, as ONE run over the range (its single-run backfill
    policy); its parameter annotated ``dict[str, pa.Table]`` gets each epoch's change, each
    partition its own figures, equal to the oracle's. Then nothing more is requested."""
    p = Pipeline(None, tmp_path, start=START)
    history = updates(seed=21, epochs=3)
    for n, ups in enumerate(history):
        p.land(n, ups, "csv")
        assert p.run(n).success

    @dg.asset(
        partitions_def=p.epochs.partitions(),
        automation_condition=follows_epochs(),
        backfill_policy=dg.BackfillPolicy.single_run(),
    )
    def net_triangles(context, triangles_deltas: dict[str, pa.Table]) -> dg.MaterializeResult:
        for key, change in triangles_deltas.items():
            net = sum(change.column("diff").to_pylist())
            context.add_asset_metadata({"net": net}, partition_key=key)
        return dg.MaterializeResult()

    defs = dg.Definitions.merge(p.defs, dg.Definitions(assets=[net_triangles]))
    first = dg.evaluate_automation_conditions(defs=defs, instance=p.instance)
    keys = [p.epochs.key(n) for n in range(3)]
    assert sorted(first.get_requested_partitions(net_triangles.key)) == keys
    # The automation sensor submits a tick's requests as one asset backfill, which makes its
    # runs as the asset's backfill policy says: one run over the range.
    (request,) = build_run_requests_with_backfill_policies(
        [AssetKeyPartitionKey(net_triangles.key, k) for k in keys],
        defs.resolve_asset_graph(),
        p.instance,
    )
    assert (request.tags[RANGE_START], request.tags[RANGE_END]) == (keys[0], keys[-1])

    job = defs.resolve_implicit_global_asset_job_def()
    ran = job.execute_in_process(
        instance=p.instance, asset_selection=[net_triangles.key], tags=dict(request.tags)
    )
    assert ran.success
    nets = {
        e.event_specific_data.materialization.partition: e.event_specific_data.materialization.metadata[
            "net"
        ].value
        for e in ran.all_events
        if e.event_type_value == "ASSET_MATERIALIZATION"
    }
    totals = [sum(oracle(p.topology, "triangles", history, n).values()) for n in range(3)]
    assert nets == {keys[n]: totals[n] - (totals[n - 1] if n else 0) for n in range(3)}
    again = dg.evaluate_automation_conditions(defs=defs, instance=p.instance, cursor=first.cursor)
    assert again.get_requested_partitions(net_triangles.key) == set()
