"""What each asset's materialization of an epoch says: its own figures, from the engine's result.

`epoch_metadata` turns an `EpochResult` (and what was read from the landing folder) into each
asset's metadata, in the user's units (an undirected relation in edges). The numeric entries are
the few a user follows (an output's ``count``, ``added``, ``removed``, ``net``; a relation's rows
landed, inserted, deleted, ignored); the engine's own measures go in one JSON entry, ``engine
(internal)``; besides, ``dagster/row_count``, ``dagster/column_schema`` and ``dagster/uri``.
Everything comes from the committed manifest and the pass's result: nothing reads a batch.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import MetadataValue, TableColumn, TableSchema

# Dagster's typed sets of the standard ``dagster/...`` keys (not re-exported at its top level).
from dagster._core.definitions.metadata.metadata_set import TableMetadataSet, UriMetadataSet

from wcoj_assets.graph import AssetInfo, EpochGraph, Role
from wcoj_core.store.location import Location

if TYPE_CHECKING:
    from wcoj_core.engine import Engine
    from wcoj_core.epoch import EpochResult, SegmentReport, TraceReport
    from wcoj_core.query.ir import Query

EXAMPLES = 10
INTERNAL = "engine (internal)"
# The entry of a relation's changes naming the landed files' fingerprint (`landing_read.fingerprint`):
# the landing sensor does not request an epoch materialized from the same files again.
FINGERPRINT = "landed fingerprint"


@dataclass(frozen=True, slots=True)
class LandedFigures:
    """What was read from a relation's landing folder at an epoch: files (their names), bytes,
    rows read (None when Spark read them), file names ignored, seconds, the files' fingerprint
    (what the landing sensor compares) and the columns as the files named them."""

    files: tuple[str, ...]
    bytes: int
    rows: int | None
    ignored_files: tuple[str, ...]
    seconds: float
    fingerprint: str = ""
    columns: tuple[str, ...] = ()


def standard_metadata(
    schema: TableSchema | None, uri: str | None, rows: int | None
) -> dict[str, Any]:
    """Dagster's ``dagster/column_schema``, ``dagster/uri`` and ``dagster/row_count`` entries.

    A local path becomes a ``file://`` URI; None leaves an entry out.

    >>> from wcoj_assets.graph import table_schema
    >>> sorted(standard_metadata(table_schema(("c0",)), "/state/traces/r/b-1", 3))
    ['dagster/column_schema', 'dagster/row_count', 'dagster/uri']
    >>> standard_metadata(None, "/state/traces/r/b-1", None)["dagster/uri"]
    'file:///state/traces/r/b-1'
    """
    out: dict[str, Any] = dict(TableMetadataSet(column_schema=schema, row_count=rows))
    if uri is not None:
        where = Location.of(uri)
        out |= dict(UriMetadataSet(uri=Path(where.absolute()).as_uri() if where.local else uri))
    return {k: v for k, v in out.items() if v is not None}


def renamed(schema: TableSchema, names: tuple[str, ...]) -> TableSchema:
    """`schema` with its data columns named as the user's files name them.

    >>> from wcoj_assets.graph import table_schema
    >>> [c.name for c in renamed(table_schema(("c0", "c1")), ("src", "dst")).columns]
    ['src', 'dst', 'diff']
    """
    columns = list(schema.columns)
    if len(names) != len(columns) - 1:
        return schema
    out = [
        TableColumn(name, c.type, f"{c.description} (stored as {c.name})")
        for name, c in zip(names, columns, strict=False)
    ]
    return TableSchema([*out, columns[-1]])


def epoch_metadata(
    graph: EpochGraph,
    engine: Engine,
    result: EpochResult,
    landed: Mapping[str, LandedFigures] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every asset's metadata for the epoch of `result`, by asset name."""
    out: dict[str, dict[str, Any]] = {}
    for info in graph.infos:
        trace = result.traces.get(info.trace)
        found = (landed or {}).get(info.relation or "")
        figures = _figures(info, graph, engine, result, trace, found)
        schema = graph.specs[info.name].metadata.get("dagster/column_schema")
        named = info.role in (Role.CHANGES, Role.SNAPSHOT)  # the relation's own column order
        if named and isinstance(schema, TableSchema) and found is not None and found.columns:
            schema = renamed(schema, found.columns)
        rows, uri = figures.pop("_rows", None), figures.pop("_uri", None)
        internal = figures.pop("_internal", {})
        out[info.name] = {
            "epoch": result.epoch,
            **figures,
            INTERNAL: MetadataValue.json(internal),
            **standard_metadata(schema if isinstance(schema, TableSchema) else None, uri, rows),
        }
    return out


