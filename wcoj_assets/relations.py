"""Relation assets: ``<rel>_deltas`` (each epoch's validated changes) and ``<rel>_snapshot``.

``<rel>_deltas`` reads the landing folder of the epoch, checks it in full with pandera and only
then ingests it; all relations are one step, so bad data in any of them stops the run before any
relation or arrangement changes. An undirected relation's changes are read in both directions and
without self-loops (`wcoj_assets.intake.read_changes`' ``undirected``) before they are checked; dropped
self-loops are counted in the metadata and logged as a warning. ``<rel>_snapshot`` is the relation
as of the epoch (its previous snapshot plus the epoch's changes) — the self arrangement every rule
reads through its atoms' views — checked for negative multiplicities.
"""

import time as clock
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetSpec,
    BackfillPolicy,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
    multi_asset,
)

from wcoj_assets.epochs import Epochs
from wcoj_assets.intake import landed_files, read_changes, read_changes_locally
from wcoj_assets.provenance import CURRENT, REBUILD_SENSOR, stale_partitions
from wcoj_assets.resources import WcojResource
from wcoj_assets.schemas import Depth, problems, triples_schema
from wcoj_assets.specs import deltas_asset_name, snapshot_asset_name
from wcoj_assets.steps import (
    CHECK,
    add_standard_metadata,
    batch_uri,
    each_epoch,
    epochs_of,
    previous_epoch,
    relation_schema,
    rows_at,
    summarize,
    trace_uri,
)
from wcoj_core.errors import InputError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from wcoj_core.history import History
    from wcoj_core.query.ir import Query

NEGATIVE_EXAMPLES = 20


def deltas_assets(
    *,
    relations: Mapping[str, int],
    undirected: frozenset[str],
    queries: Sequence["Query"],
    epochs: Epochs,
) -> Any:
    """``<rel>_deltas`` for every relation, as one step: validate everything, then ingest.

    A relation's changes at an epoch are the update triples in its landing folder (for an
    undirected relation, each also reversed and self-loops dropped), consolidated (no folder: no
    changes). Every relation's changes for every epoch of the step pass the full pandera check
    first; any failure fails the step before anything is written, so bad data never reaches a
    relation or an arrangement.
    """
    partitions = epochs.partitions()
    names = {rel: deltas_asset_name(rel) for rel in relations}

    def description(rel: str, arity: int) -> str:
        text = (
            f"Consolidated update triples (c0..c{arity - 1}, diff) of relation `{rel}` at the "
            f"epoch, read from `<landing>/{rel}/<epoch key>/` (CSV, SNAP edge list or Parquet) "
            "after a full pandera check."
        )
        if rel in undirected:
            text += (
                " Undirected: each landed change (a, b, diff) is an edge in no particular "
                "direction, taken as (a, b, diff) and (b, a, diff); self-loops are dropped."
            )
        return text

    specs = [
        AssetSpec(
            names[rel],
            partitions_def=partitions,
            group_name="relations",
            kinds={"spark"},
            description=description(rel, arity),
            metadata={"dagster/column_schema": relation_schema(arity)},
        )
        for rel, arity in relations.items()
    ]
    check_specs = [
        AssetCheckSpec(
            CHECK,
            asset=names[rel],
            blocking=True,
            partitions_def=partitions,
            description="Full pandera.pyspark check of the epoch's changes before ingestion: long "
            "non-null columns, diff != 0, time == epoch, one row per (data, time).",
        )
        for rel in relations
    ]

    @multi_asset(
        name="relation_deltas",
        specs=specs,
        check_specs=check_specs,
        partitions_def=partitions,
        backfill_policy=BackfillPolicy.single_run(),
        can_subset=False,
    )
    def _deltas(context: AssetExecutionContext, wcoj: WcojResource) -> Iterator[Any]:
        history = wcoj.history(queries)
        run_epochs = epochs_of(context, epochs)
        staged: list[tuple[str, int, DataFrame | pa.Table, dict[str, Any]]] = []
        failures: dict[str, list[str]] = {rel: [] for rel in relations}
        for rel, arity in relations.items():
            for key, t in run_epochs:
                frame, info, errors = _read_epoch(
                    history, wcoj.landing_path(), rel, arity, key, t, rel in undirected
                )
                if loops := info.get("self_loops_dropped"):
                    context.log.warning(
                        f"{rel} at {key}: dropped {loops} self-loop(s); an undirected "
                        "edge joins two different vertices"
                    )
                failures[rel] += errors
                if frame is not None:
                    staged.append((rel, t, frame, info))
        if any(failures.values()):
            for rel, errors in failures.items():
                yield AssetCheckResult(
                    asset_key=names[rel],
                    check_name=CHECK,
                    passed=not errors,
                    metadata={"depth": Depth.FULL.words, "errors": errors[:20]},
                    description="; ".join(errors[:3]) or None,
                )
            bad = {rel: errors for rel, errors in failures.items() if errors}
            raise Failure(
                description="bad changes, nothing ingested: "
                + "; ".join(f"{rel}: {errors[0]}" for rel, errors in bad.items()),
                metadata={rel: MetadataValue.json(errors[:20]) for rel, errors in bad.items()},
                allow_retries=False,
            )
        per_rel: dict[str, list[dict[str, Any]]] = {rel: [] for rel in relations}
        for rel, t, frame, info in staged:
            start = clock.perf_counter()
            batch = history.ingest(t, rel, frame)
            info["rows_out"] = batch.rows
            info["seconds"] = round(info["seconds"] + clock.perf_counter() - start, 3)
            per_rel[rel].append(info)
            schema = relation_schema(relations[rel])
            uri = batch_uri(history, batch)
            add_standard_metadata(context, names[rel], info["partition"], schema, uri, batch.rows)
        _report_corrections(context, history, per_rel, [t for _, t in run_epochs], epochs)
        for rel in relations:
            figures = per_rel[rel]
            yield MaterializeResult(
                asset_key=names[rel],
                metadata=summarize(figures),
                check_results=[
                    AssetCheckResult(
                        asset_key=names[rel],
                        check_name=CHECK,
                        passed=True,
                        metadata={"depth": Depth.FULL.words, "epochs": len(figures)},
                    )
                ],
            )

    return _deltas


