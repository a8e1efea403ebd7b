"""The ``wcoj-bench`` command line: the benchmarks, their report page and a local Spark cluster.

Commands::

    wcoj-bench epochs  [--query Q] --input REL=PATH ... --epochs K --epoch-size N [--skew D]
                       [--seed S] [--methods recompute,binary-delta,wcoj] [--json]
    wcoj-bench static  [--query Q] --input REL=PATH ... [--undirected REL] [--repeat R]
                       [--methods wcoj,wcoj-executors,spark-sql,neighbour-array,duckdb,kuzu,scipy,tc]
                       [--json]
    wcoj-bench curve size --input REL=rmat:seed=S ... [--sizes E,..] [--epoch-size N]
                       [--epochs K] [--methods binary-delta,wcoj] [--plot PNG] [--save JSON]
    wcoj-bench curve epoch-size --input REL=PATH ... [--epoch-sizes N,..] [--epochs K]
                       [--methods binary-delta,wcoj] [--plot PNG] [--save JSON] [--json]
    wcoj-bench cold    --input REL=PATH --undirected REL [--epochs K] [--warm-epochs W]
                       [--epoch-size N] [--sizes E,..] [--rmat SPEC] [--no-evict]
                       [--scratch DIR] [--plot PNG] [--json]
    wcoj-bench idle    --input REL=PATH --undirected REL [--epochs K] [--epoch-size N]
                       [--gap SECONDS] [--scratch DIR] [--master URL] [--deploy WHERE] [--json]
    wcoj-bench scale   [--rmat SPEC] [--memory SIZE] [--build K] [--epochs K] [--epoch-size N]
                       [--sizes SPEC,..] [--methods spark-sql,duckdb] [--cap SIZE]
                       [--timeout S] [--scratch DIR] [--save JSON] [--json]
    wcoj-bench scale   --shards K,.. [--rmat SPEC] [--hubs N] [--hub-degree D] [--queries Q,..]
                       [--slice-rows R] [--plot PNG] [--save JSON] [--json]
    wcoj-bench dagster-run --input edge=PATH --undirected edge [--epochs K] [--epoch-size N]
                       [--instance sqlite|postgres] [--scratch DIR] [--json]
    wcoj-bench backfill --input REL=PATH --undirected REL --epochs K --epoch-size N [--json]
    wcoj-bench ask     --input edge=PATH [--vertices N] [--runs R] [--parts vertex,fresh,cold,attach]
                       [--cold-state DIR] [--epochs K] [--epoch-size N] [--work DIR] [--json]
    wcoj-bench report  [--only PART] [--render-only] [--quick] [--root DIR] [--data DIR]
    wcoj-bench cluster up [--workers N] [--cores C] [--memory M] [--port P] [--ui-port P]
                       [--dir DIR]
    wcoj-bench cluster down|status [--dir DIR]

``epochs``, ``static`` and ``curve`` take ``--undirected REL``, ``--master URL`` and
``--state DIR`` as ``wcoj count`` does, and check their arguments and input files before Spark
starts (`wcoj_core.cli.inputs`). ``cold`` (`wcoj_bench.parts.cold`) times whole processes and starts no
Spark itself (its recompute processes do); ``idle`` (`wcoj_bench.parts.idle`) applies epochs back to
back, then ``--gap`` seconds apart; ``dagster-run`` (`wcoj_bench.parts.dagster_run`) times one epoch
partition of the README's quick start per fresh ``dagster job execute`` beside the same job with
empty bodies. They keep their prepared graphs and built states under
``--scratch`` (default ``.wcoj/bench``), reused by later runs. ``backfill`` and ``report`` are `wcoj_bench.parts.backfill.main` and
`wcoj_bench.report.main`, handed the arguments after their name.

Contract: results go to stdout, progress to stderr; with ``--json`` the last line on stdout is one
JSON object. Exit status: 0 on success; 1 when Spark fails; 2 for a user mistake or a benchmark
whose methods disagree (any `WcojError`), reported as one line ``wcoj-bench: error: ...``; 130 on
interruption.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException

from wcoj_bench import report
from wcoj_bench.infra import cluster
from wcoj_bench.infra.machine import machine_facts, machine_label
from wcoj_bench.infra.measure import Sample
from wcoj_bench.parts import aggregates, ask, backfill, cold, dagster_run, idle, scale, shards
from wcoj_bench.parts.curves import (
    CURVE_METHODS,
    DEFAULT_EPOCH_SIZE,
    DEFAULT_EPOCH_SIZES,
    DEFAULT_EPOCHS,
    DEFAULT_SIZES,
    Curve,
    check_curve_methods,
    check_points,
    parse_curve,
    parse_points,
    plot_curve,
    run_curve,
    save_curve,
    sized_spec,
)
from wcoj_bench.parts.epochs import METHODS, bench, make_workload
from wcoj_bench.parts.static import (
    STATIC_DEFAULT,
    CountCommand,
    StaticRun,
    check_methods,
    static_bench,
)
from wcoj_core.cli import workspace
from wcoj_core.cli.console import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    UsageError,
    emit_json,
    error,
    note,
    say,
    spark_message,
)
from wcoj_core.cli.count import add_run_arguments
from wcoj_core.cli.inputs import check_files, check_undirected, parse_inputs, read_inputs
from wcoj_core.errors import WcojError
from wcoj_core.query.builtins import resolve_query
from wcoj_core.query.ir import Query

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PROG = "wcoj-bench"

# Commands with a parser of their own: the arguments after the name are handed to it.
DELEGATED: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "backfill": (backfill.main, "a single-run Dagster backfill against the CLI's engine"),
    "report": (report.main, "run the benchmarks and regenerate docs/benchmarks.md"),
}


# --- arguments ----------------------------------------------------------------------------------


def _add_inputs(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p, query_default="triangles")


def _number(p: argparse.ArgumentParser, flag: str, default: float, metavar: str, text: str) -> None:
    """An option of `default`'s type (int or float), its help ending with the default."""
    shown = f"{default:g}" if isinstance(default, float) else str(default)
    p.add_argument(
        flag, type=type(default), default=default, metavar=metavar, help=f"{text} (default {shown})"
    )