def unit(graph: EpochGraph, relation: str) -> tuple[str, int]:
    """The word for a relation's tuples and how many stored tuples make one: an undirected
    relation's edges are held in both directions."""
    spec = graph.topology.meanings[relation]
    return ("edges", 2) if spec.undirected else ("tuples", 1)


def _added_removed(result: EpochResult, query: str, rows: int) -> tuple[int, int]:
    """A query's change at the epoch as (added, removed): summed positive and negative
    multiplicity. From the change the pass computed; else, from the change's size and net
    (exact when every diff is 1 or -1, as over sets)."""
    net = result.totals.get(query, 0)
    change = result.changes.get(query)
    if change is not None:
        diff = change[1]
        return int(diff[diff > 0].sum()), int(-diff[diff < 0].sum())
    return (rows + net) // 2, (rows - net) // 2


def _figures(
    info: AssetInfo,
    graph: EpochGraph,
    engine: Engine,
    result: EpochResult,
    trace: TraceReport | None,
    landed: LandedFigures | None,
) -> dict[str, Any]:
    batch = trace.batch if trace is not None else None
    batch_rows = batch.rows if batch is not None else 0
    batch_uri = engine.store.uri(batch.path) if batch is not None else None
    metrics = result.metrics
    ran = {"ran on": metrics.deployment, "seconds": round(metrics.total_seconds, 4)}
    match info.role:
        case Role.CHANGES:
            return _changes(info, graph, result, batch_rows, batch_uri, landed)
        case Role.SNAPSHOT:
            f = trace.figures if trace is not None else None
            word, per = unit(graph, info.relation or "")
            return {
                f"{word} held": (f.count if f else 0) // per,
                "_rows": f.rows if f else 0,
                "_uri": _folder(engine, batch.path) if batch is not None else None,
                "_internal": {
                    "tuples held": f.rows if f else 0,
                    "summed multiplicity": f.count if f else 0,
                    "negative tuples": f.negative if f else 0,
                    "batch rows": batch_rows,
                },
            }
        case Role.INDEX:
            segments = [s for s in (trace.segments if trace else ()) if _key(s) == info.view]
            return _segments(engine, segments, {})
        case Role.COUNTS:
            f = trace.figures if trace is not None else None
            segments = list(trace.segments if trace else ())
            extra = {"keys held": f.rows if f else 0, "batch rows": batch_rows}
            return {**_segments(engine, segments, extra), "_rows": f.rows if f else 0}
        case Role.RULE:
            return _rule(info, result, batch_rows, batch_uri, ran)
        case Role.QUERY_CHANGES:
            q = info.query or ""
            added, removed = _added_removed(result, q, batch_rows)
            return {
                "added": added,
                "removed": removed,
                "net": result.totals.get(q, 0),
                "_rows": batch_rows,
                "_uri": batch_uri,
                "_internal": {"rows written": batch_rows, **ran},
            }
        case Role.OUTPUT:
            return _output(info, graph, engine, result, trace, ran)
    raise AssertionError(info.role)


def _rule(
    info: AssetInfo,
    result: EpochResult,
    batch_rows: int,
    batch_uri: str | None,
    ran: dict[str, Any],
) -> dict[str, Any]:
    """A delta rule's change at the epoch: its rows, and what the kernel proposed and validated."""
    q, i = info.query or "", info.atom or 0
    rule = result.rules.get(q, {}).get(i)
    internal: dict[str, Any] = {
        "rows proposed": rule.proposed if rule else 0,
        "rows validated": rule.validated if rule else 0,
        **ran,
    }
    out: dict[str, Any] = {"output rows": batch_rows}
    if rule is None:
        out["not run"] = (
            f"atom {i} changed nothing, or an atom the rule joins it with was empty "
            "(on the first epoch the last rule finds the whole output)"
        )
    return {**out, "_rows": batch_rows, "_uri": batch_uri, "_internal": internal}