def _report_corrections(
    context: AssetExecutionContext,
    history: "History",
    per_rel: dict[str, list[dict[str, Any]]],
    run_epochs: list[int],
    epochs: Epochs,
) -> None:
    """After ingesting: name the later partitions a correction left stale.

    The run's own epochs are derived again by the rest of the job. Later epochs are not: the
    changes' metadata (``stale_later_epochs``, ``backfill_from``) and the log name them, and
    each derived asset, once rebuilt at this epoch, fails its `current_history` check on them
    (`wcoj_assets.provenance`), which the automation sensor turns into their rebuild.
    """
    stale = {
        asset: later
        for asset, times in stale_partitions(history).items()
        if (later := [t for t in times if t > max(run_epochs)])
    }
    if not stale:
        return
    later_epochs = sorted({t for times in stale.values() for t in times})
    corrected = ", ".join(epochs.key(t) for t in run_epochs)
    first = epochs.key(later_epochs[0])
    for infos in per_rel.values():
        if infos:
            infos[-1]["stale_later_epochs"] = len(later_epochs)
            infos[-1]["backfill_from"] = first
    context.log.warning(
        f"epochs {later_epochs[0]}..{later_epochs[-1]} were derived before {corrected} changed: "
        f"{sum(map(len, stale.values()))} partitions fail `{CURRENT}` once this epoch is "
        f"rebuilt, until the sensor {REBUILD_SENSOR} (or a backfill from {first}) brings them "
        "back"
    )


