"""``wcoj apply``: add one epoch of changes to a kept state and print the output's change.

Contract: the query, the ``--changes`` files (data columns, then an optional signed ``diff``),
the epoch, the relations' meaning and the state path are checked before anything is read; the
files' contents as far as that is cheap. A local state fed local files is served without Spark:
the files are read with pyarrow, the state's arrangements are mapped, the epoch is applied in
one pass and one commit (`wcoj_core.engine.Engine.apply`); Spark starts — announced on one line
with the reason — only for what needs it (a generator or remote input, a remote state, the
executors deployment).

Epochs are applied once, in increasing order: an epoch at or before the state's is refused, and
of two runs applying the same epoch one commits and the other is refused. ``--replace``
replaces an epoch the state holds (a correction): the later epochs are derived again at once.
A relation is a set or a bag (``--set``, ``--bag``; an ``--undirected`` relation is a set unless
``--bag`` says otherwise); the state records it and refuses another declaration. Changes that
change nothing (a set's present tuple inserted, or absent one deleted) and a bag's tuples left
with a negative multiplicity are warned about, naming a few. Prints one line with the changes,
the output change's rows, the output's count and the seconds per phase; ``--output FILE`` also
writes the epoch's output change (``c0 ..``, ``diff``) as Parquet or CSV; ``--json`` ends with
one JSON line. For an aggregate query ``--output`` writes its table as of the epoch (the
groups' columns, then the value named after the aggregate) and the JSON ends with ``groups``
and ``total``. An interruption says whether the epoch was applied.
"""

from __future__ import annotations

import argparse
import time as clock
from typing import Any

from wcoj_core.cli import workspace
from wcoj_core.cli.console import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    ProgressLine,
    UsageError,
    add_deploy_argument,
    add_memory_argument,
    emit_json,
    epilog,
    epoch_argument,
    error,
    phases,
    say,
    state_argument,
    warn,
)
from wcoj_core.cli.inputs import check_files, needs_spark, parse_changes
from wcoj_core.cli.results import add_output_arguments, check_output, write_tuples
from wcoj_core.engine import Engine
from wcoj_core.epoch import EpochResult
from wcoj_core.errors import StateError, WcojError
from wcoj_core.errors import out_of_memory as ran_out
from wcoj_core.meaning import RelationSpec
from wcoj_core.query.builtins import resolve_query
from wcoj_core.store.manifest import Manifest

EXAMPLES = (
    "wcoj apply --query triangles --state lake/tri --epoch 0 --changes edge=initial.parquet "
    "--undirected edge",
    "wcoj apply --query triangles --state lake/tri --epoch 3 --changes edge=changes-3.csv "
    "--undirected edge --output change-3.csv",
    "wcoj apply --query triangles --state lake/tri --epoch 1 --replace --changes "
    "edge=corrected-1.csv --undirected edge",
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
        "--state",
        required=True,
        type=state_argument,
        metavar="DIR",
        help="the state directory (created when new or empty)",
    )
    app.add_argument(
        "--epoch", type=epoch_argument, required=True, metavar="T", help="the epoch (>= 0)"
    )
    app.add_argument(
        "--changes",
        action="append",
        default=[],
        metavar="REL=PATH",
        help="a relation's changes at the epoch: data columns, then an optional signed diff",
    )
    add_meaning_arguments(app)
    app.add_argument(
        "--replace",
        action="store_true",
        help="replace an epoch the state holds (a correction); later epochs are derived again",
    )
    app.add_argument(
        "--keep-epochs",
        type=int,
        default=32,
        metavar="N",
        help="keep the last N epochs re-runnable; older history is merged once a trace holds "
        "2N batches (default 32; 0 keeps every epoch)",
    )
    add_output_arguments(app, "the epoch's output change")
    add_deploy_argument(app)
    add_memory_argument(app)
    workspace.add_spark_arguments(app)
    app.add_argument("--json", action="store_true", help="end with one JSON line of results")
    app.set_defaults(run=run)


def add_meaning_arguments(p: argparse.ArgumentParser) -> None:
    """``--undirected``, ``--set`` and ``--bag``: what each relation's tuples mean."""
    p.add_argument(
        "--undirected",
        action="append",
        default=[],
        metavar="REL",
        help="binary relation REL's changes are edges in no direction: (a, b) is also (b, a), "
        "self-loops dropped; a set unless --bag REL",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        dest="sets",
        metavar="REL",
        help="relation REL is a set: each tuple present or not (default for --undirected)",
    )
    p.add_argument(
        "--bag",
        action="append",
        default=[],
        dest="bags",
        metavar="REL",
        help="relation REL is a bag: signed multiplicities (default unless --undirected)",
    )


