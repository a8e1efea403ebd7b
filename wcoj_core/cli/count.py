"""``wcoj count``: evaluate a query once over whole inputs and print the sum of its output.

Contract: arguments, input files (`inputs.check_files`) and ``--output`` are checked before Spark
starts; the inputs are read (undirected relations symmetric and loop-free, negative tuples of a
CSV or Parquet input warned about) and evaluated as one epoch on a fresh state
(`evaluate_static`). Prints one line ``count: N (seconds ...)``; ``--output FILE`` also writes
the output's tuples (``c0 ..``, ``diff``) as Parquet or CSV; ``--json`` ends with one JSON line
holding at least ``count`` and ``seconds``.
"""

from __future__ import annotations

import argparse
import time as clock

from wcoj_core.cli import workspace
from wcoj_core.cli.console import EXIT_OK, add_deploy_argument, emit_json, epilog, say
from wcoj_core.cli.inputs import (
    check_files,
    check_undirected,
    parse_inputs,
    read_relations,
)
from wcoj_core.cli.results import check_output, write_tuples
from wcoj_core.engine import evaluate_static
from wcoj_core.query.parse import resolve_query

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
    count.add_argument(
        "--output",
        metavar="FILE",
        help="also write the output's tuples (c0.., diff) to FILE, .parquet or .csv",
    )
    count.set_defaults(run=run)


def add_run_arguments(p: argparse.ArgumentParser, query_default: str | None = None) -> None:
    """The arguments of every command that reads inputs and runs the engine (``count``,
    ``replay``, the benchmarks): query, inputs, Spark, deployment, state, JSON."""
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
    p.add_argument(
        "--undirected",
        action="append",
        default=[],
        metavar="REL",
        help="read binary relation REL as undirected edges, present in both directions",
    )
    workspace.add_spark_arguments(p)
    add_deploy_argument(p)
    p.add_argument("--state", metavar="DIR", help="keep the state in DIR (new or empty)")
    p.add_argument("--json", action="store_true", help="end with one JSON line of results")


def run(args: argparse.Namespace) -> int:
    query = resolve_query(args.query)
    inputs = parse_inputs(args.input, query)
    undirected = check_undirected(args.undirected, query, inputs)
    output = check_output(args.output) if args.output is not None else None
    check_files(query, inputs)
    workspace.prepare_state(args.state)
    spark = workspace.start_spark(args.master, args.conf)
    with workspace.state_dir(args.state) as state:
        start = clock.perf_counter()
        negative: dict[str, int] = {}
        relations = read_relations(spark, query, inputs, undirected, negative)
        loaded = clock.perf_counter()
        result = evaluate_static(spark, query, relations, state, deployment=args.deploy)
        count = result.total(query.name)
        seconds = clock.perf_counter() - loaded
        written = None if output is None else write_tuples(result.outputs[query.name], *output)
    metrics = result.metrics
    output_rows = metrics.outputs.get(query.name, 0)
    say(
        f"count: {count} (seconds {seconds:.3f}; proposed {metrics.proposed}, "
        f"validated {metrics.validated}, output rows {output_rows})"
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
                "input_seconds": round(loaded - start, 3),
                "proposed": metrics.proposed,
                "validated": metrics.validated,
                "output_rows": output_rows,
                "negative_tuples": negative,
                "metrics": metrics.to_dict(),
                **({} if output is None else {"output": str(output[0])}),
            }
        )
    return EXIT_OK
