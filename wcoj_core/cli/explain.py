"""``wcoj explain``: print a query's plan (its delta rules and variable orders); no Spark.

Contract: the query text or built-in name is parsed and planned; the plan's deterministic text
(`wcoj_core.query.explain`) goes to stdout as it is.
"""

from __future__ import annotations

import argparse
import sys

from wcoj_core.cli.console import EXIT_OK, epilog
from wcoj_core.query.builtins import resolve_query
from wcoj_core.query.explain import explain
from wcoj_core.query.plan import plan_query

EXAMPLES = (
    "wcoj explain --query triangles",
    "wcoj explain --query 'tri(a, b, c) :- edge(a, b), edge(b, c), edge(a, c), a < b, b < c'",
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    exp = commands.add_parser(
        "explain",
        help="print the query's plan",
        description="Print a query's plan: its delta rules and each rule's variable order.",
        epilog=epilog(EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    exp.add_argument(
        "--query", required=True, metavar="Q", help="a built-in query name or query text"
    )
    exp.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(explain(plan_query(resolve_query(args.query))))
    sys.stdout.flush()
    return EXIT_OK