def _read_epoch(
    history: "History",
    landing: str,
    rel: str,
    arity: int,
    key: str,
    t: int,
    undirected: bool = False,
) -> tuple["DataFrame | pa.Table | None", dict[str, Any], list[str]]:
    """Read and fully validate one relation's landing folder at one epoch.

    Returns the consolidated changes (c0.., diff), the metadata, and the errors found; an
    `undirected` relation's changes are read in both directions, without self-loops. A small
    epoch (at most the driver's epoch limit, and `DRIVER_PROBE_ROWS`) is collected once and
    checked and consolidated on the driver, with the same schemas in pandera's pandas backend:
    its changes come back as an Arrow table. Small local Parquet files are read by pyarrow, without
    Spark (`read_changes_locally`); other files are read by Spark. A larger epoch stays a Spark
    DataFrame, checked by pandera.pyspark.
    """
    from pyspark.sql import functions as F

    from wcoj_core.engine import DRIVER_PROBE_ROWS
    from wcoj_core.updates import DIFF, TIME, consolidate, relation_columns, update_schema

    start = clock.perf_counter()
    spark = history.engine.spark
    cols = relation_columns(arity)
    landing_files = landed_files(landing, rel, key)
    info: dict[str, Any] = {
        "epoch": t,
        "partition": key,
        "files": len(landing_files.files),
        "rows_in": 0,
        "rows_out": 0,
        "seconds": 0.0,
    }
    if landing_files.ignored:
        info["ignored_files"] = ", ".join(landing_files.ignored)
    info["bytes_in"] = sum(f.size for f in landing_files.files)
    probe = min(history.driver_epoch_rows, DRIVER_PROBE_ROWS)
    files = landing_files.files
    try:
        raw = None
        local = read_changes_locally(files, arity, rel, probe, undirected=undirected)
        table, loops = (local.rows, local.loops) if probe > 0 else (None, 0)
        if table is None:
            read = read_changes(spark, files, arity, rel, undirected=undirected)
            raw, loops = read.rows, read.loops
            if raw is not None and probe > 0:
                table = raw.select(*cols, DIFF).limit(probe + 1).toArrow()
    except InputError as e:
        return None, info, [f"epoch {t} ({key}): {e}"]
    if loops:
        info["self_loops_dropped"] = loops
    if table is not None and table.num_rows <= probe:
        changes, errors = _check_local(table, cols, t)
        info["rows_in"] = table.num_rows
    else:
        if raw is None:
            raw = spark.createDataFrame([], update_schema(cols, with_time=False))
        stamped = raw.select(*cols, F.lit(t).cast("long").alias(TIME), DIFF)
        errors = problems(stamped, triples_schema(cols, epoch=t), Depth.FULL)
        consolidated = consolidate(stamped, cols)
        if not errors:
            errors = problems(consolidated, triples_schema(cols, epoch=t, unique=True), Depth.FULL)
            info["rows_in"] = stamped.count()
        changes = consolidated.drop(TIME)
    info["seconds"] = round(clock.perf_counter() - start, 3)
    return changes, info, [f"epoch {t} ({key}): {p}" for p in errors]


def _check_local(table: "pa.Table", cols: Sequence[str], t: int) -> tuple["pa.Table", list[str]]:
    """A small epoch's changes on the driver: checked as read, consolidated, checked again."""
    import numpy as np

    from wcoj_core.updates import DIFF, TIME, consolidate_table

    raw = table.to_pandas()
    raw.insert(len(cols), TIME, np.full(len(raw), t, dtype=np.int64))
    errors = problems(raw, triples_schema(cols, epoch=t, local=True), Depth.FULL)
    if errors:
        return table.slice(0, 0), errors
    done = consolidate_table(table, cols, t)
    frame = done.to_pandas()
    return done.drop_columns([TIME]).select([*cols, DIFF]), problems(
        frame, triples_schema(cols, epoch=t, unique=True, local=True), Depth.FULL
    )


