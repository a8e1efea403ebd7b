"""What every asset step shares: its epochs, partition mappings, metadata and schema checks.

Every materialization carries Dagster's standard metadata besides wcoj's own figures:
``dagster/row_count`` (the rows the partition holds: the epoch's batch of changes, or for a
query's output the tuples of the output as of the epoch), ``dagster/column_schema`` (the columns a
reader sees: ``c0 ..`` and ``diff`` for a relation or a counts arrangement, the query's head
variables and ``diff`` for its rules, changes and output) and ``dagster/uri`` (where the epoch's
batch is stored; for a relation's snapshot and a query's output, the trace folder whose batches up
to the epoch make it up). Each epoch's values go on its own partition's materialization, also in
a run over a range of epochs (`add_standard_metadata`).

Every asset performs one `wcoj_core.history.History` step per epoch of its run — a pure function
of stored batches that *replaces* the batch at that epoch — and writes with Spark itself: nothing
goes through an IO manager, so a run over a range of epochs never loads its own earlier
partitions. Assets that read their own previous epoch declare it with
`TimeWindowPartitionMapping(-1, -1)`; every step handles a range of epochs (oldest first), so
`BackfillPolicy.single_run()` holds for all of them.
"""

import os
import posixpath
import time as clock
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    Failure,
    MetadataValue,
    PartitionsDefinition,
    TableColumn,
    TableSchema,
    TimeWindowPartitionMapping,
)

# Dagster's typed sets of the standard ``dagster/...`` keys (not re-exported at its top level).
from dagster._core.definitions.metadata.metadata_set import TableMetadataSet, UriMetadataSet

from wcoj_assets.epochs import Epochs
from wcoj_assets.schemas import Depth, problems, triples_schema
from wcoj_assets.specs import head_columns
from wcoj_core.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

    from wcoj_core.history import History
    from wcoj_core.query.ir import Query
    from wcoj_core.state import Batch

CHECK = "update_triples"


def previous_epoch() -> TimeWindowPartitionMapping:
    """The partition before (epoch 0 has none, which is allowed)."""
    return TimeWindowPartitionMapping(-1, -1, allow_nonexistent_upstream_partitions=True)


def epoch_mapping(offsets: frozenset[int]) -> TimeWindowPartitionMapping | None:
    """Identity for {0}, the previous epoch for {-1}, both for {-1, 0}."""
    if offsets == frozenset({0}):
        return None
    return TimeWindowPartitionMapping(
        min(offsets), max(offsets), allow_nonexistent_upstream_partitions=True
    )


def epochs_of(context: Any, epochs: Epochs) -> list[tuple[str, int]]:
    """The (key, epoch) pairs of the step's partitions, oldest first; Failure for a bad key."""
    try:
        pairs = [(key, epochs.number(key)) for key in context.partition_keys]
    except InputError as e:
        raise Failure(description=str(e), allow_retries=False) from e
    return sorted(pairs, key=lambda p: p[1])


