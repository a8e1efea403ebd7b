"""The ``wcoj`` command line: count a query statically, replay it over epochs, explain its plan.

Commands::

    wcoj count   --query Q --input REL=PATH [--input ...] [--undirected REL] [--no-keyed] [--json]
    wcoj replay  --query Q --input REL=PATH ... --epochs K [--delete-fraction F] [--seed S]
                 [--check] [--no-keyed] [--json]
    wcoj bench   [--query Q] --input REL=PATH ... --epochs K --epoch-size N [--skew D]
                 [--seed S] [--methods recompute,binary-delta,wcoj] [--json]
    wcoj bench   --static [--query Q] --input REL=PATH ... [--undirected REL] [--repeat R]
                 [--methods wcoj,wcoj-spark,spark-sql,neighbour-array,duckdb,kuzu,scipy] [--json]
    wcoj bench   --curve size --input REL=rmat:seed=S ... [--sizes E,..] [--epoch-size N]
                 [--epochs K] [--methods binary-delta,wcoj] [--plot PNG] [--save JSON] [--json]
    wcoj bench   --curve epoch-size --input REL=PATH ... [--epoch-sizes N,..] [--epochs K]
                 [--methods binary-delta,wcoj] [--plot PNG] [--save JSON] [--json]
    wcoj apply   --query Q --state DIR --epoch T --changes REL=PATH ... [--undirected REL]
                 [--no-keyed] [--json]
    wcoj explain --query Q
    wcoj cluster up [--workers N] [--cores C] [--memory M] [--port P] [--ui-port P] [--dir DIR]
    wcoj cluster down|status [--dir DIR]

``count`` and ``replay`` also take ``--master URL`` (default ``local[*]``) and ``--state DIR``
(default: a fresh temporary directory, removed at exit; with ``--state`` the directory is kept).
``--no-keyed`` keeps every epoch on Spark's dataflow path, even one the driver's keyed path
could take (`wcoj_core.keyed`).
``apply`` adds one epoch of changes to a kept state directory (new or holding earlier epochs
only: epochs are applied once, in increasing order; a second writer of the same epoch is refused).
``Q`` is the name of a built-in query or query text. ``--undirected REL`` reads a binary relation
as the set of its undirected edges, each present in both directions.

Contract:

* everything that can be checked without Spark is checked before Spark starts: the query text,
  the ``--input`` syntax, duplicate inputs, inputs the query does not use and relations it uses
  without an input, ``--undirected`` naming a relation that is not given or not binary, missing
  input files (generator specs such as ``rmat:scale=10`` are parsed instead), the epoch count,
  the delete fraction, the seed and the state directory;
* with ``--json`` the last line on stdout is one JSON object: for ``count`` at least ``count``
  (the sum of the output's multiplicities) and ``seconds``; for ``replay`` at least
  ``final_count``, ``check`` (``passed``, ``failed`` or ``skipped``), ``epochs``,
  ``seconds_per_epoch`` and ``median_seconds``;
* exit status: 0 on success; 1 when a replay check fails or Spark fails; 2 for a user mistake
  (any `WcojError`, including bad arguments); 130 on interruption. An error is one line on stderr,
  ``wcoj: error: ...``, naming the file, line and column (or the query position) when it has
  them; never a traceback, unless the environment sets ``WCOJ_DEBUG=1``.

>>> main(["explain", "--query", "p(a) :- e(a"])
2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time as clock
import traceback
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlparse

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from wcoj_core import cluster, generate, linear
from wcoj_core.arrangement import relation_trace_name
from wcoj_core.bench import METHODS, Sample, bench, make_workload
from wcoj_core.curves import (
    CURVE_METHODS,
    CURVES,
    DEFAULT_EPOCH_SIZE,
    DEFAULT_EPOCH_SIZES,
    DEFAULT_EPOCHS,
    DEFAULT_SIZES,
    Curve,
    check_curve_methods,
    check_points,
    parse_points,
    plot_curve,
    run_curve,
    save_curve,
    sized_spec,
)
from wcoj_core.engine import KEYED_EPOCH_ROWS, Engine, evaluate_static
from wcoj_core.errors import InputError, QueryError, WcojError
from wcoj_core.query.explain import explain
from wcoj_core.query.ir import Query
from wcoj_core.query.parse import resolve_query
from wcoj_core.query.plan import plan_query
from wcoj_core.replay import CheckOutcome, EpochReport, epoch_stream, replay
from wcoj_core.sources import (
    Format,
    canonical_undirected,
    detect_format,
    negative_tuples,
    read_relation,
)
from wcoj_core.spark import session
from wcoj_core.static_bench import STATIC_DEFAULT, StaticRun, static_bench
from wcoj_core.updates import DIFF, total_diff

PROG = "wcoj"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
_MIN_LONG, _MAX_LONG = -(2**63), 2**63 - 1


# Spark's own console logging, cut down to errors on stderr; used for a session this CLI starts.
class UsageError(WcojError):
    """Command-line arguments that do not describe a run."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are `UsageError`s, reported in one line like any other."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


