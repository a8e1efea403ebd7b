"""``wcoj query``: ask a kept state a question, answered from its arrangements; nothing written.

``wcoj query STATE --query Q [--epoch T] [--bind VAR=VALUES ...] [--output FILE] [--json]``
answers any conjunctive query over the state's relations as of epoch ``T`` (default: the
latest) on this process from the mapped arrangements (`wcoj_core.ask`): no Spark, no write, no
lock. ``--bind`` binds a variable to each of some values (``7,9,12`` or ``@FILE``), several
position by position. It prints the first rows and one summary line; ``--json`` ends with one
JSON line (``rows``, ``count``, ``epoch``, ``generation``, ``columns``, ``seconds``). See
docs/cli.md.
"""

from __future__ import annotations

import argparse
import time as clock
from pathlib import Path
from typing import TYPE_CHECKING

from wcoj_core.cli.console import EXIT_OK, UsageError, emit_json, epilog, epoch_argument, say
from wcoj_core.cli.results import add_output_arguments, check_output, write_tuples
from wcoj_core.query.builtins import resolve_query

if TYPE_CHECKING:
    import numpy as np

EXAMPLES = (
    "wcoj query lake/tri --query 'q(b, c) :- edge(7, b), edge(b, c), edge(7, c), b < c'",
    "wcoj query lake/tri --query 'per(v, count()) :- edge(v, b), edge(b, c), edge(v, c), "
    "b < c' --bind v=7,9,12",
    "wcoj query lake/tri --query 4-cliques --epoch 2 --output cliques.parquet --json",
)
# Rows printed before the summary line (every row: --output).
SHOWN = 20


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "query",
        help="ask a kept state any query, answered from its arrangements (nothing written)",
        description="Answer a conjunctive query over a state's relations as of an epoch, from "
        "its kept arrangements, on this process: no Spark, nothing written.",
        epilog=epilog(EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("state", metavar="STATE", help="the state directory")
    p.add_argument(
        "--query", required=True, metavar="Q", help="a built-in query name or query text"
    )
    p.add_argument(
        "--epoch", type=epoch_argument, metavar="T", help="as of epoch T (default: the latest)"
    )
    p.add_argument(
        "--bind",
        action="append",
        default=[],
        metavar="VAR=VALUES",
        help="bind VAR to each of VALUES (7,9,12 or @FILE, a value per line): one answer for all",
    )
    add_output_arguments(p, "every row of the answer")
    p.add_argument("--json", action="store_true", help="end with one JSON line of the answer")
    p.set_defaults(run=run)


def parse_binds(binds: list[str]) -> dict[str, list[int]]:
    """``--bind`` arguments as variable -> values (all of one length).

    >>> parse_binds(["v=7, 9", "w=1,2"])
    {'v': [7, 9], 'w': [1, 2]}
    >>> parse_binds(["v=7", "w=1,2"])
    Traceback (most recent call last):
      ...
    wcoj_core.cli.console.UsageError: --bind: v has 1 value(s), w has 2; give each variable as many values
    """
    out: dict[str, list[int]] = {}
    for arg in binds:
        var, eq, text = arg.partition("=")
        var = var.strip()
        if not eq or not var.isidentifier() or var in out:
            raise UsageError(f"--bind {arg!r}: give VAR=VALUES, each variable once")
        if text.startswith("@"):
            try:
                lines = Path(text[1:]).read_text().splitlines()
            except OSError as e:
                raise UsageError(f"--bind {arg!r}: cannot read {text[1:]} ({e.strerror})") from e
            items = [s.split("#")[0].strip() for s in lines]
        else:
            items = [s.strip() for s in text.split(",")]
        try:
            out[var] = [int(s) for s in items if s]
        except ValueError as e:
            raise UsageError(f"--bind {arg!r}: the values must be integers ({e})") from e
        if not out[var]:
            raise UsageError(f"--bind {arg!r}: no value given")
    sizes = {len(v) for v in out.values()}
    if len(sizes) > 1:
        first, *rest = out.items()
        other = next(kv for kv in rest if len(kv[1]) != len(first[1]))
        raise UsageError(
            f"--bind: {first[0]} has {len(first[1])} value(s), {other[0]} has {len(other[1])}; "
            "give each variable as many values"
        )
    return out


def run(args: argparse.Namespace) -> int:
    query = resolve_query(args.query)
    binds = parse_binds(args.bind)
    output = (
        check_output(args.output, force=args.force, state=args.state)
        if args.output is not None
        else None
    )
    start = clock.perf_counter()
    import numpy as np

    from wcoj_core.ask import Snapshot

    snapshot = Snapshot.open(args.state, args.epoch)
    question = snapshot.question(query, list(binds))
    values = np.array(list(zip(*binds.values(), strict=True)), dtype=np.int64) if binds else None
    cols, last = snapshot.answer(question, values)  # numbers: Arrow only for --output
    seconds = clock.perf_counter() - start
    total = int(last.sum(dtype=object)) if len(last) else 0
    names = question.names
    for line in _shown(names, [*cols, last]):
        say(line)
    what = "groups" if query.aggregate is not None else "rows"
    say(
        f"{query.name} at epoch {snapshot.epoch} (generation {snapshot.generation}): "
        f"{len(last):,} {what}, {names[-1]} summed {total:,} ({seconds:.3f} s)"
    )
    if output is not None:
        from wcoj_core.ask import table_of

        answer = table_of(question, (cols, last))
        written = write_tuples(answer, *output, force=args.force, state=args.state)
        say(f"output: {written} rows written to {output[0]}")
    if args.json:
        emit_json(
            {
                "command": "query",
                "query": query.name,
                "epoch": snapshot.epoch,
                "generation": snapshot.generation,
                "columns": names,
                "rows": len(last),
                "count": total,
                "seconds": round(seconds, 4),
                **({} if output is None else {"output": str(output[0])}),
                **({} if query.aggregate is None else {"groups": len(last), "total": total}),
            }
        )
    return EXIT_OK


def _shown(names: list[str], columns: list[np.ndarray]) -> list[str]:
    """The answer's first `SHOWN` rows as aligned columns, and how many more there are."""
    n = len(columns[-1])
    cols = [[name, *map(str, c[:SHOWN].tolist())] for name, c in zip(names, columns, strict=True)]
    widths = [max(map(len, c)) for c in cols]
    out = [
        "  ".join(c[i].rjust(w) for c, w in zip(cols, widths, strict=True))
        for i in range(min(n, SHOWN) + 1)
    ]
    if n > SHOWN:
        out.append(f"... {n - SHOWN:,} more rows (--output FILE writes them all)")
    return out