def relation_meanings(args: argparse.Namespace, arities: dict[str, int]) -> dict[str, RelationSpec]:
    """Every relation's spec from ``--undirected``, ``--set`` and ``--bag``."""
    from wcoj_core.meaning import relation_specs

    return relation_specs(arities, undirected=args.undirected, sets=args.sets, bags=args.bags)


def run(args: argparse.Namespace) -> int:
    query = resolve_query(args.query)
    changes = parse_changes(args.changes, query)
    specs = relation_meanings(args, dict(query.relations))
    output = (
        check_output(args.output, force=args.force, inputs=list(changes.values()), state=args.state)
        if args.output is not None
        else None
    )
    if args.keep_epochs < 0:
        raise UsageError(f"--keep-epochs must be 0 or more, got {args.keep_epochs}")
    engine: Engine | None = None
    base: Manifest | None = None
    new = workspace.new_state(args.state)  # a failed first epoch leaves nothing behind there
    try:
        check_files(query, changes)
        starter = workspace.starter(args.master, args.conf)
        start = clock.perf_counter()
        line = ProgressLine()
        engine = Engine(
            starter,
            args.state,
            query,
            relations=specs,
            deployment=args.deploy,
            compact_every=args.keep_epochs,
            memory=args.memory,
            progress=line,
        )
        base = engine.store.current()
        frames = read_changes(query, changes, starter)
        try:
            result = engine.apply(args.epoch, frames, replace=args.replace)
        finally:
            line.done()
    except KeyboardInterrupt:
        return _stopped(engine, base, args.epoch, new, args.state, "interrupted")
    except BaseException as e:
        if ran_out(e):
            return _stopped(engine, base, args.epoch, new, args.state, out_of_memory(e))
        if new is not None:
            workspace.unmake_state(args.state, new)
        raise
    rebuilt: list[EpochResult] = []
    if args.replace:
        try:
            rebuilt = engine.refresh()
        except KeyboardInterrupt:
            error(
                f"interrupted after epoch {args.epoch} was replaced; the later epochs it made "
                "stale are derived again before the next epoch is applied"
            )
            return EXIT_INTERRUPTED
        except WcojError as e:
            raise StateError(
                f"epoch {args.epoch} was replaced, but deriving the later epochs again failed: {e}"
            ) from e
    try:
        return _report(args, query.name, engine, result, rebuilt, output, start, changes)
    except KeyboardInterrupt:
        error(f"interrupted after epoch {args.epoch} was applied")
        return EXIT_INTERRUPTED
    except (MemoryError, OSError) as e:
        if not ran_out(e):
            raise
        error(f"{out_of_memory(e)} after epoch {args.epoch} was applied")
        return EXIT_FAILED
    except WcojError as e:
        raise UsageError(
            f"epoch {args.epoch} was applied (generation {result.generation}), but {e}"
        ) from e


def _stopped(
    engine: Engine | None,
    base: Manifest | None,
    epoch: int,
    new: bool | None,
    state: str,
    why: str,
) -> int:
    """Say whether a run stopped by `why` (an interruption, memory running out) committed its
    epoch (a batch at the epoch that the state did not hold before), and exit 130 (interrupted)
    or 1. A state this run created and left without an epoch is removed."""
    code = EXIT_INTERRUPTED if why == "interrupted" else EXIT_FAILED
    if engine is not None and base is not None:  # else the state was not opened: nothing written
        after = engine.store.current()
        at = [
            {b.path for t in m.traces.values() for b in t.batches if b.time == epoch}
            for m in (base, after)
        ]
        if at[1] - at[0]:
            error(f"{why} after epoch {epoch} was applied (generation {after.generation})")
            return code
    if new is not None:
        workspace.unmake_state(state, new)
    error(f"{why}: epoch {epoch} was not applied; the state is as it was")
    return code


def out_of_memory(e: BaseException) -> str:
    """What to say when memory ran out (one line, with what numpy or Arrow could not get)."""
    detail = " ".join(str(e).split())[:200]
    return "out of memory" + (f" ({detail})" if detail else "")


def read_changes(query: Any, changes: dict[str, str], starter: Any) -> dict[str, Any]:
    """Each relation's changes: read with pyarrow when every file is local, else by Spark."""
    from wcoj_core.input_read import read_local_batches

    if not needs_spark(changes):
        return {
            rel: read_local_batches(path, query.relations[rel], rel)
            for rel, path in changes.items()
        }
    from wcoj_core.input_spark import read_relation

    spark = starter("an input is not a local file")
    return {
        rel: read_relation(spark, path, query.relations[rel], rel)
        for rel, path in sorted(changes.items())
    }


