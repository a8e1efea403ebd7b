"""What each asset's materialization of an epoch says: its own figures, from the engine's result.

One engine pass makes every asset of an epoch; `epoch_metadata` turns its `EpochResult` (and,
for a relation's changes, what was read from the landing folder) into each asset's metadata for
that epoch's partition. Every materialization carries Dagster's standard entries besides wcoj's
own figures: ``dagster/row_count``, ``dagster/column_schema`` and ``dagster/uri``:

| asset | ``dagster/row_count`` | ``dagster/uri`` | figures |
|---|---|---|---|
| ``R_deltas`` | the relation's change at the epoch | its batch | files, bytes and rows read, tuples landed, self-loops dropped, set inserts and deletes that changed nothing |
| ``R_snapshot`` | tuples held as of the epoch | the relation's batches | count, negative tuples |
| ``R_forward`` … | rows in the segment files | the arrangement's folder | bytes, segments by level |
| ``R_counts_<key>`` | keys held as of the epoch | the arrangement's folder | the epoch's batch, bytes, segments |
| ``Q_rule_<i>`` | the rule's output change | its batch (none when the rule was not run) | rows proposed and validated, where it ran, why it was not run |
| ``Q_deltas`` | the output's change | its batch | its summed multiplicity |
| ``Q`` | output tuples as of the epoch | the output's batches | count, the epoch's seconds per phase, what opening the state cost |

Everything comes from the manifest the epoch committed (figures kept incrementally): nothing
here reads a batch or starts Spark.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import MetadataValue, TableSchema

# Dagster's typed sets of the standard ``dagster/...`` keys (not re-exported at its top level).
from dagster._core.definitions.metadata.metadata_set import TableMetadataSet, UriMetadataSet

from wcoj_assets.graph import AssetInfo, EpochGraph, Role

if TYPE_CHECKING:
    from wcoj_core.engine import Engine
    from wcoj_core.epoch import EpochResult, SegmentReport, TraceReport

EXAMPLES = 10


@dataclass(frozen=True, slots=True)
class LandedFigures:
    """What was read from a relation's landing folder at an epoch."""

    files: int
    bytes: int
    rows: int | None
    ignored_files: tuple[str, ...]
    seconds: float


def standard_metadata(
    schema: TableSchema | None, uri: str | None, rows: int | None
) -> dict[str, Any]:
    """Dagster's ``dagster/column_schema``, ``dagster/uri`` and ``dagster/row_count`` entries.

    A path without a scheme becomes a ``file://`` URI; None leaves an entry out.

    >>> from wcoj_assets.graph import table_schema
    >>> sorted(standard_metadata(table_schema(("c0",)), "/state/traces/r/b-1", 3))
    ['dagster/column_schema', 'dagster/row_count', 'dagster/uri']
    >>> standard_metadata(None, "/state/traces/r/b-1", None)["dagster/uri"]
    'file:///state/traces/r/b-1'
    """
    out: dict[str, Any] = dict(TableMetadataSet(column_schema=schema, row_count=rows))
    if uri is not None:
        out |= dict(UriMetadataSet(uri=uri if "://" in uri else Path(uri).as_uri()))
    return {k: v for k, v in out.items() if v is not None}


