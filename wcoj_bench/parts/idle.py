"""`wcoj-bench idle`: epochs back to back, then minutes apart, with the kernel in Spark's executors.

Spark ends a Python worker that has been idle for a minute (hard-coded in PySpark's worker
factory). A worker that keeps wcoj's arrangements in its memory loses them then; one that maps
them from files finds them again. This part measures what that costs an epoch: on one prepared
graph (`wcoj_bench.infra.prepared`, by default a 20 M-edge R-MAT graph, built once by ``wcoj apply``
and cached), one engine in this process with the deployment asked for (``--deploy executors``
on a cluster: `wcoj_bench.infra.cluster`) applies

1. one warm-up epoch (the executors' first: their workers start and copy the arrangement files
   to executor-local disk), reported, not counted;
2. `epochs` epochs **back to back**;
3. `epochs` epochs **apart**: each after sleeping `gap` seconds (default 120, past the minute
   after which Spark ends idle workers).

Each epoch is timed around `Engine.apply` (its changes already read into memory), with the
engine's phases, where the kernel ran, and the Spark Python worker processes on this machine
before and after it (a worker that appears is a fresh one). The report gives both medians and
their ratio; the target (issue 21) is at most 2x.

The check: afterwards, a second copy of the same state applies the same epochs on the driver,
and every epoch's output change must equal the executors' as an exact multiset.
"""

from __future__ import annotations