def warn_about(epoch: int, result: EpochResult) -> None:
    """Warnings for arrangements rebuilt from the batches (a damaged or missing file), changes
    that changed nothing, negative multiplicities, self-loops."""
    for line in result.metrics.rebuilt:
        warn(f"epoch {epoch}: arrangements rebuilt from the batches: {line}")
    for rel, r in result.relations.items():
        if r.self_loops:
            warn(
                f"epoch {epoch}: {r.self_loops} self-loop(s) of undirected relation {rel!r} dropped"
            )
        ignored = r.inserted_present + r.deleted_absent
        if ignored:
            shown = ", ".join(f"{t} {'+' if d > 0 else '-'}" for t, d in r.ignored_examples)
            warn(
                f"epoch {epoch}: {ignored} change(s) to set {rel!r} changed nothing "
                f"({r.inserted_present} insert(s) of present tuples, {r.deleted_absent} "
                f"delete(s) of absent ones): {shown}{' ...' if ignored > len(r.ignored_examples) else ''}"
            )
        if r.negative:
            shown = ", ".join(f"{t}: {m}" for t, m in r.negative_examples)
            left = r.negative - len(r.negative_examples)
            more = f" (and {left} more)" if left > 0 else ""
            warn(
                f"epoch {epoch} deleted tuples relation {rel!r} did not hold; {r.negative} now "
                f"have a negative multiplicity: {shown}{more}"
            )


def _report(
    args: argparse.Namespace,
    query: str,
    engine: Engine,
    result: EpochResult,
    rebuilt: list[EpochResult],
    output: Any,
    start: float,
    changes: dict[str, str],
) -> int:
    warn_about(args.epoch, result)
    seconds = clock.perf_counter() - start
    metrics = result.metrics
    count = result.count(query)
    landed = sum(r.landed for r in result.relations.values())
    memory = f"; {metrics.memory.describe()}" if metrics.memory is not None else ""
    say(
        f"epoch {args.epoch}: changes {sum(metrics.changes.values())} (landed {landed}), output "
        f"change rows {metrics.outputs.get(query, 0)}, count {count}, seconds {seconds:.3f} "
        f"({phases(metrics.seconds)}{memory})"
    )
    if result.rebuilt or rebuilt:
        done = [r.epoch for r in (*result.rebuilt, *rebuilt)]
        say(f"derived again: epochs {', '.join(map(str, done))} (stale after a correction)")
    served, figures = engine.queries[query], result.traces[f"out/{query}"].figures
    if output is not None:
        _write_output(args, query, engine, result, output, changes)
    if args.json:
        emit_json(
            {
                "command": "apply",
                "query": query,
                "epoch": args.epoch,
                "count": count,
                "rows": figures.rows,
                "change_rows": metrics.outputs.get(query, 0),
                "change_total": result.total(query),
                "seconds": round(seconds, 3),
                "generation": result.generation,
                "spark": engine.starter.reason,
                "metrics": metrics.to_dict(),
                "relations": {
                    rel: {
                        "landed": r.landed,
                        "changed": r.changed,
                        "self_loops_dropped": r.self_loops,
                        "inserted_present": r.inserted_present,
                        "deleted_absent": r.deleted_absent,
                        "negative": r.negative,
                    }
                    for rel, r in result.relations.items()
                },
                "negative": {
                    rel: [[list(d), m] for d, m in r.negative_examples]
                    for rel, r in result.relations.items()
                },
                "rebuilt": [r.epoch for r in (*result.rebuilt, *rebuilt)],
                **({} if output is None else {"output": str(output[0])}),
                **({} if served.aggregate is None else {"groups": figures.rows, "total": count}),
            }
        )
    return EXIT_OK


def _write_output(
    args: argparse.Namespace,
    query: str,
    engine: Engine,
    result: EpochResult,
    output: Any,
    changes: dict[str, str],
) -> None:
    """``--output``: an aggregate's groups as of the epoch, or the epoch's change of the output."""
    if engine.queries[query].aggregate is not None:
        from wcoj_core import aggregates

        table = aggregates.table(engine, engine.queries[query], args.epoch)
        what = "groups of {} as of the epoch"
    elif (arrays := result.changes.get(query)) is None:  # read from its batch, a file at a time
        table = engine.change_batches(query, args.epoch)
        what = "tuples of the epoch's change"
    else:
        from wcoj_core.kernel.changes import changes_table

        cols = engine.trace_columns(f"out/{query}")
        table = changes_table(cols, *arrays, args.epoch).drop_columns(["time"])
        what = "tuples of the epoch's change"
    written = write_tuples(
        table, *output, force=args.force, inputs=list(changes.values()), state=args.state
    )
    say(f"output: {written} {what.format(query)} written to {output[0]}")
