"""A downstream asset over a big epoch's change: triangles per vertex in a lazy form, within memory,
and the whole table refused under a limit it cannot meet (issue 45's targets).

Usage: ``python scripts/downstream_memory.py STATE OUT [--limit 6g] [--memory 2g]
[--forms batches,lazy_polars,duckdb] [--baseline CODE_ROOT]``.

`STATE` is a state of the built-in ``triangles`` query over an undirected ``edge`` (e.g. the
18.6 M-edge R-MAT loaded as one epoch: ``wcoj apply --query triangles --state STATE --epoch 0
--changes edge=<edges.parquet> --undirected edge --memory 4g``). Each run is a fresh process,
timed exec to exit with its anonymous memory sampled (`wcoj_bench.infra.measure.run_process`:
the peak ``RssAnon``), that builds the pipeline's definitions over `STATE` (resource budget
``--memory``) and materializes, in an ephemeral instance, the partition of epoch 0 of one asset
of a user's that takes ``triangles_deltas``:

* for each lazy form (``--forms``), ``triangles_per_vertex`` — per vertex, the summed ``diff`` of
  the triangles it is in — written to ``OUT/<form>.parquet``; the forms must agree exactly, and
  their sum must be three times the engine's own count (the output's figures in the manifest);
* ``whole`` — the change annotated ``pa.Table`` under an address-space limit of ``--limit``
  (``RLIMIT_AS``; the resource's default budget, a quarter of it): it must fail with a message
  naming the lazy forms, never ``DamagedBatch``;
  with ``--baseline`` (another checkout, e.g. ``git archive main``, its compiled kernel copied
  in) the same run on that code, side by side.

Prints one JSON object (also ``OUT/report.json``) with the load average before and after. A
script, not a benchmark part: figures go to docs/benchmarks.md with the load average.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from wcoj_bench.infra.measure import run_process

RUN = """
import json, resource, sys, time
code, state, form, out, memory, limit = sys.argv[1:7]
if code:
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, code)
import dagster as dg
import pyarrow as pa
from wcoj_assets.definitions import build_definitions
from wcoj_assets.epochs import Epochs

START = "2024-03-01"
epochs = Epochs(START).partitions()
said = {}


def per_vertex_arrow(reader):
    def summed(table):
        return table.group_by("vertex").aggregate([("diff", "sum")]).rename_columns(["vertex", "diff"])

    parts, held = [], 0
    for batch in reader:  # a record batch at a time; partial sums merged once they grow
        diffs = batch.column("diff")
        table = pa.table({"vertex": pa.concat_arrays([batch.column(c) for c in "abc"]),
                          "diff": pa.concat_arrays([diffs] * 3)})
        parts.append(summed(table))
        held += parts[-1].num_rows
        if held > 1 << 22:
            parts = [summed(pa.concat_tables(parts))]
            held = parts[0].num_rows
    return summed(pa.concat_tables(parts))


if form == "batches":
    @dg.asset(partitions_def=epochs, name="triangles_per_vertex")
    def mine(triangles_deltas: pa.RecordBatchReader) -> None:
        said["table"] = per_vertex_arrow(triangles_deltas)
elif form == "lazy_polars":
    import polars as pl

    @dg.asset(partitions_def=epochs, name="triangles_per_vertex")
    def mine(triangles_deltas: pl.LazyFrame) -> None:
        ends = [triangles_deltas.select(vertex=c, diff="diff") for c in "abc"]
        per = pl.concat(ends).group_by("vertex").agg(pl.col("diff").sum())
        said["table"] = per.collect(engine="streaming").to_arrow()
elif form == "duckdb":
    import duckdb

    @dg.asset(partitions_def=epochs, name="triangles_per_vertex")
    def mine(triangles_deltas: duckdb.DuckDBPyRelation) -> None:
        said["table"] = triangles_deltas.query("t", '''
            SELECT vertex, sum(diff)::BIGINT AS diff FROM (
                SELECT a AS vertex, diff FROM t UNION ALL SELECT b, diff FROM t
                UNION ALL SELECT c, diff FROM t) GROUP BY vertex''').to_arrow_table()
else:
    @dg.asset(partitions_def=epochs, name="triangles_per_vertex")
    def mine(triangles_deltas: pa.Table) -> None:
        said["rows"] = triangles_deltas.num_rows

pipeline = build_definitions(
    storage=state, landing=out + "/landing", start=START, undirected=["edge"], memory=memory or None
)
defs = dg.Definitions.merge(pipeline, dg.Definitions(assets=[mine]))
job = defs.resolve_implicit_global_asset_job_def()
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (int(limit), resource.RLIM_INFINITY))
started = time.perf_counter()
with dg.DagsterInstance.ephemeral() as instance:
    result = job.execute_in_process(
        partition_key=START, instance=instance, asset_selection=[mine.key], raise_on_error=False
    )
report = {"seconds": round(time.perf_counter() - started, 2), "success": result.success}
if not result.success:
    data = result.get_step_failure_events()[0].step_failure_data
    report["error"] = data.error.message.strip()
    report["cause"] = data.error.cause.message.strip() if data.error.cause else None
if "table" in said:
    import pyarrow.parquet as pq

    table = said["table"].cast(pa.schema([("vertex", pa.int64()), ("diff", pa.int64())]))
    table = table.sort_by("vertex")
    pq.write_table(table, f"{out}/{form}.parquet")
    report.update(vertices=table.num_rows, summed=pa.compute.sum(table["diff"]).as_py())
print(json.dumps(report))
"""


def option(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def run(code: str, state: Path, form: str, out: Path, memory: str, limit: int) -> dict:
    argv = [sys.executable, "-c", RUN, code, str(state), form, str(out), memory, str(limit or "")]
    done = run_process(argv, interval=0.02, check=False)
    report = done.result or {"stderr": done.stderr[-2000:]}
    return {
        **report,
        "wall_seconds": round(done.seconds, 2),
        "cpu_seconds": round(done.cpu_seconds, 2),
        "peak_anon_mib": round(done.tree_anon_bytes / 2**20),
        "load": done.load,
    }


def main() -> None:
    import pyarrow.parquet as pq

    from wcoj_core.budget import parse_size
    from wcoj_core.store.store import Store

    state, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    limit, memory = parse_size(option("--limit", "6g")), option("--memory", "2g")
    forms = option("--forms", "batches,lazy_polars,duckdb").split(",")
    trace = Store.open(state, create=False).current().trace("out/triangles")
    assert trace is not None, f"{state} holds no triangles"
    count = trace.figures_at(0)[1]
    report: dict = {"state": str(state), "count": count, "memory": memory, "limit": limit}
    report["load_before"] = [round(x, 2) for x in os.getloadavg()]
    for form in forms:
        report[form] = got = run("", state, form, out, memory, 0)
        print(form, json.dumps(got), file=sys.stderr, flush=True)
        assert got.get("summed") == 3 * count, f"{form}: {got}"
    tables = [pq.read_table(out / f"{form}.parquet") for form in forms]
    assert all(t.equals(tables[0]) for t in tables), "the lazy forms disagree"
    sides = {"whole": ""}
    if "--baseline" in sys.argv:
        sides["whole_baseline"] = option("--baseline", "")
    for side, code in sides.items():
        report[side] = got = run(code, state, "whole", out, "", limit)
        print(side, json.dumps(got), file=sys.stderr, flush=True)
        if side == "whole":
            assert "DamagedBatch" not in str(got) and "as a lazy form" in got["error"], got
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