import shutil
import statistics
import time as clock
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wcoj_bench.infra.measure import BenchError, change_arrays, compare_changes, spark_workers
from wcoj_bench.infra.prepared import (
    BuiltState,
    PreparedGraph,
    base_state,
    prepare_graph,
    working_copy,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Say = Callable[[str], None]
DEFAULT_INPUT = "rmat:scale=20,edges=20000000,seed=1"
DEFAULT_EPOCHS = 4
DEFAULT_GAP = 120.0
TARGET_RATIO = 2.0


def _engine(spark: Any, state: Path, query: Any, relation: str, deployment: str) -> Any:
    from wcoj_core.engine import Engine
    from wcoj_core.meaning import relation_specs

    specs = relation_specs(dict(query.relations), undirected=[relation])
    return Engine(spark, str(state), query, relations=specs, deployment=deployment)


def _change(engine: Any, result: Any, query: str, epoch: int) -> Any:
    found = result.changes.get(query)
    if found is not None:
        return found
    table = engine.change(query, epoch)
    return change_arrays(table, [c for c in table.column_names if c != "diff"])


def prepare_idle(
    source: str = DEFAULT_INPUT,
    *,
    query: str = "triangles",
    relation: str = "edge",
    epochs: int = DEFAULT_EPOCHS,
    epoch_size: int = 1_000,
    seed: int = 1,
    scratch: Path = Path(".wcoj/bench"),
    say: Say = lambda _line: None,
) -> tuple[PreparedGraph, BuiltState]:
    """The graph, its epochs (a warm-up, then `epochs` twice) and its built state, from the
    cache (made first when they are not there; before Spark starts, so nothing competes)."""
    if epochs < 1:
        raise BenchError(f"--epochs must be at least 1, got {epochs}")
    cache = scratch / "cache"
    graph = prepare_graph(
        source, cache, epochs=1 + 2 * epochs, epoch_size=epoch_size, seed=seed, say=say
    )
    return graph, base_state(graph, cache, query=query, relation=relation, say=say)


def run_idle(
    spark: SparkSession,
    graph: PreparedGraph,
    built: BuiltState,
    *,
    query: str = "triangles",
    relation: str = "edge",
    epochs: int = DEFAULT_EPOCHS,
    gap: float = DEFAULT_GAP,
    scratch: Path = Path(".wcoj/bench"),
    deployment: str = "executors",
    say: Say = lambda _line: None,
) -> dict[str, Any]:
    """The part (see the module) on a prepared graph and its state: its JSON report."""
    from wcoj_core.input_read import read_local
    from wcoj_core.query.builtins import resolve_query

    if gap < 0:
        raise BenchError(f"--gap must be at least 0 seconds, got {gap:g}")
    q = resolve_query(query)
    work = scratch / "idle"
    shutil.rmtree(work, ignore_errors=True)
    total = 1 + 2 * epochs
    working_copy(built, work / "timed")
    engine = _engine(spark, work / "timed", q, relation, deployment)
    arity = q.relations[relation]
    tables = [read_local(str(graph.epoch(t)), arity, relation) for t in range(1, total + 1)]
    records: list[dict[str, Any]] = []
    changes: dict[int, Any] = {}
    for i, table in enumerate(tables):
        kind = "warm-up" if i == 0 else ("back-to-back" if i <= epochs else "apart")
        if kind == "apart" and gap:
            say(f"idle: sleeping {gap:g} s before epoch {i + 1}/{total}")
            clock.sleep(gap)
        epoch = built.last_epoch + 1 + i
        before = spark_workers()
        start = clock.perf_counter()
        result = engine.apply(epoch, {relation: table})
        seconds = clock.perf_counter() - start
        after = spark_workers()
        changes[epoch] = _change(engine, result, q.name, epoch)
        records.append(
            {
                "epoch": epoch,
                "kind": kind,
                "seconds": round(seconds, 4),
                "phases": {k: round(v, 4) for k, v in result.metrics.seconds.items()},
                "deployment": result.metrics.deployment,
                "reason": result.metrics.reason,
                "count": result.count(q.name),
                "change_rows": result.metrics.outputs.get(q.name, 0),
                "workers_before": len(before),
                "new_workers": len(set(after) - set(before)),
                "largest_worker_rss_bytes": max(after.values(), default=0),
            }
        )
        say(
            f"idle: epoch {i + 1}/{total} ({kind}): {seconds:.2f} s on "
            f"{result.metrics.deployment}, {records[-1]['new_workers']} new Python worker(s)"
        )
    say("idle: checking every epoch against the driver on a second copy")
    working_copy(built, work / "check")
    check = _engine(spark, work / "check", q, relation, "driver")
    for i, table in enumerate(tables):
        epoch = built.last_epoch + 1 + i
        result = check.apply(epoch, {relation: table})
        found = compare_changes(changes[epoch], _change(check, result, q.name, epoch))
        if not found.equal or result.count(q.name) != records[i]["count"]:
            raise BenchError(
                f"epoch {epoch}: the {deployment} and the driver disagree: {found.mismatches} "
                f"output tuples differ (e.g. {list(found.examples)[:3]}), counts "
                f"{records[i]['count']:,} and {result.count(q.name):,}"
            )
    shutil.rmtree(work, ignore_errors=True)
    back = [r["seconds"] for r in records if r["kind"] == "back-to-back"]
    apart = [r["seconds"] for r in records if r["kind"] == "apart"]
    ratio = round(statistics.median(apart) / statistics.median(back), 3)
    return {
        "command": "bench",
        "mode": "idle",
        "check": "passed",
        "query": q.name,
        "input": graph.facts["input"],
        "edges": graph.edge_count,
        "base_epochs": built.last_epoch + 1,
        "epochs": epochs,
        "epoch_size": graph.epoch_size,
        "gap_seconds": gap,
        "deployment": deployment,
        "median_back_to_back_seconds": round(statistics.median(back), 4),
        "median_apart_seconds": round(statistics.median(apart), 4),
        "apart_over_back_to_back": ratio,
        "target_ratio": TARGET_RATIO,
        "met": ratio <= TARGET_RATIO,
        "runs": records,
    }


__all__ = [
    "DEFAULT_EPOCHS",
    "DEFAULT_GAP",
    "DEFAULT_INPUT",
    "TARGET_RATIO",
    "prepare_idle",
    "run_idle",
]