def _seed(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=1, metavar="S", help="workload seed (default 1)")


def _methods_option(p: argparse.ArgumentParser, default: Sequence[str]) -> None:
    p.add_argument(
        "--methods",
        metavar="M,..",
        help=f"methods to run, wcoj always among them (default {','.join(default)})",
    )


def _json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="end with one JSON line")


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="wcoj's benchmarks, report page and local cluster.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ep = commands.add_parser(
        "epochs", help="the same epochs through recompute, binary-delta and wcoj, side by side"
    )
    _add_inputs(ep)
    ep.add_argument("--epochs", type=int, required=True, metavar="K", help="timed epochs")
    ep.add_argument(
        "--epoch-size", type=int, required=True, metavar="N", help="changed tuples per epoch"
    )
    ep.add_argument(
        "--skew", type=int, metavar="D", help="add an epoch in which a new vertex gains D edges"
    )
    _seed(ep)
    _methods_option(ep, METHODS)
    ep.set_defaults(run=_epochs)

    st = commands.add_parser(
        "static",
        help="count the whole input once per method: wcoj, Spark SQL, neighbour arrays, DuckDB, "
        "Kuzu, scipy, the peer C counter tc",
    )
    _add_inputs(st)
    st.add_argument("--repeat", type=int, default=3, metavar="R", help="timed runs per method")
    _methods_option(st, STATIC_DEFAULT)
    st.add_argument(
        "--baseline-wcoj",
        metavar="CMD",
        help="another wcoj program (e.g. a checkout of main's) for method wcoj-count-baseline: "
        "its `count` runs side by side with this one's",
    )
    st.set_defaults(run=_static)

    cu = commands.add_parser(
        "curve",
        help="seconds per epoch against graph size (generated R-MAT graphs) or epoch size; "
        "writes a log-log PNG",
    )
    cu.add_argument("curve", type=parse_curve, metavar="size|epoch-size", help="the curve")
    _add_inputs(cu)
    cu.add_argument("--epochs", type=int, metavar="K", help=f"epochs (default {DEFAULT_EPOCHS})")
    cu.add_argument(
        "--epoch-size",
        type=int,
        metavar="N",
        help=f"curve size: changes per epoch (default {DEFAULT_EPOCH_SIZE})",
    )
    _seed(cu)
    _methods_option(cu, CURVE_METHODS)
    cu.add_argument(
        "--sizes",
        metavar="E,..",
        help=f"curve size: graph sizes in edges (default {','.join(map(str, DEFAULT_SIZES))})",
    )
    cu.add_argument(
        "--epoch-sizes",
        metavar="N,..",
        help="curve epoch-size: changes per epoch "
        f"(default {','.join(map(str, DEFAULT_EPOCH_SIZES))})",
    )
    cu.add_argument("--plot", metavar="PNG", help="the plot to write (default curve-CURVE.png)")
    cu.add_argument("--save", metavar="JSON", help="also write every point as JSON")
    cu.set_defaults(run=_curve)

    co = commands.add_parser(
        "cold",
        help="whole processes, exec to exit: wcoj apply, a Spark SQL recompute, opening the "
        "state, on a graph and on R-MAT graphs of growing size",
    )
    _add_process_inputs(co)
    _number(co, "--epochs", cold.DEFAULT_EPOCHS, "K", "epochs, each a fresh process of each kind")
    co.add_argument(
        "--warm-epochs",
        type=int,
        default=cold.DEFAULT_WARM_EPOCHS,
        metavar="W",
        help="epochs of the warm processes, set and bag (0: none; default "
        f"{cold.DEFAULT_WARM_EPOCHS})",
    )
    co.add_argument(
        "--sizes",
        default=",".join(map(str, cold.DEFAULT_SIZES)),
        metavar="E,..",
        help="R-MAT graph sizes in edges (default "
        f"{','.join(map(str, cold.DEFAULT_SIZES))}; 'none' skips them)",
    )
    co.add_argument(
        "--rmat",
        default=cold.DEFAULT_RMAT,
        metavar="SPEC",
        help=f"the generator of those graphs, without scale and edges (default {cold.DEFAULT_RMAT})",
    )
    co.add_argument(
        "--no-evict",
        action="store_true",
        help="skip the runs on a state whose pages were dropped from the page cache",
    )
    co.add_argument("--plot", metavar="PNG", help="the plot to write (default cold.png)")
    co.set_defaults(run=_cold)

    sc = commands.add_parser(
        "scale",
        help="one memory budget at 20-40 M edges: a one-epoch load, a build in epochs, fresh "
        "epochs, each a whole process with its tree's peak anonymous memory",
    )
    sc.add_argument(
        "--rmat",
        metavar="SPEC",
        help=f"the graph (default {scale.DEFAULT_RMAT}; with --shards {shards.DEFAULT_RMAT})",
    )
    sc.add_argument(
        "--shards",
        metavar="K,..",
        help="instead: the sharded deployment's stages over K shards, by key and with heavy keys "
        f"split, on the R-MAT plus a hub clique (`wcoj_bench.parts.shards`; e.g. "
        f"{','.join(map(str, shards.DEFAULT_SHARDS))})",
    )
    _number(sc, "--hubs", shards.DEFAULT_HUBS, "N", "with --shards: hubs in a clique")
    _number(sc, "--hub-degree", shards.DEFAULT_HUB_DEGREE, "D", "with --shards: a hub's degree")
    sc.add_argument(
        "--queries",
        default=",".join(shards.DEFAULT_QUERIES),
        metavar="Q,..",
        help="with --shards: the queries (default triangles,4-cliques)",
    )
    _number(
        sc, "--slice-rows", shards.SLICE_ROWS, "R", "with --shards: rows of a heavy key's slice"
    )
    sc.add_argument("--plot", metavar="PNG", help="with --shards: the plot to write")
    sc.add_argument(
        "--query", default="triangles", metavar="Q", help="a built-in query (default triangles)"
    )
    sc.add_argument(
        "--memory", default=scale.DEFAULT_MEMORY, metavar="SIZE", help="wcoj's budget (4g)"
    )
    sc.add_argument(
        "--build",
        type=int,
        default=scale.DEFAULT_BUILD,
        metavar="K",
        help=f"epochs of the build through the driver (default {scale.DEFAULT_BUILD}; 0: none)",
    )
    _number(sc, "--epochs", scale.DEFAULT_EPOCHS, "K", "fresh 1,000-change epochs on each state")
    sc.add_argument("--epoch-size", type=int, default=1000, metavar="N", help="changes (1000)")
    sc.add_argument(
        "--sizes",
        default=",".join(scale.DEFAULT_SIZES).replace(",rmat", ";rmat"),
        metavar="SPEC;..",
        help="smaller graphs for the growth of a cold epoch, ';'-separated ('none': skip)",
    )
    sc.add_argument(
        "--methods",
        default=",".join(scale.STATIC_METHODS),
        metavar="M,..",
        help="static counts to run beside the load ('none': skip; default spark-sql,duckdb)",
    )
    sc.add_argument(
        "--cap", default=scale.DEFAULT_CAP, metavar="SIZE", help="kill a process tree past this"
    )
    _number(sc, "--timeout", scale.DEFAULT_TIMEOUT, "S", "stop a process after S seconds")
    _seed(sc)
    sc.add_argument("--scratch", default=scale.DEFAULT_SCRATCH, metavar="DIR", help="work folder")
    sc.add_argument("--save", metavar="JSON", help="also write the report as JSON")
    _json(sc)
    sc.set_defaults(run=_scale)

    idl = commands.add_parser(
        "idle",
        help="epochs back to back, then --gap seconds apart (Spark ends idle Python workers "
        "after a minute)",
    )
    _add_process_inputs(idl)
    _number(idl, "--epochs", idle.DEFAULT_EPOCHS, "K", "epochs back to back, and as many apart")
    _number(idl, "--gap", idle.DEFAULT_GAP, "SECONDS", "the pause before each epoch apart")
    workspace.add_spark_arguments(idl)
    idl.add_argument(
        "--deploy",
        choices=("auto", "driver", "executors"),
        default="executors",
        help="where the kernel runs (default executors)",
    )
    idl.set_defaults(run=_idle)

    dr = commands.add_parser(
        "dagster-run",
        help="one epoch partition of the README's quick start per fresh `dagster job execute`, "
        "beside the same job with empty bodies",
    )
    _add_process_inputs(dr)
    _number(
        dr,
        "--epochs",
        dagster_run.DEFAULT_EPOCHS,
        "K",
        "timed epochs, each a fresh run of each job",
    )
    dr.add_argument(
        "--instance",
        choices=dagster_run.INSTANCES,
        default="sqlite",
        help="each job's Dagster instance: SQLite files (default) or a Postgres server each",
    )
    dr.set_defaults(run=_dagster_run)

    for name, (_, help_text) in DELEGATED.items():
        commands.add_parser(name, help=help_text, add_help=False)

    aggregates.add_parser(commands)
    commands.choices["aggregates"].set_defaults(run=_aggregates)
    ask.add_parser(commands)
    commands.choices["ask"].set_defaults(run=_ask)
    clu = commands.add_parser(
        "cluster", help="a Spark standalone cluster on 127.0.0.1, from the installed pyspark"
    )
    actions = clu.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start a master and workers; print the master URL")
    _number(up, "--workers", 2, "N", "workers")
    _number(up, "--cores", 1, "C", "cores per worker")
    up.add_argument(
        "--memory", default="2g", metavar="M", help="memory per worker, e.g. 2g (default 2g)"
    )
    up.add_argument(
        "--port", type=int, default=7077, metavar="P", help="master port (default 7077; 0: any)"
    )
    up.add_argument(
        "--ui-port",
        type=int,
        default=8080,
        metavar="P",
        help="master UI port (default 8080; 0: any)",
    )
    down = actions.add_parser("down", help="stop exactly the processes 'up' started")
    status = actions.add_parser("status", help="print the master URL and the workers alive")
    for sub in (up, down, status):
        sub.add_argument(
            "--dir",
            default=cluster.DEFAULT_DIR,
            metavar="DIR",
            help=f"where the cluster's record and logs live (default {cluster.DEFAULT_DIR})",
        )
        _json(sub)
    clu.set_defaults(run=_cluster)
    return parser


