"""``wcoj status``: what a state holds, from its current manifest alone; no Spark, no data read.

Only the marker and the current manifest (digest and shape checked) are read, so it takes
milliseconds at any size and imports neither pyarrow nor pandas. It says the last commit, the
epochs held (latest, compaction frontier, stale ones), every relation (arity, meaning), every
query (text, ``since``, count now and per epoch; an aggregate's groups and value column) and every
trace (rows, tuples, bytes, batches, segments). ``--json``: `status_of`'s document as the last
stdout line (keys may be added, never renamed). Exit 0; 2 for a non-state or damaged manifest.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from wcoj_core.cli.console import EXIT_OK, emit_json, epilog, say
from wcoj_core.lineage import epochs_of, stale_epochs
from wcoj_core.store import names
from wcoj_core.store.manifest import Manifest, RelationPlan
from wcoj_core.store.store import Store
from wcoj_core.traces import output_trace_name, relation_trace_name

EXAMPLES = (
    "wcoj status lake/tri",
    "wcoj status lake/tri --json",
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "status",
        help="say what a state holds: queries, relations, epochs, counts, traces (no data read)",
        description="Say what a state holds, from its manifest alone: its queries and "
        "relations, the epochs it holds, each query's count at each of them, the size of each "
        "trace and the last commit.",
        epilog=epilog(EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("state", metavar="STATE", help="the state directory")
    p.add_argument("--json", action="store_true", help="end with one JSON line of the status")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    doc = status_of(Store.open(args.state, create=False))
    for line in lines(doc):
        say(line)
    if args.json:
        emit_json({"command": "status", **doc})
    return EXIT_OK


def status_of(store: Store) -> dict[str, Any]:
    """The status document of a state (see the module): plain JSON values only."""
    m = store.current()
    plan = m.plan
    relations = dict(plan.relations) if plan is not None else {}
    held = epochs_of(m)
    stale = stale_epochs(m, [relation_trace_name(r) for r in relations])
    return {
        "state": store.root,
        "generation": m.generation,
        "committed": _committed(store, m),
        "epoch": m.epoch,
        "epochs": held,
        "frontier": m.frontier,
        "stale": stale,
        "relations": {name: _relation(r) for name, r in relations.items()},
        "queries": {
            name: {
                "text": q.text,
                "relations": list(q.relations),
                "since": q.since,
                "count": _count(m, name, None),
                "counts": [
                    {"epoch": t, "count": _count(m, name, t)}
                    for t in held
                    if q.since is None or t >= q.since
                ],
                **_aggregate(m, name, q.text),
            }
            for name, q in (plan.queries.items() if plan is not None else ())
        },
        "traces": {
            name: {
                "rows": t.rows(),
                "tuples": t.figures_at()[0],
                "bytes": t.bytes(),
                "batches": len(t.batches),
                "segments": len(t.index.segments) if t.index is not None else 0,
            }
            for name, t in sorted(m.traces.items())
        },
    }


def lines(doc: dict[str, Any]) -> list[str]:
    """The status for people: a few lines of prose, then a table per query and of the traces."""
    out = [f"state {doc['state']}"]
    if doc["generation"] == 0:
        return [*out, "no epoch applied yet (generation 0)"]
    when = (doc["committed"] or "time unknown").replace("T", " ").replace("Z", " UTC")
    out.append(f"last commit: generation {doc['generation']}, {when}")
    held: list[int] = doc["epochs"]
    frontier = doc["frontier"]
    out.append(
        f"epochs held: {_ranges(held) or 'none'} ({len(held)}), latest {doc['epoch']}; "
        f"compaction frontier: {'none' if frontier is None else frontier}; "
        f"stale: {_ranges(doc['stale']) or 'none'}"
    )
    for name, r in doc["relations"].items():
        meaning = f"{'an undirected ' if r['undirected'] else 'a '}{r['meaning']}"
        out.append(f"relation {name}: arity {r['arity']}, {meaning}")
    stale = set(doc["stale"])
    for name, q in doc["queries"].items():
        since = "" if q["since"] is None else f" (attached at epoch {q['since']})"
        out.append(f"query {name}: {q['text']}{since}")
        groups = f" over {q['groups']:,} groups" if "groups" in q else ""
        out.append(f"  count {q['count']:,}{groups} at epoch {doc['epoch']}")
        epochs: list[tuple[str, ...]] = [("epoch", "count", "change")]
        previous: int | None = 0 if q["since"] is None else None
        for entry in q["counts"]:
            t, count = entry["epoch"], entry["count"]
            # At the frontier the epochs before are merged away: its change is not known.
            change = "" if previous is None or t == frontier else f"{count - previous:+,}"
            mark = " (stale)" if t in stale else ""
            epochs.append((f"{t}", f"{count:,}", f"{change}{mark}"))
            previous = count
        out.extend(_table(epochs, indent="  ", left=0))
    traces = doc["traces"]
    rows: list[tuple[str, ...]] = [("trace", "rows", "tuples", "bytes", "batches", "segments")]
    keys = ("rows", "tuples", "bytes", "batches", "segments")
    for name, t in traces.items():
        rows.append((name, *(f"{t[k]:,}" for k in keys)))
    totals = [sum(t[k] for t in traces.values()) for k in ("rows", "bytes", "batches", "segments")]
    rows.append(("total", f"{totals[0]:,}", "", *(f"{v:,}" for v in totals[1:])))
    out.extend(_table(rows))
    return out


def _relation(r: RelationPlan) -> dict[str, Any]:
    return {"arity": r.arity, "meaning": r.meaning.value, "undirected": r.undirected}


def _count(m: Manifest, query: str, time: int | None) -> int:
    """A query's output count as of `time` (its last epoch for None), from the figures."""
    trace = m.trace(output_trace_name(query))
    return trace.figures_at(time)[1] if trace is not None else 0


def _aggregate(m: Manifest, query: str, text: str) -> dict[str, Any]:
    """An aggregate query's value column and groups (the keys its arrangement holds); {} for
    another query."""
    from wcoj_core.query.parse import parse_query

    aggregate = parse_query(text).aggregate
    if aggregate is None:
        return {}
    trace = m.trace(output_trace_name(query))
    return {"aggregate": aggregate.name, "groups": trace.figures_at()[0] if trace else 0}


def _committed(store: Store, m: Manifest) -> str | None:
    """When the manifest of generation ``m.generation`` was written (UTC, seconds)."""
    wanted = names.manifest_name(m.generation)
    for entry in store.files.entries(names.MANIFESTS):
        if entry.name == wanted:
            when = datetime.fromtimestamp(entry.mtime, UTC)
            return when.isoformat(timespec="seconds").replace("+00:00", "Z")
    return None


def _ranges(epochs: list[int]) -> str:
    """Epochs as runs of consecutive ones.

    >>> _ranges([0, 1, 2, 5, 7, 8])
    '0-2, 5, 7-8'
    """
    runs: list[list[int]] = []
    for t in epochs:
        if runs and t == runs[-1][1] + 1:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _table(rows: list[tuple[str, ...]], indent: str = "", left: int = 1) -> list[str]:
    """Rows as aligned columns: the first `left` to the left, the others to the right.

    >>> print("\\n".join(_table([("a", "n"), ("bb", "10")])))
    a    n
    bb  10
    """
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        indent
        + "  ".join(
            cell.ljust(w) if i < left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