def each_epoch(
    context: Any, epochs: Epochs, step: Callable[[int], Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Run `step` for every epoch of the run, oldest first, and stamp its figures.

    Each result is ``{"epoch", "partition", **step(t), "seconds"}``, ready for `summarize`.
    """
    out: list[dict[str, Any]] = []
    for key, t in epochs_of(context, epochs):
        start = clock.perf_counter()
        figures = step(t)
        seconds = round(clock.perf_counter() - start, 3)
        out.append({"epoch": t, "partition": key, **figures, "seconds": seconds})
    return out


def rows_at(history: "History", trace: str, epoch: int) -> int:
    """Rows stored in a trace at one epoch, from the manifest (no Spark work)."""
    found = history.store.current().trace(trace)
    return 0 if found is None else sum(b.rows for b in found.batches if b.time == epoch)


def summarize(per_epoch: Sequence[Mapping[str, Any]], latest: Sequence[str] = ()) -> dict[str, Any]:
    """Materialization metadata: the epoch's figures, or for a range of epochs the totals.

    Figures named in `latest` describe a state (an accumulated output) rather than a change: for
    a range they are the last epoch's.
    """
    if len(per_epoch) == 1:
        return dict(per_epoch[0])
    first, last = per_epoch[0], per_epoch[-1]
    figures: dict[str, Any] = {}
    for k, v in last.items():
        if k in ("epoch", "partition") or not isinstance(v, int | float):
            continue
        figures[k] = v if k in latest else sum(e[k] for e in per_epoch)
    if "seconds" in figures:
        figures["seconds"] = round(figures["seconds"], 3)
    return {
        "epoch": last["epoch"],
        "epochs": f"{first['epoch']}..{last['epoch']}",
        **figures,
        "per_epoch": MetadataValue.json([dict(e) for e in per_epoch]),
    }


def relation_schema(arity: int, diff: str = "signed multiplicity of the tuple") -> TableSchema:
    """The columns of a relation's (or a counts arrangement's) update rows: c0 .., diff.

    >>> [c.name for c in relation_schema(2).columns]
    ['c0', 'c1', 'diff']
    """
    columns = [TableColumn(f"c{i}", "long", f"column {i}") for i in range(arity)]
    return TableSchema([*columns, TableColumn("diff", "long", diff)])


def output_schema(query: "Query") -> TableSchema:
    """The columns of a query's rows as readers see them: its head variables, then diff.

    >>> from wcoj_core.query.builtins import builtin
    >>> [(c.name, c.description) for c in output_schema(builtin("2-paths")).columns][:2]
    [('a', 'head variable a, stored as c0'), ('b', 'head variable b, stored as c1')]
    """
    columns = [
        TableColumn(name, "long", f"head variable {v.name}, stored as c{i}")
        for i, (v, name) in enumerate(zip(query.head, head_columns(query), strict=True))
    ]
    return TableSchema([*columns, TableColumn("diff", "long", "signed multiplicity of the tuple")])


def standard_metadata(schema: TableSchema, uri: str | None, rows: int | None) -> dict[str, Any]:
    """Dagster's ``dagster/column_schema``, ``dagster/uri`` and ``dagster/row_count`` entries.

    A path without a scheme becomes a ``file://`` URI; `uri` or `rows` None leaves its entry out.

    >>> sorted(standard_metadata(relation_schema(1), "/state/traces/r/b-1", 3))
    ['dagster/column_schema', 'dagster/row_count', 'dagster/uri']
    >>> standard_metadata(relation_schema(1), "/state/traces/r/b-1", None)["dagster/uri"]
    'file:///state/traces/r/b-1'
    """
    out: dict[str, Any] = dict(TableMetadataSet(column_schema=schema, row_count=rows))
    if uri is not None:
        out |= dict(UriMetadataSet(uri=uri if "://" in uri else Path(uri).as_uri()))
    return {k: v for k, v in out.items() if v is not None}


def add_standard_metadata(
    context: Any,
    asset: str,
    partition: str,
    schema: TableSchema,
    uri: str | None,
    rows: int | None,
) -> None:
    """`standard_metadata` of one epoch, on the materialization of its partition of `asset`."""
    context.add_asset_metadata(
        standard_metadata(schema, uri, rows), asset_key=asset, partition_key=partition
    )


def batch_uri(history: "History", batch: "Batch") -> str:
    """Where a stored batch's files are."""
    return history.store.uri(batch.path)


def trace_uri(history: "History", trace: str, epoch: int) -> str | None:
    """The folder of a trace's batches, found from its batch at `epoch` (None if it has none)."""
    batch = batch_at(history, trace, epoch)
    return None if batch is None else posixpath.dirname(batch_uri(history, batch).rstrip("/"))


def batch_at(history: "History", trace: str, epoch: int) -> "Batch | None":
    """A trace's batch at `epoch` in the current manifest (no Spark work)."""
    found = history.store.current().trace(trace)
    return next((b for b in found.batches if b.time == epoch), None) if found else None


def explain_md(text: str) -> MetadataValue:
    return MetadataValue.md(f"```\n{text}\n```")


def batch_schema_check(
    history: "History", batches: Sequence["Batch"], columns: Sequence[str], asset_key: str
) -> AssetCheckResult:
    """Schema-only pandera check of stored batches, read back from their files' footers.

    On a local state with the keyed path on, each Parquet file's footer is read with pyarrow and
    checked by the schema's pandas twin (no Spark job per batch); otherwise Spark reads the batch
    and pandera.pyspark checks it.
    """
    root = history.local_root if history.driver_epoch_rows else None
    found: list[str] = []
    if root is not None:
        schema = triples_schema(columns, with_time=True, local=True)
        for batch in batches:
            footers = _footers(os.path.join(root, batch.path))
            if not footers:
                found.append(f"epoch {batch.time}: no Parquet file in {batch.path}")
            for frame in footers:
                found += [f"epoch {batch.time}: {p}" for p in problems(frame, schema, Depth.SCHEMA)]
    else:
        spark = history.engine.spark
        schema = triples_schema(columns, with_time=True)
        for batch in batches:
            df = spark.read.parquet(history.store.uri(batch.path))
            found += [f"epoch {batch.time}: {p}" for p in problems(df, schema, Depth.SCHEMA)]
    return AssetCheckResult(
        asset_key=asset_key,
        check_name=CHECK,
        passed=not found,
        metadata={"depth": Depth.SCHEMA.words, "batches": len(batches), "errors": found[:20]},
        description="; ".join(found[:3]) or None,
    )


def _footers(folder: str) -> list["pd.DataFrame"]:
    """Each Parquet file of a batch folder as an empty pandas frame of the file's schema."""
    import pyarrow.parquet as pq

    names = sorted(n for n in os.listdir(folder) if n.endswith(".parquet"))
    return [pq.read_schema(os.path.join(folder, n)).empty_table().to_pandas() for n in names]


def schema_check_spec(name: str, partitions: PartitionsDefinition) -> AssetCheckSpec:
    return AssetCheckSpec(
        CHECK,
        asset=name,
        partitions_def=partitions,
        description="pandera schema-only check of the batch written at the epoch (its Parquet "
        "footers on a local state, else as Spark reads it): "
        "exactly the key columns, time and diff, all long.",
    )