def _add_process_inputs(p: argparse.ArgumentParser) -> None:
    """The arguments of the parts that prepare a graph of their own (``cold``, ``idle``)."""
    p.add_argument(
        "--query",
        default="triangles",
        metavar="Q",
        help="a built-in query name or query text over one undirected relation (default triangles)",
    )
    p.add_argument(
        "--input", required=True, metavar="REL=PATH", help="the graph: a file or generator spec"
    )
    p.add_argument(
        "--undirected", action="append", default=[], metavar="REL", help="the graph's relation"
    )
    p.add_argument(
        "--epoch-size", type=int, default=1_000, metavar="N", help="changes per epoch (1000)"
    )
    _seed(p)
    p.add_argument(
        "--scratch",
        default=cold.DEFAULT_SCRATCH,
        metavar="DIR",
        help=f"prepared graphs, built states and working copies (default {cold.DEFAULT_SCRATCH})",
    )
    p.add_argument("--json", action="store_true", help="end with one JSON line of results")


def _graph_input(args: argparse.Namespace) -> tuple[Query, str, str]:
    """The query, its one relation (binary, declared undirected) and its input, checked."""
    query = resolve_query(args.query)
    inputs = parse_inputs([args.input], query)
    undirected = check_undirected(args.undirected, query, inputs)
    (rel,) = inputs
    if len(query.relations) != 1 or rel not in undirected:
        raise UsageError(
            f"this part runs a query over one undirected graph: give --undirected {rel}"
            if len(query.relations) == 1
            else f"query {query.name} reads {len(query.relations)} relations; this part runs a "
            "query over one undirected graph"
        )
    check_files(query, inputs)
    if args.epoch_size < 2:
        raise UsageError(f"--epoch-size must be at least 2, got {args.epoch_size}")
    return query, rel, inputs[rel]


