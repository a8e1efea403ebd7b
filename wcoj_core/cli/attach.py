"""``wcoj attach`` and ``wcoj detach``: add a query to a kept state, or remove one.

``wcoj attach STATE --query Q`` adds ``Q`` to a state holding epochs in one commit
(`wcoj_core.attach`), its output made as of the latest epoch from the kept arrangements; later
``apply`` runs maintain it. ``wcoj detach STATE --query NAME`` removes a query with the traces
only it read (never the last query). Each prints one line, or one JSON line with ``--json``;
docs/cli.md has the details.
"""

from __future__ import annotations

import argparse

from wcoj_core.cli.console import EXIT_OK, add_memory_argument, emit_json, epilog, say
from wcoj_core.errors import QueryError

EXAMPLES = (
    "wcoj attach lake/tri --query 4-cliques",
    "wcoj attach lake/tri --query 'wedges(a, b, c) :- edge(a, b), edge(b, c), a < c' --json",
    "wcoj detach lake/tri --query cliques4",
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, help, run in (
        ("attach", "add a query to a kept state, made from its arrangements", run_attach),
        ("detach", "remove a query from a kept state, with its own traces", run_detach),
    ):
        p = commands.add_parser(
            name,
            help=help,
            description=help[0].upper() + help[1:] + ".",
            epilog=epilog(EXAMPLES),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("state", metavar="STATE", help="the state directory")
        p.add_argument(
            "--query", required=True, metavar="Q", help="a built-in query name or query text"
        )
        if name == "attach":
            add_memory_argument(p)
        p.add_argument("--json", action="store_true", help="end with one JSON line")
        p.set_defaults(run=run)


def run_attach(args: argparse.Namespace) -> int:
    from wcoj_core.engine import Engine
    from wcoj_core.meaning import RelationSpec
    from wcoj_core.query.builtins import resolve_query
    from wcoj_core.store.store import Store

    query = resolve_query(args.query)
    plan = Store.open(args.state, create=False).current().plan
    held = plan.relations if plan is not None else {}
    missing = sorted(set(query.relations) - set(held))
    if missing:
        raise QueryError(
            f"query {query.name} reads {', '.join(missing)}, which the state at {args.state} "
            f"does not hold (it holds {', '.join(sorted(held)) or 'no relation'})"
        )
    specs = {
        r: RelationSpec(r, held[r].arity, held[r].meaning, held[r].undirected)
        for r in query.relations
    }
    engine = Engine(None, args.state, query, relations=specs, create=False, memory=args.memory)
    done = engine.attach([query.name])
    say(
        f"attached {query.name} at epoch {done.epoch} (generation {done.generation}): "
        f"{done.rows[query.name]:,} rows, count {done.counts[query.name]:,}, "
        f"{done.written_bytes:,} bytes written ({done.seconds:.3f} s)"
    )
    if args.json:
        emit_json(
            {
                "command": "attach",
                "query": query.name,
                "epoch": done.epoch,
                "generation": done.generation,
                "rows": done.rows[query.name],
                "count": done.counts[query.name],
                "written_bytes": done.written_bytes,
                "seconds": round(done.seconds, 3),
            }
        )
    return EXIT_OK


def run_detach(args: argparse.Namespace) -> int:
    from wcoj_core.attach import detach
    from wcoj_core.query.builtins import BUILTINS, builtin
    from wcoj_core.store.store import Store

    name = builtin(args.query).name if args.query in BUILTINS else args.query
    committed = detach(Store.open(args.state, create=False), [name])
    say(f"detached {name} (generation {committed.generation})")
    if args.json:
        emit_json({"command": "detach", "query": name, "generation": committed.generation})
    return EXIT_OK