# --- arguments ----------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Incremental worst-case-optimal joins on Spark.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add_query(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--query", required=True, metavar="Q", help="a built-in query name or query text"
        )

    def add_run(p: argparse.ArgumentParser, query_default: str | None = None) -> None:
        if query_default is None:
            add_query(p)
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
        p.add_argument("--master", metavar="URL", help="Spark master (default local[*])")
        p.add_argument("--state", metavar="DIR", help="keep the state in DIR (new or empty)")
        p.add_argument("--json", action="store_true", help="end with one JSON line of results")

    count = commands.add_parser("count", help="evaluate a query statically and count its output")
    add_run(count)
    count.add_argument(
        "--no-keyed",
        action="store_true",
        help="evaluate on Spark even when the input is small enough for the driver's keyed path",
    )
    count.set_defaults(run=_count)

    rep = commands.add_parser("replay", help="apply the input over epochs, incrementally")
    add_run(rep)
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
        "--no-keyed",
        action="store_true",
        help="evaluate on Spark even when an epoch is small enough for the driver's keyed path",
    )
    rep.add_argument(
        "--check", action="store_true", help="compare the final output with a static run"
    )
    rep.set_defaults(run=_replay)

    ben = commands.add_parser(
        "bench", help="the same epochs through recompute, binary-delta and wcoj, side by side"
    )
    add_run(ben, query_default="triangles")
    ben.add_argument("--epochs", type=int, metavar="K", help="timed epochs")
    ben.add_argument("--epoch-size", type=int, metavar="N", help="changed tuples per epoch")
    ben.add_argument(
        "--static",
        action="store_true",
        help="count the whole input once per method instead (wcoj, Spark SQL, neighbour "
        "arrays, DuckDB, Kuzu, scipy); no epochs",
    )
    ben.add_argument(
        "--repeat", type=int, default=3, metavar="R", help="--static: timed runs per method"
    )
    ben.add_argument(
        "--skew",
        type=int,
        metavar="D",
        help="add an epoch in which a new vertex gains D edges",
    )
    ben.add_argument("--seed", type=int, default=1, metavar="S", help="workload seed (default 1)")
    ben.add_argument(
        "--methods",
        metavar="M,..",
        help=f"methods to run, wcoj always among them (default {','.join(METHODS)}; with "
        f"--static {','.join(STATIC_DEFAULT)}; with --curve {','.join(CURVE_METHODS)})",
    )
    ben.add_argument(
        "--curve",
        choices=CURVES,
        help="measure a scale curve instead: seconds per epoch against graph size (generated "
        "R-MAT graphs) or against epoch size; writes a log-log PNG",
    )
    ben.add_argument(
        "--sizes",
        metavar="E,..",
        help=f"--curve size: graph sizes in edges (default {','.join(map(str, DEFAULT_SIZES))})",
    )
    ben.add_argument(
        "--epoch-sizes",
        metavar="N,..",
        help="--curve epoch-size: changes per epoch "
        f"(default {','.join(map(str, DEFAULT_EPOCH_SIZES))})",
    )
    ben.add_argument(
        "--plot", metavar="PNG", help="--curve: the plot to write (default curve-CURVE.png)"
    )
    ben.add_argument("--save", metavar="JSON", help="--curve: also write every point as JSON")
    ben.set_defaults(run=_bench)

    app = commands.add_parser(
        "apply", help="apply one epoch of changes to a kept state; print the output's change"
    )
    add_query(app)
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
        "--no-keyed",
        action="store_true",
        help="evaluate on Spark even when the epoch is small enough for the driver's keyed path",
    )
    app.add_argument("--master", metavar="URL", help="Spark master (default local[*])")
    app.add_argument("--json", action="store_true", help="end with one JSON line of results")
    app.set_defaults(run=_apply)

    clu = commands.add_parser(
        "cluster", help="a Spark standalone cluster on 127.0.0.1, from the installed pyspark"
    )
    clu_commands = clu.add_subparsers(dest="action", required=True, metavar="ACTION")
    clu_up = clu_commands.add_parser("up", help="start a master and workers; print the master URL")
    clu_up.add_argument("--workers", type=int, default=2, metavar="N", help="workers (default 2)")
    clu_up.add_argument(
        "--cores", type=int, default=1, metavar="C", help="cores per worker (default 1)"
    )
    clu_up.add_argument(
        "--memory", default="2g", metavar="M", help="memory per worker, e.g. 2g (default 2g)"
    )
    clu_up.add_argument(
        "--port", type=int, default=7077, metavar="P", help="master port (default 7077; 0: any)"
    )
    clu_up.add_argument(
        "--ui-port",
        type=int,
        default=8080,
        metavar="P",
        help="master UI port (default 8080; 0: any)",
    )
    for sub in (clu_up, *(clu_commands.add_parser(a, help=h) for a, h in _CLUSTER_ACTIONS)):
        sub.add_argument(
            "--dir",
            default=cluster.DEFAULT_DIR,
            metavar="DIR",
            help=f"where the cluster's record and logs live (default {cluster.DEFAULT_DIR})",
        )
        sub.add_argument("--json", action="store_true", help="end with one JSON line")
    clu.set_defaults(run=_cluster)

    exp = commands.add_parser("explain", help="print the query's plan")
    add_query(exp)
    exp.set_defaults(run=_explain)
    return parser


