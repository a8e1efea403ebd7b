"""A single-run Dagster backfill of K epochs against the CLI's engine on the same epochs: checked, then timed.

``wcoj-bench backfill --input edge=GRAPH --undirected edge --epochs K --epoch-size N [--seed S]
[--root DIR] [--instance sqlite|postgres] [--json]`` measures the benchmark target "a backfill of
K epochs of N changes through the Dagster pipeline in one run, with per-epoch time within 1.5x of
the CLI's", side by side in one process and one SparkSession:

1. **Workload** — `wcoj_bench.parts.epochs.make_workload`, exactly as ``wcoj-bench epochs`` builds it: the
   input's initial state is epoch 0, and each epoch ``1..K`` inserts ``N // 2`` held-back tuples and
   deletes the rest of its ``N`` (an undirected edge counts once and lands in both directions).
   Every epoch is landed as ``<root>/landing/<rel>/<epoch key>/part-0.parquet`` with
   `wcoj_assets.landing_write.write_epochs` before anything is timed. Both sides read these files with the
   pipeline's own reader (`wcoj_assets.landing_read.read_epoch`: local files by pyarrow) and declare the
   relations alike (the undirected ones undirected sets, the others bags).
2. **Dagster** — the code location of `build_definitions` (the default spec, ``triangles`` over
   ``edge``) over a fresh state, on a real `DagsterInstance`: with ``--instance sqlite`` (the
   default) the demo's, in ``<root>/dagster``; with ``--instance postgres`` the production one,
   on a PostgreSQL server the bench starts in a temporary folder and stops at the end
   (`wcoj_assets.instance`). Either way every run has `wcoj_assets.instance.dagster_env`'s
   settings, as the webserver and the daemon do. Epoch 0, the bulk load of the whole initial
   graph, is materialized first in its own untimed run: the CLI does not time its initial epoch
   either, and a bulk load is not what a per-epoch figure should average. Then ONE run of
   ``wcoj_epoch_job`` over the partition range ``1..K`` (the tags
   ``dagster/asset_partition_range_start`` / ``_end``, what a single-run backfill launches) is
   timed wall to wall: Dagster seconds per epoch = that wall time / K. It is one step (every
   asset, one engine pass and one manifest commit per epoch) and includes every asset check the
   run evaluates (the per-epoch audit ``matches_delta_rules``; the binary-join recomputation
   ``matches_binary_join`` on its cadence, one epoch in 30) — reported separately too. The step's
   duration comes from the run's STEP_START / STEP_SUCCESS event timestamps, each epoch's engine
   work from the ``seconds`` of its partition's materializations. A launched run has a process
   of its own; here both runs share this one, so Spark's cache is cleared between them (and
   again before the CLI side).
3. **Floor** — the same two runs of the same asset graph with empty bodies
   (`wcoj_bench.infra.hollow`), on a fresh instance of the same kind (``<root>/dagster-hollow``, or a
   server of its own) with the same settings: what Dagster's own bookkeeping costs per epoch for
   this asset model, with no wcoj work at all. Its range run must write as many materializations
   and check evaluations as the real one did.
4. **CLI** — a fresh `Engine` applies the same landed files epoch by epoch with
   `Engine.apply`, the call ``wcoj replay`` and ``wcoj apply`` make. Epoch 0 is untimed; an
   epoch's time covers reading its landed files and applying them (what ``wcoj apply`` does,
   without starting a JVM). Reported: median and mean.
5. **Correctness** — before any figure is reported, every epoch's output change of the pipeline
   (the query's change batch in its state, `Engine.change`) must equal the engine's as an exact
   multiset (epoch 0 compared in Spark, epochs ``1..K`` as `Counter`s); the first difference
   raises `BackfillError` naming the epoch. Both Dagster runs must succeed and every asset check
   they evaluated must pass.

Also counted: Spark jobs and manifest commits of each side, and the machine's load average at
the start and the end (the figures are wall-clock times on whatever else the machine runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wcoj_bench.parts.backfill_sides import (
    BackfillError,
    CliSide,
    DagsterSide,
    HollowSide,
    InstanceKind,
    Multiset,
    Say,
    check_changes,
    land,
    run_cli,
    run_dagster,
    run_hollow,
)
from wcoj_core.errors import WcojError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TARGET_RATIO = 1.5  # issue 22: a single-run backfill within 1.5x of the CLI's median epoch


# -- the whole benchmark --------------------------------------------------------------------


@dataclass
class BackfillResult:
    query: str
    epochs: int
    epoch_size: int
    instance: InstanceKind
    dagster: DagsterSide
    hollow: HollowSide
    cli: CliSide
    tuples_compared: int
    load_average: dict[str, list[float]]
    pipeline_changes: dict[int, Multiset] = field(repr=False)
    engine_changes: dict[int, Multiset] = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        from wcoj_assets.checks import BINARY_JOIN
        from wcoj_assets.instance import dagster_env

        d, c, k = self.dagster, self.cli, self.epochs
        per_epoch, floor = d.range_seconds / k, self.hollow.range_seconds / k
        median, mean = statistics.median(c.seconds), statistics.fmean(c.seconds)
        correctness = d.check_seconds.get(BINARY_JOIN, 0.0)
        return {
            "command": "backfill-bench",
            "query": self.query,
            "epochs": k,
            "epoch_size": self.epoch_size,
            # Where the runs were stored, and the settings every run had.
            "instance": self.instance.value,
            "dagster_env": dagster_env(),
            "dagster_seconds": round(d.range_seconds, 3),
            # Per-epoch figures keep a tenth of a millisecond: a median epoch of 20 ms rounded to
            # whole milliseconds would move the ratio by up to 2.5 %.
            "dagster_seconds_per_epoch": round(per_epoch, 4),
            "dagster_seconds_per_epoch_without_correctness_check": round(
                (d.range_seconds - correctness) / k, 4
            ),
            "dagster_epoch0_seconds": round(d.epoch0_seconds, 3),
            "cli_seconds_per_epoch": round(median, 4),
            "cli_mean_seconds_per_epoch": round(mean, 4),
            "cli_seconds": [round(s, 4) for s in c.seconds],
            "cli_epoch0_seconds": round(c.epoch0_seconds, 3),
            "cli_paths": dict(Counter(c.paths)),
            "cli_phase_seconds": {p: round(v, 3) for p, v in c.phase_seconds.items()},
            "ratio": round(per_epoch / median, 3),
            "ratio_vs_cli_mean": round(per_epoch / mean, 3),
            "target_ratio": TARGET_RATIO,
            "target_met": per_epoch <= TARGET_RATIO * median,
            # The same runs with empty bodies: Dagster's own cost per epoch for this asset model.
            "dagster_floor_seconds_per_epoch": round(floor, 4),
            "floor_ratio": round(floor / median, 3),
            "floor_ratio_vs_cli_mean": round(floor / mean, 3),
            "dagster_events_per_epoch": {n: round(v / k, 2) for n, v in d.events.items()},
            # Seconds the checks took inside the step (the per-epoch audit, the binary join).
            "check_seconds": {n: round(v, 3) for n, v in d.check_seconds.items()},
            # Wall seconds of each step of the range run (STEP_START to STEP_SUCCESS) ...
            "asset_seconds": d.step_seconds,
            # ... of which the epochs' own work (the assets' per-epoch figures), in all and per
            # epoch: first, median, last (a growing figure is a cost that grows with history).
            "asset_epoch_work_seconds": {
                step: round(sum(s), 4) for step, s in d.epoch_seconds.items()
            },
            "asset_epoch_seconds": {
                step: {
                    "first": round(s[0], 3),
                    "median": round(statistics.median(s), 3),
                    "last": round(s[-1], 3),
                }
                for step, s in d.epoch_seconds.items()
                if s
            },
            "dagster_outside_steps_seconds": round(
                d.range_seconds - sum(d.step_seconds.values()), 3
            ),
            "spark_jobs_per_epoch": {
                "dagster": round(d.spark_jobs / k, 1),
                "cli": round(c.spark_jobs / k, 1),
            },
            "manifest_commits_per_epoch": {
                "dagster": round(d.manifest_commits / k, 1),
                "cli": round(c.manifest_commits / k, 1),
            },
            "output_change_rows": [len(self.engine_changes[t]) for t in range(1, k + 1)],
            "final_count": c.final_count,
            "load_average": self.load_average,
            "checks": {
                "output_changes": "identical",
                "epochs_compared": k + 1,
                "tuples_compared": self.tuples_compared,
                "final_count": "identical",
                "dagster_runs": "succeeded",
                "asset_checks_passed": d.checks_passed,
                "asset_checks_failed": 0,
            },
        }


def backfill_bench(
    spark: SparkSession,
    relations: Mapping[str, DataFrame],
    root: Path,
    *,
    epochs: int,
    epoch_size: int,
    seed: int = 1,
    undirected: frozenset[str] = frozenset(),
    say: Say = print,
    progress_interval: float = 30.0,
    instance: InstanceKind = InstanceKind.SQLITE,
) -> BackfillResult:
    """Land the workload under `root`, run both sides (Dagster's on an `instance` of that kind),
    compare every epoch, return the figures."""
    from wcoj_assets.specs import DEFAULT_SPECS, Topology
    from wcoj_bench.parts.epochs import make_workload
    from wcoj_core.reference import compare, output_columns

    load = {"start": [round(x, 2) for x in os.getloadavg()]}
    query = Topology.of(DEFAULT_SPECS).queries[0]
    say(f"load average at start: {load['start']}")
    say(f"workload: {epochs} epochs of {epoch_size} changes (seed {seed}), landing under {root}")
    workload = make_workload(
        spark,
        query,
        relations,
        epochs=epochs,
        epoch_size=epoch_size,
        seed=seed,
        undirected=undirected,
    )
    keys = land(spark, workload, root / "landing")
    say(f"landed {len(keys)} epoch folders ({keys[0]}..{keys[-1]})")

    dagster, pipeline_changes, pipeline_initial = run_dagster(
        spark, root, epochs, say, progress_interval, instance, undirected
    )
    hollow = run_hollow(root, epochs, dagster.events, say, instance, undirected)
    spark.catalog.clearCache()  # the CLI starts without the pipeline's cached batches

    def check_initial(engine_initial: DataFrame) -> int:
        found = compare(pipeline_initial, engine_initial, output_columns(query))
        if not found.equal:
            shown = "; ".join(f"{k}: pipeline {e}, engine {a}" for k, e, a in found.examples)
            raise BackfillError(
                f"epoch 0: {found.mismatches} output tuple(s) differ between the Dagster "
                f"pipeline and the engine: {shown}"
            )
        return found.expected_rows

    cli, engine_changes, compared = run_cli(
        spark, root, query, epochs, say, check_initial, undirected
    )
    compared += check_changes(pipeline_changes, engine_changes)
    if dagster.final_count != cli.final_count:
        raise BackfillError(
            f"epoch {epochs}: the pipeline's output counts {dagster.final_count}, "
            f"the engine's {cli.final_count}"
        )
    say(f"checked: epochs 0..{epochs}, identical output changes ({compared} tuples compared)")
    load["end"] = [round(x, 2) for x in os.getloadavg()]
    say(f"load average at end: {load['end']}")
    return BackfillResult(
        query=query.name,
        epochs=epochs,
        epoch_size=epoch_size,
        instance=instance,
        dagster=dagster,
        hollow=hollow,
        cli=cli,
        tuples_compared=compared,
        load_average=load,
        pipeline_changes=pipeline_changes,
        engine_changes=engine_changes,
    )


# -- the command line -----------------------------------------------------------------------


def table(summary: Mapping[str, Any]) -> list[str]:
    """The report's lines: per-epoch times, the ratio, and where the Dagster run's time went."""
    settings = ", ".join(f"{k}={v}" for k, v in summary["dagster_env"].items())
    lines = [
        f"dagster instance: {summary['instance']} ({settings})",
        f"{'':34}{'s/epoch':>10}",
        f"{'dagster (one run over the range)':34}{summary['dagster_seconds_per_epoch']:>10.3f}",
        f"{'cli (median)':34}{summary['cli_seconds_per_epoch']:>10.3f}",
        f"{'cli (mean)':34}{summary['cli_mean_seconds_per_epoch']:>10.3f}",
        f"{'dagster, empty bodies (floor)':34}{summary['dagster_floor_seconds_per_epoch']:>10.3f}",
        f"ratio dagster / cli median: {summary['ratio']} "
        f"(target <= {summary['target_ratio']}: {'met' if summary['target_met'] else 'NOT met'})",
        f"ratio floor / cli median: {summary['floor_ratio']} (Dagster's bookkeeping alone)",
        "",
        f"{'dagster step':34}{'step s':>10}",
    ]
    for step, seconds in summary["asset_seconds"].items():
        lines.append(f"{step:34}{seconds:>10.1f}")
    lines.append(f"{'(outside any step)':34}{summary['dagster_outside_steps_seconds']:>10.1f}")
    lines.append(
        f"{'within the step, per epoch':34}{'all s':>10}{'first':>8}{'median':>8}{'last':>8}"
    )
    per_epoch = summary["asset_epoch_seconds"]
    for part, total in summary["asset_epoch_work_seconds"].items():
        e = per_epoch[part]
        lines.append(
            f"{part:34}{total:>10.2f}{e['first']:>8.3f}{e['median']:>8.3f}{e['last']:>8.3f}"
        )
    for check, seconds in summary.get("check_seconds", {}).items():
        lines.append(f"{'check ' + check:34}{seconds:>10.2f}")
    jobs, commits = summary["spark_jobs_per_epoch"], summary["manifest_commits_per_epoch"]
    lines.append(
        f"per epoch: Spark jobs dagster {jobs['dagster']}, cli {jobs['cli']}; manifest commits "
        f"dagster {commits['dagster']}, cli {commits['cli']}"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    from wcoj_core.cli.inputs import check_undirected, parse_inputs, read_inputs
    from wcoj_core.spark import session

    parser = argparse.ArgumentParser(
        prog="wcoj-bench backfill", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--input", action="append", required=True, metavar="REL=PATH")
    parser.add_argument("--undirected", action="append", default=[], metavar="REL")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--epoch-size", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--root", help="a new or empty folder for landing, states and Dagster")
    parser.add_argument("--master", help="Spark master (default: the active session, local[*])")
    parser.add_argument("--progress", type=float, default=30.0, help="seconds between reports")
    parser.add_argument(
        "--instance",
        choices=[k.value for k in InstanceKind],
        default=InstanceKind.SQLITE.value,
        help="the Dagster instance: the demo's SQLite files, or Postgres on a server the bench "
        "starts in a temporary folder",
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)

    from wcoj_assets.specs import DEFAULT_SPECS, Topology

    query = Topology.of(DEFAULT_SPECS).queries[0]
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="wcoj-backfill-"))
    try:
        inputs = parse_inputs(args.input, query)
        undirected = check_undirected(args.undirected, query, inputs)
        if args.root and root.exists() and any(root.iterdir()):
            raise BackfillError(f"--root {root}: not empty; pass a new or empty folder")
        root.mkdir(parents=True, exist_ok=True)
        spark = session(args.master, quiet=True)
        result = backfill_bench(
            spark,
            read_inputs(spark, query, inputs),
            root.absolute(),
            epochs=args.epochs,
            epoch_size=args.epoch_size,
            seed=args.seed,
            undirected=frozenset(undirected),
            say=lambda line: print(line, flush=True),
            progress_interval=args.progress,
            instance=InstanceKind(args.instance),
        )
    except WcojError as e:
        print(f"wcoj-bench backfill: error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    summary = result.to_dict()
    for line in table(summary):
        print(line, flush=True)
    if args.json:
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