def _methods(given: str | None, default: Sequence[str]) -> list[str]:
    return [m.strip() for m in (given or ",".join(default)).split(",") if m.strip()]


def _png(given: str | None, default: str) -> Path:
    """The plot to write: `given`, else `default`; a PNG."""
    plot = Path(given or default)
    if plot.suffix.lower() != ".png":
        raise UsageError(f"--plot {plot}: the plot is a PNG; give a path ending in .png")
    return plot


def _say_targets(result: dict[str, Any]) -> None:
    for t in result["targets"]:
        say(f"target: {t['target']}: {t['measured']} ({'met' if t['met'] else 'not met'})")


def _finish(
    args: argparse.Namespace,
    result: dict[str, Any],
    spark: SparkSession | None = None,
    facts: dict[str, Any] | None = None,
) -> int:
    """Success; with ``--json``, after one JSON line: `result` and the machine's facts (`facts`,
    else those `machine_facts` finds, Spark's included when it ran)."""
    if args.json:
        emit_json({**result, "machine": machine_facts(spark) if facts is None else facts})
    return EXIT_OK


def _checked_inputs(args: argparse.Namespace) -> tuple[Query, dict[str, str], set[str]]:
    """The query, its inputs and undirected relations, checked (files included) without Spark."""
    query = resolve_query(args.query)
    inputs = parse_inputs(args.input, query)
    undirected = check_undirected(args.undirected, query, inputs)
    check_files(query, inputs)
    return query, inputs, undirected


