"""``wcoj replay``: split the inputs into epochs of changes and apply them one by one.

Arguments and input files are checked before Spark starts; each input becomes a seeded stream
(`wcoj_core.replay.epoch_stream`) applied epoch by epoch, a progress line each. ``--check``
compares the final output with a static evaluation (a failure exits 1); ``--json`` ends with one
JSON line (``final_count``, ``check``, ``epochs``, ``seconds_per_epoch``, ``median_seconds``).
"""

from __future__ import annotations

import argparse
from typing import Any

from wcoj_core.cli import workspace
from wcoj_core.cli.apply import relation_meanings
from wcoj_core.cli.console import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    emit_json,
    epilog,
    error,
    phases,
    say,
)
from wcoj_core.cli.count import add_run_arguments
from wcoj_core.cli.inputs import check_files, parse_inputs, read_flagged
from wcoj_core.query.builtins import resolve_query

_MIN_LONG, _MAX_LONG = -(2**63), 2**63 - 1

EXAMPLES = (
    "wcoj replay --query triangles --input edge=graph.txt.gz --undirected edge --epochs 10",
    "wcoj replay --query 4-cycles --input edge=rmat:scale=12,edges=40000 --undirected edge "
    "--epochs 6 --delete-fraction 0.2 --check",
    "wcoj replay --master spark://127.0.0.1:7077 --query triangles --input edge=graph.csv "
    "--epochs 4 --state kept/ --json",
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rep = commands.add_parser(
        "replay",
        help="apply the input over epochs, incrementally",
        description="Split the inputs into epochs of changes and apply them one by one.",
        epilog=epilog(EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(rep)
    rep.add_argument("--epochs", type=int, required=True, metavar="K", help="number of epochs")
    rep.add_argument(
        "--delete-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="fraction of tuples deleted again at a later epoch (default 0)",
    )
    rep.add_argument("--seed", type=int, default=1, metavar="S", help="stream seed (default 1)")
    rep.add_argument(
        "--check", action="store_true", help="compare the final output with a static run"
    )
    rep.set_defaults(run=run)


def _check_numbers(args: argparse.Namespace) -> None:
    """The epoch count, delete fraction and seed, checked before anything is read."""
    if args.epochs < 1:
        raise UsageError(f"--epochs must be at least 1, got {args.epochs}")
    if not 0.0 <= args.delete_fraction <= 1.0:
        raise UsageError(f"--delete-fraction must be between 0 and 1, got {args.delete_fraction}")
    if not _MIN_LONG <= args.seed <= _MAX_LONG:
        raise UsageError(f"--seed must be a 64-bit integer, got {args.seed}")


def _progress(report: Any) -> None:
    say(
        f"epoch {report.epoch + 1}/{report.epochs}: changes {report.changes}, "
        f"output change rows {report.output_changes}, proposed {report.metrics.proposed}, "
        f"validated {report.metrics.validated}, seconds {report.seconds:.3f} "
        f"({phases(report.metrics.seconds)})"
    )


def run(args: argparse.Namespace) -> int:
    from wcoj_core.replay import CheckOutcome, epoch_stream, replay

    query = resolve_query(args.query)
    inputs = parse_inputs(args.input, query)
    specs = relation_meanings(args, dict(query.relations))
    undirected = {rel for rel, spec in specs.items() if spec.undirected}
    _check_numbers(args)
    check_files(query, inputs)
    workspace.prepare_state(args.state)
    spark = workspace.start_spark(args.master, args.conf, "replay splits its inputs into epochs")
    with workspace.state_dir(args.state) as state:
        negative: dict[str, int] = {}
        streams = {
            rel: epoch_stream(
                read_flagged(spark, rel, path, query.relations[rel], negative),
                args.epochs,
                args.delete_fraction,
                args.seed,
                undirected=rel in undirected,
            )
            for rel, path in sorted(inputs.items())
        }
        result = replay(
            spark,
            query,
            streams,
            args.epochs,
            state,
            check=args.check,
            on_epoch=_progress,
            deployment=args.deploy,
            specs=specs,
            memory=args.memory,
        )
    summary = f"final count: {result.final_count}; check: {result.check.value}"
    if result.mismatches:
        summary += f" ({result.mismatches} tuples differ)"
    say(f"{summary}; median epoch seconds {result.median_seconds:.3f}")
    if args.json:
        emit_json(
            {
                "command": "replay",
                "delete_fraction": args.delete_fraction,
                "seed": args.seed,
                "negative_tuples": negative,
                **result.to_dict(),
            }
        )
    if result.check is CheckOutcome.FAILED:
        error(
            f"check failed: {result.mismatches} output tuples differ between the incremental "
            "result and a static recomputation of the final inputs"
        )
        return EXIT_FAILED
    return EXIT_OK