def snapshot_asset(
    *,
    relation: str,
    arity: int,
    queries: Sequence["Query"],
    epochs: Epochs,
) -> Any:
    """``<rel>_snapshot``: the relation as of the epoch, checked for negative multiplicities.

    Its ``dagster/uri`` is the relation's trace folder (the snapshot as of an epoch is its
    batches up to it); it has no ``dagster/row_count``, which would take a pass over the whole
    relation at every epoch.
    """
    name = snapshot_asset_name(relation)
    partitions = epochs.partitions()

    @asset(
        name=name,
        partitions_def=partitions,
        group_name="relations",
        kinds={"spark"},
        deps=[
            AssetDep(deltas_asset_name(relation)),
            AssetDep(name, partition_mapping=previous_epoch()),
        ],
        backfill_policy=BackfillPolicy.single_run(),
        check_specs=[
            AssetCheckSpec(
                "non_negative",
                asset=name,
                blocking=True,
                partitions_def=partitions,
                description="No tuple has a negative accumulated multiplicity (a deletion of "
                "something absent); reports the offending tuples.",
            )
        ],
        description=(
            f"The self arrangement of `{relation}`: its trace of consolidated batches, as of the "
            "epoch (the previous snapshot plus the epoch's changes). It is stored once and read "
            "through each atom's view: probed by c0 it is the forward index, by c1 the reverse "
            "one, by all columns the validating self view — no copies."
        ),
        metadata={"dagster/column_schema": relation_schema(arity)},
    )
    def _snapshot(context: AssetExecutionContext, wcoj: WcojResource) -> MaterializeResult:
        from wcoj_core.traces import relation_trace_name

        history = wcoj.history(queries)
        trace = relation_trace_name(relation)
        offending: list[str] = []

        def step(t: int) -> dict[str, Any]:
            count, examples = negative_tuples(history, relation, arity, t)
            offending.extend(f"epoch {t}: {tup} has multiplicity {m}" for tup, m in examples)
            manifest_trace = history.store.current().trace(trace)
            stored = 0 if manifest_trace is None else manifest_trace.rows(t)
            uri = trace_uri(history, trace, t)
            add_standard_metadata(context, name, epochs.key(t), relation_schema(arity), uri, None)
            return {"rows_in": rows_at(history, trace, t), "rows_out": stored, "negative": count}

        per_epoch = each_epoch(context, epochs, step)
        total_negative = sum(e["negative"] for e in per_epoch)
        check = AssetCheckResult(
            check_name="non_negative",
            passed=total_negative == 0,
            metadata={
                "negative_tuples": total_negative,
                "offending": offending[:NEGATIVE_EXAMPLES],
            },
            description=(
                f"{total_negative} tuple(s) with negative multiplicity: " + "; ".join(offending[:5])
                if total_negative
                else None
            ),
        )
        return MaterializeResult(
            metadata=summarize(per_epoch, latest=("rows_out",)), check_results=[check]
        )

    return _snapshot


def negative_tuples(
    history: "History", relation: str, arity: int, epoch: int
) -> tuple[int, list[tuple[tuple[int, ...], int]]]:
    """Tuples changed at `epoch` whose multiplicity as of `epoch` is negative (count, examples).

    Only the changed tuples can turn negative at an epoch, so the check reads the relation's
    batches semi-joined with the epoch's changes rather than the whole relation.
    """
    from pyspark.sql import functions as F

    from wcoj_core.traces import relation_trace_name
    from wcoj_core.updates import DIFF, TIME, consolidate, relation_columns

    trace = history.store.current().trace(relation_trace_name(relation))
    if trace is None or rows_at(history, trace.name, epoch) == 0:
        return 0, []
    found = history.negative_changed(relation, epoch, NEGATIVE_EXAMPLES)
    if found is not None:  # the keyed path: looked up on the driver
        return found
    cols = relation_columns(arity)
    changed = history.changes(trace.name, epoch).select(*cols)
    accumulated = history.store.read(trace, trace.visible(epoch)).drop(TIME)
    touched = accumulated.join(F.broadcast(changed), cols, "left_semi")
    negative = consolidate(touched, cols).where(F.col(DIFF) < 0)
    rows = negative.orderBy(*cols).limit(NEGATIVE_EXAMPLES + 1).collect()
    if not rows:
        return 0, []
    count = len(rows) if len(rows) <= NEGATIVE_EXAMPLES else negative.count()
    return count, [(tuple(r[c] for c in cols), r[DIFF]) for r in rows[:NEGATIVE_EXAMPLES]]