# --- epochs -------------------------------------------------------------------------------------


def _epochs(args: argparse.Namespace) -> int:
    query, inputs, undirected = _checked_inputs(args)
    if args.epochs < 2 or args.epoch_size < 2:
        raise UsageError("--epochs and --epoch-size must be at least 2")
    workspace.prepare_state(args.state)
    spark = workspace.start_spark(args.master, args.conf)
    with workspace.state_dir(args.state) as state:
        relations = read_inputs(spark, query, inputs)
        say(f"bench: preparing {args.epochs} epochs of {args.epoch_size} changes")
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
        methods = _methods(args.methods, METHODS)
        result = bench(
            spark,
            query,
            workload,
            state,
            methods=methods,
            on_epoch=_epoch_progress,
            deployment=args.deploy,
        )
    summary = result.to_dict()
    for name, m in summary["methods"].items():
        say(
            f"{name:>12}: median {m['median_seconds']:.3f} s/epoch, intermediate rows "
            f"{m['intermediate_rows']}, shuffle bytes {m['shuffle_bytes']}, state bytes "
            f"{m['state_bytes']}"
        )
    ratios = [k for k in summary if k.endswith(("_vs_recompute", "_vs_binary_delta"))]
    say("; ".join(f"{k} {summary[k]}" for k in ratios))
    return _finish(args, summary, spark)


def _epoch_progress(t: int, epochs: int, samples: dict[str, Sample], changes: int) -> None:
    figures = ", ".join(
        f"{name} {s.seconds:.2f} s ({s.intermediate_rows} join rows)" for name, s in samples.items()
    )
    say(f"epoch {t}/{epochs}: {figures}; output change rows {changes}, identical")


