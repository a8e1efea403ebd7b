"""``wcoj apply``: add one epoch of changes to a kept state and print the output's change.

Contract: the query, the ``--changes`` files (read like inputs: data columns, then an optional
signed ``diff``), the epoch and the state path are checked before Spark starts, the files'
contents as far as that is cheap without a JVM. Epochs are applied once, in increasing order:
an epoch at or before the state's is refused by the engine, and of two runs applying the same
epoch one commits and the other is refused. Deleting tuples a relation does not hold is applied
(multiplicities are signed) and warned about, listing them. Prints one line with the changes,
the output change's rows, the output's count and the seconds per phase; ``--output FILE`` also
writes the epoch's output change (``c0 ..``, ``diff``) as Parquet or CSV; ``--json`` ends with
one JSON line.
"""

from __future__ import annotations

import argparse
import time as clock
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from wcoj_core import linear
from wcoj_core.cli import workspace
from wcoj_core.cli.console import (
    EXIT_OK,
    UsageError,
    add_deploy_argument,
    emit_json,
    epilog,
    phases,
    say,
    warn,
)
from wcoj_core.cli.inputs import check_files, check_undirected, parse_changes
from wcoj_core.cli.results import check_output, write_tuples
from wcoj_core.engine import Engine
from wcoj_core.query.parse import resolve_query
from wcoj_core.sources import negative_tuples, read_relation
from wcoj_core.traces import relation_trace_name
from wcoj_core.updates import DIFF, total_diff

_SHOWN, _LISTED = 10, 1000

EXAMPLES = (
    "wcoj apply --query triangles --state lake/tri --epoch 0 --changes edge=initial.parquet "
    "--undirected edge",
    "wcoj apply --query triangles --state lake/tri --epoch 3 --changes edge=changes-3.csv "
    "--undirected edge --output change-3.csv",
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    app = commands.add_parser(
        "apply",
        help="apply one epoch of changes to a kept state; print the output's change",
        description="Add one epoch of changes to a kept state and print the output's change.",
        epilog=epilog(EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    app.add_argument(
        "--query", required=True, metavar="Q", help="a built-in query name or query text"
    )
    app.add_argument(
        "--state", required=True, metavar="DIR", help="the state directory (created when new)"
    )
    app.add_argument("--epoch", type=int, required=True, metavar="T", help="the epoch (>= 0)")
    app.add_argument(
        "--changes",
        action="append",
        default=[],
        metavar="REL=PATH",
        help="a relation's changes at the epoch: data columns, then an optional signed diff",
    )
    app.add_argument(
        "--undirected",
        action="append",
        default=[],
        metavar="REL",
        help="each change (a, b) of binary relation REL applies to (b, a) too; loops are dropped",
    )
    app.add_argument(
        "--output",
        metavar="FILE",
        help="also write the epoch's output change (c0.., diff) to FILE, .parquet or .csv",
    )
    add_deploy_argument(app)
    workspace.add_spark_arguments(app)
    app.add_argument("--json", action="store_true", help="end with one JSON line of results")
    app.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    query = resolve_query(args.query)
    changes = parse_changes(args.changes, query)
    undirected = check_undirected(args.undirected, query, changes)
    if args.epoch < 0:
        raise UsageError(f"--epoch must be 0 or more, got {args.epoch}")
    state = Path(args.state)
    if state.exists() and not state.is_dir():
        raise UsageError(f"--state {args.state}: exists and is not a directory")
    output = check_output(args.output) if args.output is not None else None
    check_files(query, changes)
    spark = workspace.start_spark(args.master, args.conf)
    start = clock.perf_counter()
    engine = Engine(spark, str(state), query, deployment=args.deploy)
    frames = {}
    for rel, path in sorted(changes.items()):
        df = read_relation(spark, path, query.relations[rel], rel)
        frames[rel] = linear.symmetrize().apply(df) if rel in undirected else df
    result = engine.apply_epoch(args.epoch, frames)
    count = total_diff(engine.output(query.name))
    negative = {rel: _negative_after(engine, rel, df) for rel, df in frames.items()}
    for rel, (found, rows) in negative.items():
        if found:
            shown = ", ".join(f"{tuple(data)}: {diff}" for data, diff in rows[:_SHOWN])
            more = f" (and {found - _SHOWN} more)" if found > _SHOWN else ""
            warn(
                f"epoch {args.epoch} deleted tuples relation {rel!r} did not hold; "
                f"{found} now have a negative multiplicity: {shown}{more}"
            )
    seconds = clock.perf_counter() - start
    metrics = result.metrics
    say(
        f"epoch {args.epoch}: changes {sum(metrics.changes.values())}, output change rows "
        f"{metrics.outputs.get(query.name, 0)}, count {count}, seconds {seconds:.3f} "
        f"({phases(metrics.seconds)})"
    )
    if output is not None:
        written = write_tuples(result.outputs[query.name], *output)
        say(f"output: {written} tuples of the epoch's change written to {output[0]}")
    if args.json:
        emit_json(
            {
                "command": "apply",
                "query": query.name,
                "epoch": args.epoch,
                "count": count,
                "seconds": round(seconds, 3),
                "metrics": metrics.to_dict(),
                "negative": {rel: [[d, m] for d, m in rows] for rel, (_, rows) in negative.items()},
                **({} if output is None else {"output": str(output[0])}),
            }
        )
    return EXIT_OK


def _negative_after(
    engine: Engine, rel: str, changes: DataFrame
) -> tuple[int, list[tuple[list[int], int]]]:
    """How many tuples the epoch deleted now have a negative multiplicity; the first `_LISTED`.

    Deleting an absent tuple is accepted (relations are signed multisets) but is almost always a
    mistake upstream, so it is reported. Only the deleted tuples are looked up in the relation.
    """
    cols = [c for c in changes.columns if c not in (DIFF, "time")]
    deleted = changes.where(F.col(DIFF) < 0).select(*cols).distinct()
    trace = engine.store.current().traces[relation_trace_name(rel)]
    rows = engine.store.read(trace, trace.batches).join(F.broadcast(deleted), cols, "left_semi")
    count, found = negative_tuples(rows.select(*cols, DIFF), limit=_LISTED)
    return count, [([int(v) for v in data], int(diff)) for data, diff in found]
