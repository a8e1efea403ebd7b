"""``wcoj count``: evaluate a query once over whole inputs and print the sum of its output.

Arguments, input files and ``--output`` are checked before anything is read; the inputs (local
files without Spark, a generator or remote input through Spark) are applied as one epoch to a
fresh state (`evaluate_static`) with their meanings (``--undirected``, ``--set``, ``--bag``). It
prints ``count: N (seconds ...)``; ``--output`` writes the tuples, ``--json`` ends with one JSON
line (an aggregate's adds ``groups`` and ``total``); ``--state DIR`` keeps the state for later
``wcoj apply`` epochs.
"""

from __future__ import annotations

import argparse
import time as clock
from pathlib import Path
from typing import Any

from wcoj_core.cli import workspace
from wcoj_core.cli.apply import add_meaning_arguments, read_changes, relation_meanings, warn_about
from wcoj_core.cli.console import (
    EXIT_OK,
    ProgressLine,
    add_deploy_argument,
    add_memory_argument,
    emit_json,
    epilog,
    say,
    state_argument,
)
from wcoj_core.cli.inputs import check_files, parse_inputs
from wcoj_core.cli.results import OutputFormat, add_output_arguments, check_output, write_tuples
from wcoj_core.engine import Engine
from wcoj_core.query.builtins import resolve_query
from wcoj_core.query.ir import Query
from wcoj_core.query.plan import counted

EXAMPLES = (
    "wcoj count --query triangles --input edge=graph.txt.gz --undirected edge",
    "wcoj count --query 4-cliques --input edge=rmat:scale=12,edges=40000 --undirected edge --json",
    "wcoj count --query 'p(a, b) :- r(a, b), s(b, a)' --input r=r.csv --input s=s.parquet "
    "--output p.parquet",
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    count = commands.add_parser(
        "count",
        help="evaluate a query statically and count its output",
        description="Evaluate a query once over whole inputs and print the sum of its output.",
        epilog=epilog(EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(count)
    add_output_arguments(count)
    count.set_defaults(run=run)


def add_run_arguments(p: argparse.ArgumentParser, query_default: str | None = None) -> None:
    """The arguments of every command that reads inputs and runs the engine (``count``,
    ``replay``, the benchmarks): query, inputs, meanings, Spark, deployment, state, JSON."""
    if query_default is None:
        p.add_argument(
            "--query", required=True, metavar="Q", help="a built-in query name or query text"
        )
    else:
        p.add_argument(
            "--query",
            default=query_default,
            metavar="Q",
            help=f"a built-in query name or query text (default {query_default})",
        )
    p.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="REL=PATH",
        help="a relation file (text, CSV, Parquet) or generator spec (rmat:...)",
    )
    add_meaning_arguments(p)
    workspace.add_spark_arguments(p)
    add_deploy_argument(p)
    add_memory_argument(p)
    p.add_argument(
        "--state",
        type=state_argument,
        metavar="DIR",
        help="keep the state in DIR (new or empty)",
    )
    p.add_argument("--json", action="store_true", help="end with one JSON line of results")


def run(args: argparse.Namespace) -> int:
    query = resolve_query(args.query)
    inputs = parse_inputs(args.input, query)
    specs = relation_meanings(args, dict(query.relations))
    output = (
        check_output(args.output, force=args.force, inputs=list(inputs.values()), state=args.state)
        if args.output is not None
        else None
    )
    check_files(query, inputs)
    if args.state is None and output is None:  # nothing kept: a clique is counted oriented
        query = counted(query, [r for r, s in specs.items() if s.undirected])
    new = None if args.state is None else workspace.new_state(args.state)
    workspace.prepare_state(args.state)
    starter = workspace.starter(args.master, args.conf)
    with workspace.state_dir(args.state) as state:
        start = clock.perf_counter()
        relations = read_changes(query, inputs, starter)
        loaded = clock.perf_counter()
        line = ProgressLine()
        engine = Engine(
            starter,
            state,
            query,
            relations=specs,
            deployment=args.deploy,
            memory=args.memory,
            progress=line,
        )
        engine.persist_index = engine.persist_index and args.state is not None
        try:
            if args.state is None and output is None:
                # nothing to keep: nothing written, and the output only counted
                result = engine.evaluate(relations, count_only=True)
            else:
                result = engine.apply(0, relations)
        except BaseException:
            # Streamed inputs are read as the epoch lands them: a refused one leaves no state.
            if new is not None and args.state is not None:
                workspace.unmake_state(args.state, new)
            raise
        finally:
            line.done()
        count = result.count(query.name)
        seconds = clock.perf_counter() - loaded
        written = None
        if output is not None:
            written = write_tuples(
                _output_table(engine, query, result),
                *output,
                force=args.force,
                inputs=list(inputs.values()),
                state=args.state,
            )
    warn_about(0, result)
    _report(args, engine, query, result, (count, seconds, loaded - start), output, written)
    return EXIT_OK


def _report(
    args: argparse.Namespace,
    engine: Engine,
    query: Query,
    result: Any,
    figures: tuple[int, float, float],
    output: tuple[Path, OutputFormat] | None,
    written: int | None,
) -> None:
    """The count's line (and the output's), and its JSON when asked; `figures` are the count
    and the seconds of the evaluation and of reading the inputs."""
    count, seconds, input_seconds = figures
    metrics = result.metrics
    output_rows = metrics.outputs.get(query.name, 0)
    memory = f"; {metrics.memory.describe()}" if metrics.memory is not None else ""
    groups = result.traces[f"out/{query.name}"].figures.rows
    grouped = "" if query.aggregate is None else f"groups {groups:,}; "
    say(
        f"count: {count} ({grouped}seconds {seconds:.3f}; proposed {metrics.proposed}, "
        f"validated {metrics.validated}, output rows {output_rows}{memory})"
    )
    if output is not None:
        say(f"output: {written} tuples written to {output[0]}")
    if args.json:
        emit_json(
            {
                "command": "count",
                "query": query.name,
                "count": count,
                "seconds": round(seconds, 3),
                "input_seconds": round(input_seconds, 3),
                "proposed": metrics.proposed,
                "validated": metrics.validated,
                "output_rows": output_rows,
                "spark": engine.starter.reason,
                "negative_tuples": {
                    rel: r.negative for rel, r in result.relations.items() if r.negative
                },
                "metrics": metrics.to_dict(),
                **({} if output is None else {"output": str(output[0])}),
                **({} if query.aggregate is None else {"groups": groups, "total": count}),
            }
        )


def _output_table(engine: Engine, query: Query, result: Any) -> Any:
    """The output's tuples (the change of its first epoch) as an Arrow table (an aggregate's
    values named after it)."""
    if query.aggregate is not None:
        from wcoj_core import aggregates

        return aggregates.table(engine, query, 0)
    arrays = result.changes.get(query.name)
    if arrays is None:  # read from its batch, a file at a time
        return engine.change_batches(query.name, 0)
    from wcoj_core.kernel.changes import changes_table

    rows, diff = arrays
    cols = engine.trace_columns(f"out/{query.name}")
    return changes_table(cols, rows, diff, 0).drop_columns(["time"])