# --- static -------------------------------------------------------------------------------------


def _static(args: argparse.Namespace) -> int:
    query, inputs, undirected = _checked_inputs(args)
    if args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {args.repeat}")
    methods = check_methods(_methods(args.methods, STATIC_DEFAULT), query, frozenset(undirected))
    baseline = tuple(shlex.split(args.baseline_wcoj)) if args.baseline_wcoj else None
    if "wcoj-count-baseline" in methods and baseline is None:
        raise UsageError("method wcoj-count-baseline needs --baseline-wcoj CMD")
    files = {rel: str(Path(p).resolve()) if Path(p).exists() else p for rel, p in inputs.items()}
    command = CountCommand(args.query, files, tuple(sorted(undirected)), baseline)
    workspace.prepare_state(args.state)
    spark = workspace.start_spark(args.master, args.conf)
    with workspace.state_dir(args.state) as state:
        relations = read_inputs(spark, query, inputs)
        say(f"bench static: {query.name}, {args.repeat} timed runs per method")
        result = static_bench(
            spark,
            query,
            relations,
            state,
            undirected=frozenset(undirected),
            methods=methods,
            repeat=args.repeat,
            on_run=_static_progress,
            deployment=args.deploy,
            command=command,
        )
    summary = result.to_dict()
    say(f"count {result.count}: every method agrees")
    for name, why in result.skipped.items():
        say(f"{name} skipped: {why}")
    for name, m in summary["methods"].items():
        rows = "" if m["join_rows"] is None else f", join rows {m['join_rows']}"
        say(
            f"{name:>15}: median {m['median_seconds']:.3f} s{rows}, "
            f"{m['ratio_to_wcoj']}x wcoj's time"
        )
    ratios = [k for k in summary if k.startswith("speedup_vs_")]
    say("; ".join(f"{k} {summary[k]}" for k in ratios))
    return _finish(args, summary, spark)


def _static_progress(run: StaticRun) -> None:
    which = "warm-up" if run.warm_up else f"run {run.run}/{run.runs}"
    rows = "" if run.join_rows is None else f", join rows {run.join_rows}"
    say(f"{run.method} {which}: {run.seconds:.3f} s, count {run.count}{rows}")


# --- curve --------------------------------------------------------------------------------------


def _curve(args: argparse.Namespace) -> int:
    """Every point checked and timed by `bench`; progress on stderr."""
    curve: Curve = args.curve
    query, inputs, undirected = _checked_inputs(args)
    if curve is Curve.SIZE:
        if args.epoch_sizes is not None:
            raise UsageError("--epoch-sizes goes with curve epoch-size; curve size varies --sizes")
        points = parse_points(args.sizes, "--sizes") if args.sizes else DEFAULT_SIZES
        for path in inputs.values():
            sized_spec(path, points[0])  # a file, or a generator that fixes its size, is refused
    else:
        if args.sizes is not None or args.epoch_size is not None:
            raise UsageError(
                "curve epoch-size varies the epoch size: give --epoch-sizes, not --sizes or "
                "--epoch-size"
            )
        points = DEFAULT_EPOCH_SIZES
        if args.epoch_sizes:
            points = parse_points(args.epoch_sizes, "--epoch-sizes")
    epochs = DEFAULT_EPOCHS if args.epochs is None else args.epochs
    epoch_size = DEFAULT_EPOCH_SIZE if args.epoch_size is None else args.epoch_size
    check_points(curve, points, epochs=epochs, epoch_size=epoch_size)
    methods = check_curve_methods((args.methods or ",".join(CURVE_METHODS)).split(","))
    plot = _png(args.plot, f"curve-{curve.value}.png")
    workspace.prepare_state(args.state)
    spark = workspace.start_spark(args.master, args.conf)
    with workspace.state_dir(args.state) as state:
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
            say=note,
            deployment=args.deploy,
        )
    plot_curve(result, plot)
    if args.save:
        save_curve(result, Path(args.save))
    summary = result.to_dict()
    for p in result.points:
        medians = ", ".join(f"{m} {p.median(m):.3f} s/epoch" for m in result.methods)
        say(f"{p.x:>12,}: {medians}")
    say(
        "growth per 10x: "
        + "; ".join(
            f"{m} x{g['fit']} (fit), x{g['end_points']} (end points)"
            for m, g in summary["growth_per_decade"].items()
        )
    )
    say(f"plot: {plot}" + (f"; points: {args.save}" if args.save else ""))
    return _finish(args, summary, spark)