def _parse_inputs(specs: Sequence[str], query: Query) -> dict[str, str]:
    """``REL=PATH`` arguments as a mapping, checked against the relations of `query`."""
    inputs: dict[str, str] = {}
    for spec in specs:
        rel, sep, path = spec.partition("=")
        rel = rel.strip()
        if not sep or not rel or not path:
            raise UsageError(
                f"--input {spec!r} is not of the form REL=PATH (for example edge=graph.txt)"
            )
        if not (rel.isidentifier() and rel.isascii()):
            raise UsageError(f"--input {spec!r}: {rel!r} is not a relation name (an identifier)")
        if rel in inputs:
            raise UsageError(
                f"--input gives relation {rel!r} twice ({inputs[rel]} and {path}); "
                "give each relation once"
            )
        inputs[rel] = path
    used = ", ".join(sorted(query.relations))
    for rel in inputs:
        if rel not in query.relations:
            raise QueryError(
                f"--input gives relation {rel!r}, which query {query.name} does not use "
                f"(it uses: {used})"
            )
    for rel in query.relations:
        if rel not in inputs:
            raise QueryError(
                f"query {query.name} uses relation {rel!r}, but no --input gives it; "
                f"add --input {rel}=PATH"
            )
    for rel, path in inputs.items():
        _check_source(rel, path, query.relations[rel])
    return inputs