def _output(
    info: AssetInfo,
    graph: EpochGraph,
    engine: Engine,
    result: EpochResult,
    trace: TraceReport | None,
    ran: dict[str, Any],
) -> dict[str, Any]:
    """A query's output as of the epoch: its count, an aggregate's figures, what the epoch added
    and removed, and how the epoch ran."""
    batch = trace.batch if trace is not None else None
    metrics = result.metrics
    q = info.query or ""
    f = trace.figures if trace is not None else None
    changes = next(
        (t for n, t in result.traces.items() if n == info.trace and t.batch is not None),
        None,
    )
    rows = changes.batch.rows if changes is not None and changes.batch else 0
    added, removed = _added_removed(result, q, rows)
    return {
        "count": f.count if f else 0,
        **_aggregate(engine, graph.topology.query(q), result.epoch, rows),
        "added": added,
        "removed": removed,
        "net": result.totals.get(q, 0),
        "_rows": f.rows if f else 0,
        "_uri": _folder(engine, batch.path) if batch is not None else None,
        "_internal": {
            **ran,
            "why there": metrics.reason,
            "seconds by phase": {k: round(v, 4) for k, v in metrics.seconds.items()},
            "hydration": {
                "seconds": round(metrics.seconds.get("open", 0.0), 4),
                "mapped_bytes": metrics.mapped_bytes,
                "read_bytes": metrics.read_bytes,
                "rebuilt": list(metrics.rebuilt),
            },
        },
    }


def _aggregate(engine: Engine, query: Query, epoch: int, changed: int) -> dict[str, Any]:
    """An aggregate query's figures: the sum of its values, its groups, the keys the epoch
    changed and the groups of the largest values (`wcoj_core.aggregates.summary`); {} for
    another query."""
    if query.aggregate is None:
        return {}
    from wcoj_core import aggregates

    found = aggregates.summary(aggregates.table(engine, query, epoch))
    head = [*(v.name for v in query.head), query.aggregate.name]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(f"{v:,}" for v in row) + " |" for row in found["top"]]
    return {
        "total": found["total"],
        "groups": found["groups"],
        "changed keys": changed,
        f"top {aggregates.TOP}": MetadataValue.md("\n".join(lines)),
    }


def _changes(
    info: AssetInfo,
    graph: EpochGraph,
    result: EpochResult,
    batch_rows: int,
    batch_uri: str | None,
    landed: LandedFigures | None,
) -> dict[str, Any]:
    report = result.relations.get(info.relation or "")
    word, per = unit(graph, info.relation or "")
    out: dict[str, Any] = {}
    internal: dict[str, Any] = {"tuples changed": batch_rows}
    if landed is not None:
        if landed.rows is not None:
            out["rows landed"] = landed.rows
        out["files"] = ", ".join(landed.files)
        if landed.ignored_files:
            out["files ignored"] = ", ".join(landed.ignored_files)
        if landed.fingerprint:
            out[FINGERPRINT] = landed.fingerprint
        internal |= {"bytes read": landed.bytes, "seconds reading": round(landed.seconds, 4)}
    else:
        out["rederived"] = "from the changes the state holds (a stale epoch rebuilt)"
    if report is not None:
        out |= {
            f"{word} inserted": report.inserted // per,
            f"{word} deleted": report.deleted // per,
            "ignored (already present)": report.inserted_present // per,
            "ignored (not present)": report.deleted_absent // per,
        }
        if report.self_loops:
            out["self-loops dropped"] = report.self_loops
        if report.ignored_examples:
            # One line per landed row: an undirected relation holds each edge both ways.
            seen = {(min(t), max(t)) if per == 2 else t: d for t, d in report.ignored_examples}
            out["ignored"] = MetadataValue.json(
                [f"{t}: landed {'+' if d > 0 else '-'}" for t, d in list(seen.items())[:EXAMPLES]]
            )
        internal |= {
            "tuples landed": report.landed,
            "inserted_present": report.inserted_present,
            "deleted_absent": report.deleted_absent,
        }
    rows = (report.inserted + report.deleted) // per if report is not None else batch_rows
    return {**out, "_rows": rows, "_uri": batch_uri, "_internal": internal}


def _key(segment: SegmentReport) -> tuple[Any, ...]:
    return (segment.view, tuple(segment.order))


def _segments(
    engine: Engine, segments: list[SegmentReport], extra: dict[str, Any]
) -> dict[str, Any]:
    rows = sum(s.rows for s in segments)
    by_level: dict[str, int] = {}
    for s in segments:
        by_level[s.level] = by_level.get(s.level, 0) + s.rows
    folder = posixpath.dirname(segments[0].path.rstrip("/")) if segments else None
    return {
        "_rows": rows,
        "_uri": engine.store.uri(folder) if folder else None,
        "_internal": {
            **extra,
            "rows": rows,
            "bytes": sum(s.bytes for s in segments),
            "rows by level": by_level,
            "segments": [
                {"level": s.level, "path": s.path, "rows": s.rows, "bytes": s.bytes}
                for s in segments
            ],
        },
    }


def _folder(engine: Engine, path: str) -> str:
    """The folder holding a batch: the trace's batches."""
    return engine.store.uri(posixpath.dirname(path.rstrip("/")))