def epoch_metadata(
    graph: EpochGraph,
    engine: Engine,
    result: EpochResult,
    landed: Mapping[str, LandedFigures] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every asset's metadata for the epoch of `result`, by asset name."""
    seconds = round(result.metrics.total_seconds, 4)
    out: dict[str, dict[str, Any]] = {}
    for info in graph.infos:
        trace = result.traces.get(info.trace)
        figures = _figures(info, engine, result, trace, (landed or {}).get(info.relation or ""))
        schema = graph.specs[info.name].metadata.get("dagster/column_schema")
        rows, uri = figures.pop("_rows", None), figures.pop("_uri", None)
        out[info.name] = {
            "epoch": result.epoch,
            **figures,
            "seconds": figures.pop("seconds", seconds),
            **standard_metadata(schema if isinstance(schema, TableSchema) else None, uri, rows),
        }
    return out


def _figures(
    info: AssetInfo,
    engine: Engine,
    result: EpochResult,
    trace: TraceReport | None,
    landed: LandedFigures | None,
) -> dict[str, Any]:
    batch = trace.batch if trace is not None else None
    batch_rows = batch.rows if batch is not None else 0
    batch_uri = engine.store.uri(batch.path) if batch is not None else None
    match info.role:
        case Role.CHANGES:
            return _changes(info, result, batch_rows, batch_uri, landed)
        case Role.SNAPSHOT:
            f = trace.figures if trace is not None else None
            return {
                "rows_in": batch_rows,
                "rows_out": f.rows if f else 0,
                "count": f.count if f else 0,
                "negative": f.negative if f else 0,
                "_rows": f.rows if f else 0,
                "_uri": _folder(engine, batch.path) if batch is not None else None,
            }
        case Role.INDEX:
            segments = [s for s in (trace.segments if trace else ()) if _key(s) == info.view]
            return _segments(engine, segments)
        case Role.COUNTS:
            f = trace.figures if trace is not None else None
            segments = list(trace.segments if trace else ())
            change = result.relations.get(info.relation or "")
            return {
                "rows_in": change.changed if change is not None else 0,
                "rows_out": batch_rows,
                "keys": f.rows if f else 0,
                **{k: v for k, v in _segments(engine, segments).items() if k not in ("rows_out",)},
                "_rows": f.rows if f else 0,
            }
        case Role.RULE:
            q, i = info.query or "", info.atom or 0
            relation = engine.queries[q].atoms[i].relation
            rule = result.rules.get(q, {}).get(i)
            change = result.relations.get(relation)
            return {
                "rows_in": change.changed if change is not None else 0,
                "rows_proposed": rule.proposed if rule else 0,
                "rows_validated": rule.validated if rule else 0,
                "rows_out": batch_rows,
                "ran on": result.metrics.deployment,
                **({} if rule else {"not run": "an atom it joins reads an empty relation"}),
                "_rows": batch_rows,
                "_uri": batch_uri,
            }
        case Role.QUERY_CHANGES:
            q = info.query or ""
            rules = [
                t.batch.rows
                for name, t in result.traces.items()
                if name.startswith(f"rule/{q}/") and t.batch is not None
            ]
            return {
                "rows_in": sum(rules),
                "rows_out": batch_rows,
                "total": result.totals.get(q, 0),
                "_rows": batch_rows,
                "_uri": batch_uri,
            }
        case Role.OUTPUT:
            f = trace.figures if trace is not None else None
            metrics = result.metrics
            return {
                "rows_in": batch_rows,
                "rows_out": f.rows if f else 0,
                "count": f.count if f else 0,
                "ran on": metrics.deployment,
                "why there": metrics.reason,
                "seconds by phase": MetadataValue.json(
                    {k: round(v, 4) for k, v in metrics.seconds.items()}
                ),
                "hydration": MetadataValue.json(
                    {
                        "seconds": round(metrics.seconds.get("open", 0.0), 4),
                        "mapped_bytes": metrics.mapped_bytes,
                        "read_bytes": metrics.read_bytes,
                        "rebuilt": list(metrics.rebuilt),
                    }
                ),
                "_rows": f.rows if f else 0,
                "_uri": _folder(engine, batch.path) if batch is not None else None,
            }
    raise AssertionError(info.role)


def _changes(
    info: AssetInfo,
    result: EpochResult,
    batch_rows: int,
    batch_uri: str | None,
    landed: LandedFigures | None,
) -> dict[str, Any]:
    report = result.relations.get(info.relation or "")
    out: dict[str, Any] = {}
    if landed is not None:
        out |= {"files": landed.files, "bytes_in": landed.bytes}
        if landed.rows is not None:
            out["rows_in"] = landed.rows
        if landed.ignored_files:
            out["ignored_files"] = ", ".join(landed.ignored_files)
        out["seconds"] = round(landed.seconds, 4)
    else:
        out["rederived"] = "from the changes the state holds (a stale epoch rebuilt)"
    out |= {"landed": report.landed if report else 0, "rows_out": batch_rows}
    if report is not None:
        if report.self_loops:
            out["self_loops_dropped"] = report.self_loops
        if report.inserted_present:
            out["inserted_present"] = report.inserted_present
        if report.deleted_absent:
            out["deleted_absent"] = report.deleted_absent
        if report.ignored_examples:
            out["ignored"] = MetadataValue.json(
                [
                    f"{t}: landed {'+' if d > 0 else '-'}"
                    for t, d in report.ignored_examples[:EXAMPLES]
                ]
            )
    return {**out, "_rows": batch_rows, "_uri": batch_uri}


def _key(segment: SegmentReport) -> tuple[Any, ...]:
    return (segment.view, tuple(segment.order))


def _segments(engine: Engine, segments: list[SegmentReport]) -> dict[str, Any]:
    rows = sum(s.rows for s in segments)
    by_level: dict[str, int] = {}
    for s in segments:
        by_level[s.level] = by_level.get(s.level, 0) + s.rows
    folder = posixpath.dirname(segments[0].path.rstrip("/")) if segments else None
    return {
        "rows_out": rows,
        "bytes": sum(s.bytes for s in segments),
        "segments": MetadataValue.json(
            [{"level": s.level, "path": s.path, "rows": s.rows, "bytes": s.bytes} for s in segments]
        ),
        "rows by level": MetadataValue.json(by_level),
        "_rows": rows,
        "_uri": engine.store.uri(folder) if folder else None,
    }


def _folder(engine: Engine, path: str) -> str:
    """The folder holding a batch: the trace's batches."""
    return engine.store.uri(posixpath.dirname(path.rstrip("/")))