# --- cold and idle ------------------------------------------------------------------------------


def _cold(args: argparse.Namespace) -> int:
    query, rel, source = _graph_input(args)
    text = args.sizes.strip().lower()
    sizes = () if text == "none" else parse_points(args.sizes, "--sizes")
    plot = _png(args.plot, "cold.png")
    if sizes:
        sized_spec(args.rmat, sizes[0])
    result = cold.run_cold(
        source,
        query=args.query,
        relation=rel,
        epochs=args.epochs,
        warm_epochs=args.warm_epochs,
        epoch_size=args.epoch_size,
        seed=args.seed,
        sizes=sizes,
        rmat=args.rmat,
        scratch=Path(args.scratch),
        dropped=not args.no_evict,
        say=note,
    )
    facts = machine_facts(None)
    java = result["graph"]["runs"]["recompute"][0].get("java")
    if java:
        facts["java"] = java  # the recompute processes' JVM (this process starts none)
    cold.plot_cold(result, plot, machine_label(facts))
    g = result["graph"]["processes"]
    say(
        f"{query.name}: fresh wcoj apply {g['apply']['median_seconds']:.3f} s, Spark SQL "
        f"recompute {g['recompute']['median_seconds']:.2f} s "
        f"(x{result['graph']['speedup_vs_recompute']}), open "
        f"{g['open']['median_open_seconds']:.4f} s inside a {g['open']['median_seconds']:.2f} s "
        "process"
    )
    _say_targets(result)
    say(f"plot: {plot}")
    return _finish(args, result, facts=facts)


def _shards(args: argparse.Namespace) -> int:
    try:
        ks = [int(k) for k in args.shards.split(",")]
    except ValueError as e:
        raise UsageError(f"--shards: {args.shards!r} is not a list of numbers such as 2,8") from e
    if not ks or min(ks) < 1 or args.slice_rows < 1 or args.hubs < 0:
        raise UsageError("--shards, --slice-rows must be 1 or more, --hubs 0 or more")
    queries = [q for q in args.queries.split(",") if q]
    unknown = set(queries) - {"triangles", "4-cliques"}
    if unknown:
        raise UsageError(f"--queries: {', '.join(sorted(unknown))}: known are triangles, 4-cliques")
    result = shards.run_shards(
        args.rmat or shards.DEFAULT_RMAT,
        args.hubs,
        args.hub_degree,
        ks,
        queries,
        args.slice_rows,
        say=note,
    )
    _say_targets(result)
    if args.plot:
        shards.plot(result, Path(args.plot))
        say(f"plot: {args.plot}")
    if args.save:
        scale.save(result, Path(args.save))
    return _finish(args, result)


def _scale(args: argparse.Namespace) -> int:
    from wcoj_core.budget import parse_size

    if args.shards:
        return _shards(args)
    args.rmat = args.rmat or scale.DEFAULT_RMAT

    for flag, value in (("--memory", args.memory), ("--cap", args.cap)):
        try:
            parse_size(value)
        except WcojError as e:
            raise UsageError(f"{flag}: {e}") from e
    if args.build < 0 or args.epochs < 0:
        raise UsageError("--build and --epochs must be 0 or more")
    sizes = [] if args.sizes.strip().lower() == "none" else [x for x in args.sizes.split(";") if x]
    methods = [] if args.methods.strip().lower() == "none" else args.methods.split(",")
    result = scale.run_scale(
        args.rmat,
        query=args.query,
        memory=args.memory,
        build=args.build,
        epochs=args.epochs,
        epoch_size=args.epoch_size,
        sizes=sizes,
        methods=methods,
        cap=args.cap,
        timeout=args.timeout,
        scratch=Path(args.scratch),
        seed=args.seed,
        say=note,
    )
    load = result["load"]["apply"]
    say(
        f"{args.rmat}: one epoch {load['seconds']:.1f} s, tree {load['tree_anon_bytes'] / 2**30:.2f} "
        f"GiB anonymous (budget {args.memory}), count {load['count']:,}"
    )
    _say_targets(result)
    if args.save:
        scale.save(result, Path(args.save))
    return _finish(args, result)