def _check_source(rel: str, path: str, arity: int) -> None:
    """Fail fast on a generator spec that does not parse or a local file that does not exist."""
    if generate.is_generator_spec(path):
        generate.parse_generator_spec(path)
        if arity != 2:
            raise InputError(
                f"a generated graph is binary, but the query uses relation {rel} with arity {arity}",
                path,
            )
        return
    parsed = urlparse(path)
    if parsed.scheme == "file":
        local = parsed.path
    elif parsed.scheme and len(parsed.scheme) > 1:
        return  # a remote URL: Spark reports it when reading
    else:
        local = path
    if not os.path.exists(local):
        raise InputError("no such file", f"{path} (relation {rel})")


def _check_undirected(names: Sequence[str], query: Query, inputs: dict[str, str]) -> set[str]:
    for rel in names:
        if rel not in inputs:
            raise UsageError(f"--undirected {rel}: no --input gives relation {rel!r}")
        if query.relations[rel] != 2:
            raise QueryError(
                f"--undirected {rel}: query {query.name} uses {rel!r} with arity "
                f"{query.relations[rel]}; only a binary relation can be undirected"
            )
    return set(names)


def _prepare_state(path: str | None) -> None:
    """Check that ``--state`` names a new or empty directory, and create it."""
    if path is None:
        return
    state = Path(path)
    if state.exists() and not state.is_dir():
        raise UsageError(f"--state {path}: exists and is not a directory")
    if state.is_dir() and any(state.iterdir()):
        raise UsageError(
            f"--state {path}: the directory is not empty; pass a new or empty directory"
        )
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--state {path}: cannot create the directory ({exc.strerror})") from exc


def _check_replay_numbers(args: argparse.Namespace) -> None:
    if args.epochs < 1:
        raise UsageError(f"--epochs must be at least 1, got {args.epochs}")
    if not 0.0 <= args.delete_fraction <= 1.0:
        raise UsageError(f"--delete-fraction must be between 0 and 1, got {args.delete_fraction}")
    if not _MIN_LONG <= args.seed <= _MAX_LONG:
        raise UsageError(f"--seed must be a 64-bit integer, got {args.seed}")


# --- running ------------------------------------------------------------------------------------


def _say(line: str) -> None:
    print(line, flush=True)


def _start_spark(master: str | None) -> SparkSession:
    """The active session, or a new one whose console logging is limited to errors."""
    return session(master, quiet=os.environ.get("WCOJ_DEBUG") != "1")


@contextmanager
def _state_dir(path: str | None) -> Iterator[str]:
    """`path` (prepared by `_prepare_state`, kept), or a fresh temporary directory, removed after."""
    if path is not None:
        yield path
        return
    scratch = tempfile.mkdtemp(prefix="wcoj-state-")
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _read(
    spark: SparkSession,
    rel: str,
    path: str,
    arity: int,
    undirected: bool,
    negative: dict[str, int],
) -> DataFrame:
    df = _read_flagged(spark, rel, path, arity, negative)
    return linear.symmetrize().apply(canonical_undirected(df)) if undirected else df


def _read_flagged(
    spark: SparkSession, rel: str, path: str, arity: int, negative: dict[str, int]
) -> DataFrame:
    """`read_relation`, then a warning listing tuples whose multiplicity is negative.

    Such tuples (deletions of absent tuples) are kept as signed multiplicities; their number goes
    into `negative`. Only CSV and Parquet can carry a ``diff`` column, so only they are checked.
    """
    df = read_relation(spark, path, arity, rel)
    if generate.is_generator_spec(path) or detect_format(path) is Format.TEXT:
        return df
    count, examples = negative_tuples(df)
    if count:
        negative[rel] = count
        shown = "; ".join(f"{tup} {m}" for tup, m in examples[:5])
        more = ", ..." if count > 5 else ""
        _warn(
            f"{path} (relation {rel}): {count} tuple(s) have a negative multiplicity, i.e. "
            f"delete tuples that are absent (kept as signed multiplicities): {shown}{more}"
        )
    return df


