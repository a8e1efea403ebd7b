"""What every asset step shares: its epochs, partition mappings, metadata and schema checks.

Every asset performs one `wcoj_core.history.History` step per epoch of its run — a pure function
of stored batches that *replaces* the batch at that epoch — and writes with Spark itself: nothing
goes through an IO manager, so a run over a range of epochs never loads its own earlier
partitions. Assets that read their own previous epoch declare it with
`TimeWindowPartitionMapping(-1, -1)`; every step handles a range of epochs (oldest first), so
`BackfillPolicy.single_run()` holds for all of them.
"""

import os
import time as clock
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    Failure,
    MetadataValue,
    PartitionsDefinition,
    TimeWindowPartitionMapping,
)

from wcoj_assets.epochs import epoch_number
from wcoj_assets.schemas import Depth, problems, triples_schema
from wcoj_core.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

    from wcoj_core.history import History
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


def epochs_of(context: Any) -> list[tuple[str, int]]:
    """The (key, epoch) pairs of the step's partitions, oldest first; Failure for a bad key."""
    try:
        pairs = [(key, epoch_number(key)) for key in context.partition_keys]
    except InputError as e:
        raise Failure(description=str(e), allow_retries=False) from e
    return sorted(pairs, key=lambda p: p[1])


def each_epoch(context: Any, step: Callable[[int], Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Run `step` for every epoch of the run, oldest first, and stamp its figures.

    Each result is ``{"epoch", "partition", **step(t), "seconds"}``, ready for `summarize`.
    """
    out: list[dict[str, Any]] = []
    for key, t in epochs_of(context):
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
    root = history.local_root if history.keyed_epoch_rows else None
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
        metadata={"depth": Depth.SCHEMA.value, "batches": len(batches), "errors": found[:20]},
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