def _idle(args: argparse.Namespace) -> int:
    query, rel, source = _graph_input(args)
    if args.epochs < 1:
        raise UsageError(f"--epochs must be at least 1, got {args.epochs}")
    if args.gap < 0:
        raise UsageError(f"--gap must be at least 0 seconds, got {args.gap:g}")
    graph, built = idle.prepare_idle(
        source,
        query=args.query,
        relation=rel,
        epochs=args.epochs,
        epoch_size=args.epoch_size,
        seed=args.seed,
        scratch=Path(args.scratch),
        say=note,
    )
    spark = workspace.start_spark(args.master, args.conf)
    result = idle.run_idle(
        spark,
        graph,
        built,
        query=args.query,
        relation=rel,
        epochs=args.epochs,
        gap=args.gap,
        scratch=Path(args.scratch),
        deployment=args.deploy,
        say=note,
    )
    say(
        f"{query.name}: back to back {result['median_back_to_back_seconds']:.3f} s per epoch, "
        f"{args.gap:g} s apart {result['median_apart_seconds']:.3f} s: "
        f"x{result['apart_over_back_to_back']}"
    )
    return _finish(args, result, spark)


def _dagster_run(args: argparse.Namespace) -> int:
    query, rel, source = _graph_input(args)
    if query.name != dagster_run.QUERY or rel != dagster_run.RELATION:
        raise UsageError(
            "this part runs the README's quick start: --query triangles over --input edge=PATH"
        )
    result = dagster_run.run_dagster_run(
        source,
        epochs=args.epochs,
        epoch_size=args.epoch_size,
        seed=args.seed,
        scratch=Path(args.scratch),
        instance=args.instance,
        say=note,
    )
    say(
        f"{query.name}: dagster job execute {result['real']['median_seconds']:.2f} s per epoch, "
        f"empty bodies {result['hollow']['median_seconds']:.2f} s, wcoj apply "
        f"{result['apply']['median_seconds']:.2f} s"
    )
    _say_targets(result)
    return _finish(args, result)


# --- cluster ------------------------------------------------------------------------------------


def _aggregates(args: argparse.Namespace) -> int:
    result = aggregates.run(args)
    if "static" in result:
        st = result["static"]["median"]
        say(f"static seconds: {st}")
    if "warm" in result:
        for q, f in result["warm"].items():
            if isinstance(f, dict):
                say(
                    f"warm {q}: {f['changes_per_second']:,} changes per second, "
                    f"{f['changes_per_cpu_second']:,} per CPU second"
                )
    for s in result.get("skew", []):
        say(f"skew: {s['query']}, N {s['N']:,}: {s['work_per_change']:,.0f} work per change")
    return _finish(args, result)


def _ask(args: argparse.Namespace) -> int:
    result = ask.run(args)
    ask.say_result(result, say)
    return _finish(args, result)


def _cluster(args: argparse.Namespace) -> int:
    if args.action == "up":
        started = cluster.up(
            args.dir,
            workers=args.workers,
            cores=args.cores,
            memory=args.memory,
            port=args.port,
            ui_port=args.ui_port,
            say=say,
        )
        say(f"master: {started.master}")
        say(f"stop it with: {PROG} cluster down --dir {args.dir}")
        payload: dict[str, Any] = {"master": started.master, "ui": started.ui}
        payload["workers"] = len(started.workers)
    elif args.action == "down":
        stopped = cluster.down(args.dir, say=say)
        payload = {"master": stopped.master, "stopped": len(stopped.processes)}
    else:
        found, alive = cluster.status(args.dir)
        say(f"master: {found.master} (UI {found.ui}); workers alive: {alive}")
        payload = {"master": found.master, "ui": found.ui, "workers_alive": alive}
    if args.json:
        emit_json({"command": f"cluster {args.action}", **payload})
    return EXIT_OK


# --- main ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    given = list(sys.argv[1:] if argv is None else argv)
    if given and given[0] in DELEGATED:
        return DELEGATED[given[0]][0](given[1:])
    try:
        args = _parser().parse_args(given)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")
            return int(args.run(args))
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        error("interrupted", PROG)
        return EXIT_INTERRUPTED
    except WcojError as exc:
        error(str(exc), PROG)
        return EXIT_USAGE
    except (PySparkException, Py4JError) as exc:
        error(f"spark failed: {spark_message(exc)}", PROG)
        return EXIT_FAILED