def _emit_json(payload: dict[str, Any]) -> None:
    _say(json.dumps(payload))


def _count(args: argparse.Namespace) -> int:
    query = resolve_query(args.query)
    inputs = _parse_inputs(args.input, query)
    undirected = _check_undirected(args.undirected, query, inputs)
    _prepare_state(args.state)
    spark = _start_spark(args.master)
    with _state_dir(args.state) as state:
        start = clock.perf_counter()
        negative: dict[str, int] = {}
        relations = {
            rel: _read(spark, rel, path, query.relations[rel], rel in undirected, negative)
            for rel, path in sorted(inputs.items())
        }
        loaded = clock.perf_counter()
        result = evaluate_static(spark, query, relations, state, keyed=not args.no_keyed)
        count = result.total(query.name)
        seconds = clock.perf_counter() - loaded
    metrics = result.metrics
    output_rows = metrics.outputs.get(query.name, 0)
    _say(
        f"count: {count} (seconds {seconds:.3f}; proposed {metrics.proposed}, "
        f"validated {metrics.validated}, output rows {output_rows})"
    )
    if args.json:
        _emit_json(
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
            }
        )
    return EXIT_OK


def _progress(report: EpochReport) -> None:
    _say(
        f"epoch {report.epoch + 1}/{report.epochs}: changes {report.changes}, "
        f"output change rows {report.output_changes}, proposed {report.metrics.proposed}, "
        f"validated {report.metrics.validated}, seconds {report.seconds:.3f} "
        f"({_phases(report.metrics.seconds)})"
    )


def _phases(seconds: dict[str, float]) -> str:
    """Seconds per engine phase, e.g. ``stage 0.4 counts 1.2 rules 3.1 commit 0.0``."""
    return " ".join(f"{name} {value:.1f}" for name, value in seconds.items())


def _replay(args: argparse.Namespace) -> int:
    query = resolve_query(args.query)
    inputs = _parse_inputs(args.input, query)
    undirected = _check_undirected(args.undirected, query, inputs)
    _check_replay_numbers(args)
    _prepare_state(args.state)
    spark = _start_spark(args.master)
    with _state_dir(args.state) as state:
        negative: dict[str, int] = {}
        streams = {
            rel: epoch_stream(
                _read_flagged(spark, rel, path, query.relations[rel], negative),
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
            keyed=not args.no_keyed,
        )
    summary = f"final count: {result.final_count}; check: {result.check.value}"
    if result.mismatches:
        summary += f" ({result.mismatches} tuples differ)"
    _say(f"{summary}; median epoch seconds {result.median_seconds:.3f}")
    if args.json:
        _emit_json(
            {
                "command": "replay",
                "delete_fraction": args.delete_fraction,
                "seed": args.seed,
                "negative_tuples": negative,
                **result.to_dict(),
            }
        )
    if result.check is CheckOutcome.FAILED:
        _error(
            f"check failed: {result.mismatches} output tuples differ between the incremental "
            "result and a static recomputation of the final inputs"
        )
        return EXIT_FAILED
    return EXIT_OK


def _bench(args: argparse.Namespace) -> int:
    query = resolve_query(args.query)
    inputs = _parse_inputs(args.input, query)
    undirected = _check_undirected(args.undirected, query, inputs)
    if args.curve is not None:
        return _curve_bench(args, query, inputs, undirected)
    given = [o for o in ("sizes", "epoch_sizes", "plot", "save") if getattr(args, o) is not None]
    if given:
        options = ", ".join("--" + o.replace("_", "-") for o in given)
        raise UsageError(f"{options} only go with --curve size or --curve epoch-size")
    if args.static:
        return _static_bench(args, query, inputs, undirected)
    if args.epochs is None or args.epoch_size is None:
        raise UsageError("bench needs --epochs and --epoch-size (or --static)")
    if args.epochs < 2 or args.epoch_size < 2:
        raise UsageError("--epochs and --epoch-size must be at least 2")
    methods = [m.strip() for m in (args.methods or ",".join(METHODS)).split(",") if m.strip()]
    _prepare_state(args.state)
    spark = _start_spark(args.master)
    with _state_dir(args.state) as state:
        relations = _read_inputs(spark, query, inputs)
        _say(f"bench: preparing {args.epochs} epochs of {args.epoch_size} changes")
        workload = make_workload(
            spark,
            query,
            relations,
            epochs=args.epochs,
            epoch_size=args.epoch_size,
            seed=args.seed,
            undirected=frozenset(undirected),
            skew=args.skew,
        )
        result = bench(spark, query, workload, state, methods=methods, on_epoch=_bench_progress)
    summary = result.to_dict()
    for name, m in summary["methods"].items():
        _say(
            f"{name:>12}: median {m['median_seconds']:.3f} s/epoch, intermediate rows "
            f"{m['intermediate_rows']}, shuffle bytes {m['shuffle_bytes']}, state bytes "
            f"{m['state_bytes']}"
        )
    ratios = [k for k in summary if k.endswith(("_vs_recompute", "_vs_binary_delta"))]
    _say("; ".join(f"{k} {summary[k]}" for k in ratios))
    if args.json:
        _emit_json(summary)
    return EXIT_OK


def _read_inputs(spark: SparkSession, query: Query, inputs: dict[str, str]) -> dict[str, DataFrame]:
    """Every ``--input`` of a benchmark, as read (the methods normalize them themselves)."""
    return {
        rel: read_relation(spark, path, query.relations[rel], rel)
        for rel, path in sorted(inputs.items())
    }


def _bench_progress(t: int, epochs: int, samples: dict[str, Sample], changes: int) -> None:
    figures = ", ".join(
        f"{name} {s.seconds:.2f} s ({s.intermediate_rows} join rows)" for name, s in samples.items()
    )
    _say(f"epoch {t}/{epochs}: {figures}; output change rows {changes}, identical")


def _curve_bench(
    args: argparse.Namespace, query: Query, inputs: dict[str, str], undirected: set[str]
) -> int:
    """``bench --curve``: every point checked and timed by `bench`; progress on stderr."""
    curve = Curve(args.curve)
    if args.static or args.skew is not None:
        raise UsageError("--curve times regular epochs: drop --static and --skew")
    if curve is Curve.SIZE:
        if args.epoch_sizes is not None:
            raise UsageError(
                "--epoch-sizes goes with --curve epoch-size; --curve size varies --sizes"
            )
        points = parse_points(args.sizes, "--sizes") if args.sizes else DEFAULT_SIZES
        for path in inputs.values():
            sized_spec(path, points[0])  # a file, or a generator that fixes its size, is refused
    else:
        if args.sizes is not None or args.epoch_size is not None:
            raise UsageError(
                "--curve epoch-size varies the epoch size: give --epoch-sizes, not --sizes or "
                "--epoch-size"
            )
        points = DEFAULT_EPOCH_SIZES
        if args.epoch_sizes:
            points = parse_points(args.epoch_sizes, "--epoch-sizes")
    epochs = DEFAULT_EPOCHS if args.epochs is None else args.epochs
    epoch_size = DEFAULT_EPOCH_SIZE if args.epoch_size is None else args.epoch_size
    check_points(curve, points, epochs=epochs, epoch_size=epoch_size)
    methods = check_curve_methods((args.methods or ",".join(CURVE_METHODS)).split(","))
    plot = Path(args.plot or f"curve-{curve.value}.png")
    if plot.suffix.lower() != ".png":
        raise UsageError(f"--plot {plot}: the plot is a PNG; give a path ending in .png")
    _prepare_state(args.state)
    spark = _start_spark(args.master)
    with _state_dir(args.state) as state:
        result = run_curve(
            spark,
            query,
            curve,
            inputs,
            state,
            points=points,
            epochs=epochs,
            epoch_size=epoch_size,
            undirected=frozenset(undirected),
            methods=methods,
            seed=args.seed,
            say=_note,
        )
    plot_curve(result, plot)
    if args.save:
        save_curve(result, Path(args.save))
    summary = result.to_dict()
    for p in result.points:
        medians = ", ".join(f"{m} {p.median(m):.3f} s/epoch" for m in result.methods)
        _say(f"{p.x:>12,}: {medians}")
    _say(
        "growth per 10x: "
        + "; ".join(
            f"{m} x{g['fit']} (fit), x{g['end_points']} (end points)"
            for m, g in summary["growth_per_decade"].items()
        )
    )
    _say(f"plot: {plot}" + (f"; points: {args.save}" if args.save else ""))
    if args.json:
        _emit_json(summary)
    return EXIT_OK


def _note(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _static_bench(
    args: argparse.Namespace, query: Query, inputs: dict[str, str], undirected: set[str]
) -> int:
    if args.epochs is not None or args.epoch_size is not None or args.skew is not None:
        raise UsageError("--static counts the whole input: drop --epochs, --epoch-size, --skew")
    if args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {args.repeat}")
    methods = [m.strip() for m in (args.methods or ",".join(STATIC_DEFAULT)).split(",")]
    _prepare_state(args.state)
    spark = _start_spark(args.master)
    with _state_dir(args.state) as state:
        relations = _read_inputs(spark, query, inputs)
        _say(f"bench --static: {query.name}, {args.repeat} timed runs per method")
        result = static_bench(
            spark,
            query,
            relations,
            state,
            undirected=frozenset(undirected),
            methods=[m for m in methods if m],
            repeat=args.repeat,
            on_run=_static_progress,
        )
    summary = result.to_dict()
    _say(f"count {result.count}: every method agrees")
    for name, m in summary["methods"].items():
        rows = "" if m["join_rows"] is None else f", join rows {m['join_rows']}"
        _say(
            f"{name:>15}: median {m['median_seconds']:.3f} s{rows}, "
            f"{m['ratio_to_wcoj']}x wcoj's time"
        )
    ratios = [k for k in summary if k.startswith("speedup_vs_")]
    _say("; ".join(f"{k} {summary[k]}" for k in ratios))
    if args.json:
        _emit_json(summary)
    return EXIT_OK


def _static_progress(run: StaticRun) -> None:
    which = "warm-up" if run.warm_up else f"run {run.run}/{run.runs}"
    rows = "" if run.join_rows is None else f", join rows {run.join_rows}"
    _say(f"{run.method} {which}: {run.seconds:.3f} s, count {run.count}{rows}")


def _explain(args: argparse.Namespace) -> int:
    sys.stdout.write(explain(plan_query(resolve_query(args.query))))
    sys.stdout.flush()
    return EXIT_OK


_CLUSTER_ACTIONS = (
    ("down", "stop exactly the processes 'up' started"),
    ("status", "print the master URL and the workers alive"),
)


def _parse_changes(specs: Sequence[str], query: Query) -> dict[str, str]:
    """``REL=PATH`` arguments of ``apply``: relations of `query`, each once, files that exist."""
    changes: dict[str, str] = {}
    for spec in specs:
        rel, sep, path = spec.partition("=")
        rel = rel.strip()
        if not sep or not rel or not path:
            raise UsageError(f"--changes {spec!r} is not of the form REL=PATH")
        if rel not in query.relations:
            raise QueryError(
                f"--changes gives relation {rel!r}, which query {query.name} does not use "
                f"(it uses: {', '.join(sorted(query.relations))})"
            )
        if rel in changes:
            raise UsageError(f"--changes gives relation {rel!r} twice; give each relation once")
        if generate.is_generator_spec(path):
            raise UsageError(f"--changes {spec!r}: changes come from a file, not a generator")
        _check_source(rel, path, query.relations[rel])
        changes[rel] = path
    return changes


def _apply(args: argparse.Namespace) -> int:
    query = resolve_query(args.query)
    changes = _parse_changes(args.changes, query)
    undirected = _check_undirected(args.undirected, query, changes)
    if args.epoch < 0:
        raise UsageError(f"--epoch must be 0 or more, got {args.epoch}")
    state = Path(args.state)
    if state.exists() and not state.is_dir():
        raise UsageError(f"--state {args.state}: exists and is not a directory")
    spark = _start_spark(args.master)
    start = clock.perf_counter()
    engine = Engine(
        spark, str(state), query, keyed_epoch_rows=0 if args.no_keyed else KEYED_EPOCH_ROWS
    )
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
            _warn(
                f"epoch {args.epoch} deleted tuples relation {rel!r} did not hold; "
                f"{found} now have a negative multiplicity: {shown}{more}"
            )
    seconds = clock.perf_counter() - start
    metrics = result.metrics
    _say(
        f"epoch {args.epoch}: changes {sum(metrics.changes.values())}, output change rows "
        f"{metrics.outputs.get(query.name, 0)}, count {count}, seconds {seconds:.3f} "
        f"({_phases(metrics.seconds)})"
    )
    if args.json:
        _emit_json(
            {
                "command": "apply",
                "query": query.name,
                "epoch": args.epoch,
                "count": count,
                "seconds": round(seconds, 3),
                "metrics": metrics.to_dict(),
                "negative": {rel: [[d, m] for d, m in rows] for rel, (_, rows) in negative.items()},
            }
        )
    return EXIT_OK


_SHOWN, _LISTED = 10, 1000


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


def _cluster(args: argparse.Namespace) -> int:
    if args.action == "up":
        started = cluster.up(
            args.dir,
            workers=args.workers,
            cores=args.cores,
            memory=args.memory,
            port=args.port,
            ui_port=args.ui_port,
            say=_say,
        )
        _say(f"master: {started.master}")
        _say(f"stop it with: wcoj cluster down --dir {args.dir}")
        payload: dict[str, Any] = {"master": started.master, "ui": started.ui}
        payload["workers"] = len(started.workers)
    elif args.action == "down":
        stopped = cluster.down(args.dir, say=_say)
        payload = {"master": stopped.master, "stopped": len(stopped.processes)}
    else:
        found, alive = cluster.status(args.dir)
        _say(f"master: {found.master} (UI {found.ui}); workers alive: {alive}")
        payload = {"master": found.master, "ui": found.ui, "workers_alive": alive}
    if args.json:
        _emit_json({"command": f"cluster {args.action}", **payload})
    return EXIT_OK


# --- errors -------------------------------------------------------------------------------------


def _error(message: str) -> None:
    text = " ".join(message.split()) or "unknown error"
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {' '.join(message.split())}", file=sys.stderr, flush=True)


def _spark_message(exc: BaseException) -> str:
    """The first meaningful line of a Spark failure (the Java exception's, for Py4J)."""
    text = ""
    java = getattr(exc, "java_exception", None)
    if not isinstance(exc, PySparkException) and java is not None:
        try:
            text = str(java.toString())
        except Py4JError:
            text = ""
    if not text:
        try:
            text = str(exc)
        except Exception:  # a Py4J error whose text needs a gateway that is gone
            text = ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    debug = os.environ.get("WCOJ_DEBUG") == "1"
    try:
        args = _parser().parse_args(argv)
        with warnings.catch_warnings():
            # PySpark warns about the pandas version on its first DataFrame; not the user's issue.
            warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")
            return int(args.run(args))
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
    except WcojError as exc:
        if debug:
            traceback.print_exc()
        _error(str(exc))
        return EXIT_USAGE
    except (PySparkException, Py4JError) as exc:
        if debug:
            traceback.print_exc()
        _error(f"spark failed: {_spark_message(exc)}")
        return EXIT_FAILED
