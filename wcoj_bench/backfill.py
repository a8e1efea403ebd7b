"""A single-run Dagster backfill of K epochs against the CLI's engine on the same epochs: checked, then timed.

``wcoj-bench backfill --input edge=GRAPH --undirected edge --epochs K --epoch-size N [--seed S]
[--root DIR] [--instance sqlite|postgres] [--json]`` measures the benchmark target "a backfill of
K epochs of N changes through the Dagster pipeline in one run, with per-epoch time within 1.5x of
the CLI's", side by side in one process and one SparkSession:

1. **Workload** — `wcoj_bench.epochs.make_workload`, exactly as ``wcoj-bench epochs`` builds it: the
   input's initial state is epoch 0, and each epoch ``1..K`` inserts ``N // 2`` held-back tuples and
   deletes the rest of its ``N`` (an undirected edge counts once and lands in both directions).
   Every epoch is landed as ``<root>/landing/<rel>/<epoch key>/part-0.parquet`` with
   `wcoj_assets.landing.write_epochs` before anything is timed. Both sides read these files with the
   pipeline's own reader (`wcoj_assets.intake.read_epoch`: local files by pyarrow) and declare the
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
   (`wcoj_bench.hollow`), on a fresh instance of the same kind (``<root>/dagster-hollow``, or a
   server of its own) with the same settings: what Dagster's own bookkeeping costs per epoch for
   this asset model, with no wcoj work at all. Its range run must write as many materializations
   and check evaluations as the real one did.
4. **CLI** — a fresh `Engine` applies the same landed files epoch by epoch with
   `Engine.apply_epoch`, the call ``wcoj replay`` and ``wcoj apply`` make. Epoch 0 is untimed; an
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
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time as clock
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wcoj_core.errors import WcojError

if TYPE_CHECKING:
    import pyarrow as pa
    from dagster import DagsterInstance, ExecuteInProcessResult
    from pyspark.sql import DataFrame, SparkSession

    from wcoj_bench.epochs import Workload
    from wcoj_core.query.ir import Query

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
TARGET_RATIO = 1.5  # issue 22: a single-run backfill within 1.5x of the CLI's median epoch

Multiset = Counter[tuple[int, ...]]
Say = Callable[[str], None]


class BackfillError(WcojError):
    """A backfill benchmark whose two sides disagree, or whose Dagster run failed."""


# -- comparing ------------------------------------------------------------------------------


def multiset(rows: Sequence[Sequence[int]]) -> Multiset:
    """Rows ``(c0.., diff)`` as a multiset of their data, zero multiplicities dropped.

    >>> sorted(multiset([(1, 2, 1), (1, 2, 1), (3, 4, 1), (3, 4, -1)]).items())
    [((1, 2), 2)]
    """
    out: Multiset = Counter()
    for row in rows:
        out[tuple(row[:-1])] += row[-1]
    return Counter({k: v for k, v in out.items() if v})


def compare_changes(epoch: int, pipeline: Mapping, engine: Mapping, examples: int = 5) -> int:
    """Raise `BackfillError` naming `epoch` unless both output changes are one multiset.

    Returns the number of tuples compared.

    >>> compare_changes(3, Counter({(1, 2, 3): 1}), Counter({(1, 2, 3): 1}))
    1
    >>> compare_changes(3, Counter({(1, 2, 3): 1}), Counter({(1, 2, 3): 2, (2, 3, 4): -1}))
    Traceback (most recent call last):
      ...
    wcoj_bench.backfill.BackfillError: epoch 3: 2 output tuple(s) differ between the Dagster pipeline and the engine: (1, 2, 3): pipeline 1, engine 2; (2, 3, 4): pipeline 0, engine -1
    """
    keys = {k for k, v in pipeline.items() if v} | {k for k, v in engine.items() if v}
    differ = sorted(k for k in keys if pipeline.get(k, 0) != engine.get(k, 0))
    if differ:
        shown = "; ".join(
            f"{k}: pipeline {pipeline.get(k, 0)}, engine {engine.get(k, 0)}"
            for k in differ[:examples]
        )
        raise BackfillError(
            f"epoch {epoch}: {len(differ)} output tuple(s) differ between the Dagster pipeline "
            f"and the engine: {shown}"
        )
    return len(keys)


def check_changes(pipeline: Mapping[int, Multiset], engine: Mapping[int, Multiset]) -> int:
    """Compare every epoch's output change (both sides must hold the same epochs); rows compared.

    >>> check_changes({1: Counter({(1,): 1})}, {1: Counter({(1,): 1}), 2: Counter()})
    Traceback (most recent call last):
      ...
    wcoj_bench.backfill.BackfillError: epoch 2: the engine has an output change, the Dagster pipeline none
    """
    for t in sorted(set(pipeline) ^ set(engine)):
        has, lacks = ("engine", "Dagster pipeline")[:: 1 if t in engine else -1]
        raise BackfillError(f"epoch {t}: the {has} has an output change, the {lacks} none")
    return sum(compare_changes(t, pipeline[t], engine[t]) for t in sorted(engine))


# -- landing --------------------------------------------------------------------------------


def land(spark: SparkSession, workload: Workload, landing: Path) -> list[str]:
    """Publish epoch 0 (the initial relations) and every epoch's changes as landing folders."""
    from pyspark.sql import functions as F

    from wcoj_assets.landing import write_epochs
    from wcoj_core.updates import TIME

    keys: set[str] = set()
    for rel, initial in workload.initial.items():
        stream = initial.withColumn(TIME, F.lit(0).cast("long"))
        for t in range(1, len(workload.epochs) + 1):
            stream = stream.unionByName(
                workload.changes(t)[rel].withColumn(TIME, F.lit(t).cast("long"))
            )
        keys.update(write_epochs(spark, str(landing), rel, stream))
    return sorted(keys)


def read_landed(
    spark: SparkSession, landing: Path, relations: Mapping[str, int], t: int
) -> dict[str, DataFrame | pa.Table]:
    """Every relation's landed changes at epoch `t`, read as the pipeline reads them
    (`wcoj_assets.intake.read_epoch`: local files by pyarrow, Spark only for remote or very
    large ones)."""
    from wcoj_assets.epochs import epoch_key
    from wcoj_assets.intake import read_epoch

    frames: dict[str, DataFrame | pa.Table] = {}
    for rel, arity in relations.items():
        found = read_epoch(str(landing), rel, arity, epoch_key(t), lambda _why: spark).rows
        if found is not None:
            frames[rel] = found
    return frames


# -- counting Spark jobs and commits --------------------------------------------------------


def spark_jobs(spark: SparkSession) -> int:
    """The highest Spark job id so far (ids are sequential: a difference counts jobs)."""
    return max(spark.sparkContext.statusTracker().getJobIdsForGroup(), default=-1)


def heap_used(spark: SparkSession) -> int:
    """Bytes of the driver JVM's heap in use (local mode: the executors' too)."""
    jvm: Any = spark.sparkContext._jvm
    runtime = jvm.java.lang.Runtime.getRuntime()
    return int(runtime.totalMemory()) - int(runtime.freeMemory())


def generation(storage: Path) -> int:
    """The state's manifest generation: each commit adds one (0 before the state exists)."""
    from wcoj_core.store.store import Store

    if not storage.exists():
        return 0
    return Store.open(str(storage), create=False).current().generation


# -- the Dagster side -----------------------------------------------------------------------


class InstanceKind(Enum):
    """Where the bench's Dagster runs are stored: the demo's SQLite files or a Postgres server."""

    SQLITE = "sqlite"
    POSTGRES = "postgres"


@contextmanager
def bench_instance(kind: InstanceKind, root: Path, say: Say) -> Iterator[DagsterInstance]:
    """A fresh instance of `kind` with `dagster_env`'s settings in this process, for the block.

    SQLite lives in ``<root>/dagster``. Postgres gets a server of its own, started in a new
    temporary folder (under ``/tmp``, which the server's user can enter when the bench runs as
    root) and stopped and removed after, even on error.
    """
    from dagster import DagsterInstance

    from wcoj_assets.instance import dagster_settings, prepare_home, running_postgres

    if kind is InstanceKind.SQLITE:
        with dagster_settings(), DagsterInstance.from_config(str(prepare_home(root))) as instance:
            yield instance
        return
    folder = Path(tempfile.mkdtemp(prefix="wcoj-bench-postgres-"))
    try:
        with running_postgres(folder) as server:
            say(f"postgres: serving on port {server.port} from {folder}")
            with (
                dagster_settings(),
                DagsterInstance.from_config(str(server.home)) as instance,
            ):
                yield instance
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class DagsterSide:
    epoch0_seconds: float = 0.0
    range_seconds: float = 0.0
    step_seconds: dict[str, float] = field(default_factory=dict)
    epoch_seconds: dict[str, list[float]] = field(default_factory=dict)
    spark_jobs: int = 0
    manifest_commits: int = 0
    checks_passed: int = 0
    final_count: int | None = None
    events: dict[str, int] = field(default_factory=dict)
    check_seconds: dict[str, float] = field(default_factory=dict)


def step_seconds(instance: DagsterInstance, run_id: str) -> dict[str, float]:
    """Each step's seconds from its STEP_START to its STEP_SUCCESS event, in start order."""
    from dagster import DagsterEventType

    kinds = {DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS}
    started: dict[str, float] = {}
    out: dict[str, float] = {}
    for entry in instance.all_logs(run_id, of_type=kinds):
        event = entry.dagster_event
        if event is None or event.step_key is None:
            continue
        if event.event_type == DagsterEventType.STEP_START:
            started[event.step_key] = entry.timestamp
        elif event.step_key in started:
            out[event.step_key] = round(entry.timestamp - started[event.step_key], 3)
    return out


def epoch_seconds(
    result: ExecuteInProcessResult, output: str, changes: str
) -> dict[str, list[float]]:
    """Per epoch of the run, oldest first: the engine's pass (``seconds`` of the output's
    materialization of the partition, in its ``engine (internal)`` figures) and reading and
    checking the landed files (the changes' ``seconds reading``)."""
    from dagster import DagsterEventType

    from wcoj_assets.report import INTERNAL

    found: dict[str, dict[str, float]] = {"engine pass": {}, "read and check landed": {}}
    for event in result.all_events:
        if event.event_type != DagsterEventType.ASSET_MATERIALIZATION:
            continue
        m = event.event_specific_data.materialization  # type: ignore[union-attr]
        asset = m.asset_key.to_user_string()
        internal = m.metadata.get(INTERNAL)
        if internal is None or m.partition is None:
            continue
        figures: dict[str, Any] = internal.value  # type: ignore[assignment]
        if asset == output and "seconds" in figures:
            found["engine pass"][m.partition] = float(figures["seconds"])
        elif asset == changes and "seconds reading" in figures:
            found["read and check landed"][m.partition] = float(figures["seconds reading"])
    return {name: [v for _, v in sorted(by.items())] for name, by in found.items() if by}


def check_seconds(result: ExecuteInProcessResult) -> dict[str, float]:
    """Seconds the run's checks report they took, by check name (the audit, the binary join):
    from each check's result for the range (which sums its partitions'), else its partitions'."""
    from dagster import DagsterEventType

    summed: dict[str, float] = {}
    per_partition: dict[str, float] = {}
    for event in result.all_events:
        if event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
            e = event.event_specific_data
            seconds = e.metadata.get("seconds")  # type: ignore[union-attr]
            if seconds is None:
                continue
            into = summed if e.partition is None else per_partition  # type: ignore[union-attr]
            into[e.check_name] = into.get(e.check_name, 0.0) + float(seconds.value)  # type: ignore[union-attr]
    return {**per_partition, **summed}


def event_counts(result: ExecuteInProcessResult) -> dict[str, int]:
    """The run's asset materializations and check evaluations (the events counted per epoch)."""
    from dagster import DagsterEventType

    kinds = {
        DagsterEventType.ASSET_MATERIALIZATION: "materializations",
        DagsterEventType.ASSET_CHECK_EVALUATION: "check_evaluations",
    }
    found = Counter(kinds[e.event_type] for e in result.all_events if e.event_type in kinds)
    return {name: found[name] for name in kinds.values()}


def _metadata(result: ExecuteInProcessResult, asset: str, key: str, partition: str) -> Any:
    from dagster import AssetKey, DagsterEventType

    for event in result.all_events:
        if event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
            m = event.event_specific_data.materialization  # type: ignore[union-attr]
            if m.asset_key == AssetKey(asset) and m.partition == partition and key in m.metadata:
                return m.metadata[key].value
    return None


def _root_cause(error: Any) -> str:
    """The first line of the innermost cause of a Dagster step error (Spark's own message)."""
    while getattr(error, "cause", None) is not None:
        error = error.cause
    lines = [line.strip() for line in str(error.message).splitlines() if line.strip()]
    return " ".join(lines[:2])[:500]


def verify_run(result: ExecuteInProcessResult, label: str) -> int:
    """Raise `BackfillError` unless the run succeeded and every check passed; checks passed."""
    from dagster import DagsterEventType

    failed_steps = [
        f"{e.step_key}: {_root_cause(e.event_specific_data.error)}"  # type: ignore[union-attr]
        for e in result.all_events
        if e.event_type == DagsterEventType.STEP_FAILURE
    ]
    if not result.success or failed_steps:
        raise BackfillError(f"{label}: the Dagster run failed ({'; '.join(failed_steps)})")
    evaluations = [
        e.event_specific_data
        for e in result.all_events
        if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
    ]
    failed = [
        f"{c.asset_key.to_user_string()}.{c.check_name}@{c.partition}"  # type: ignore[union-attr]
        for c in evaluations
        if not c.passed  # type: ignore[union-attr]
    ]
    if failed or not evaluations:
        raise BackfillError(f"{label}: asset checks failed: {', '.join(failed) or 'none ran'}")
    return len(evaluations)


class RunWatch:
    """Prints a running Dagster run's finished steps and, every `interval` s, its stored epochs.

    Reads only the instance's event log and the state's manifest, from a thread of its own.
    """

    def __init__(
        self,
        spark: SparkSession,
        instance: DagsterInstance,
        run_id: str,
        storage: Path,
        epochs: tuple[int, int],
        say: Say,
        interval: float,
    ) -> None:
        self.spark, self.instance, self.run_id = spark, instance, run_id
        self.storage, self.epochs, self.say, self.interval = storage, epochs, say, interval
        self._stop = threading.Event()
        self._cursor: str | None = None
        self._started: dict[str, float] = {}
        self._begin = clock.perf_counter()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> RunWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()

    def _loop(self) -> None:
        last = clock.perf_counter()
        while not self._stop.wait(min(2.0, self.interval)):
            try:
                self._poll()
                if clock.perf_counter() - last >= self.interval:
                    last = clock.perf_counter()
                    self._report()
            except Exception as e:  # a manifest pruned while read, a busy event log: next tick
                self.say(f"dagster: (no progress this tick: {type(e).__name__}: {e})")

    def _poll(self) -> None:
        from dagster import DagsterEventType

        kinds = {DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS}
        found = self.instance.get_records_for_run(self.run_id, self._cursor, kinds)
        self._cursor = found.cursor
        for record in found.records:
            entry = record.event_log_entry
            event = entry.dagster_event
            if event is None or event.step_key is None:
                continue
            if event.event_type == DagsterEventType.STEP_START:
                self._started[event.step_key] = entry.timestamp
                continue
            seconds = entry.timestamp - self._started.pop(event.step_key, entry.timestamp)
            self.say(
                f"dagster: step {event.step_key} done in {seconds:.1f} s "
                f"({clock.perf_counter() - self._begin:.0f} s into the run)"
            )

    def _report(self) -> None:
        from wcoj_core.store.store import Store

        first, last = self.epochs
        manifest = Store.open(str(self.storage), create=False).current()
        stored = ", ".join(
            f"{name} {sum(1 for b in trace.batches if first <= b.time <= last)}"
            for name, trace in sorted(manifest.traces.items())
        )
        running = ", ".join(self._started) or "-"
        self.say(
            f"dagster: {clock.perf_counter() - self._begin:.0f} s, running {running}; epochs "
            f"stored of {last - first + 1}: {stored}; manifest generation {manifest.generation}"
        )


def run_dagster(
    spark: SparkSession,
    root: Path,
    epochs: int,
    say: Say,
    progress_interval: float,
    kind: InstanceKind = InstanceKind.SQLITE,
    undirected: frozenset[str] = frozenset(),
) -> tuple[DagsterSide, dict[int, Multiset], DataFrame]:
    """Epoch 0 in its own run, then one timed run over epochs ``1..epochs``, on a `kind` instance.

    Returns the figures, the pipeline's output change at each epoch ``1..epochs`` and its output
    as of epoch 0 (for the Spark comparison of the bulk load).
    """
    from wcoj_assets.definitions import JOB_NAME, build_definitions
    from wcoj_assets.demo import QUIET_RUN
    from wcoj_assets.epochs import epoch_key
    from wcoj_assets.resources import WcojResource
    from wcoj_assets.specs import DEFAULT_SPECS, Topology, deltas_asset_name

    storage = root / "pipeline-state"
    topo = Topology.of(DEFAULT_SPECS, sorted(undirected))
    query = topo.queries[0]
    defs = build_definitions(
        DEFAULT_SPECS,
        storage=str(storage),
        landing=str(root / "landing"),
        spark_master=str(spark.sparkContext.master),
        undirected=sorted(undirected),
    )
    job = defs.resolve_job_def(JOB_NAME)
    side = DagsterSide()
    with bench_instance(kind, root, say) as instance:
        say(
            f"dagster: epoch 0 (the initial graph) in its own run, untimed, in {instance.root_directory}"
        )
        start = clock.perf_counter()
        first = job.execute_in_process(
            run_config=QUIET_RUN,
            instance=instance,
            partition_key=epoch_key(0),
            raise_on_error=False,
        )
        side.epoch0_seconds = clock.perf_counter() - start
        side.checks_passed += verify_run(first, "epoch 0")
        say(f"dagster: epoch 0 done in {side.epoch0_seconds:.1f} s, checks passed")
        # A launched run has a process (and JVM) of its own; here both runs share this one, so
        # the first run's cached data is dropped before the timed run starts.
        spark.catalog.clearCache()
        gc.collect()

        say(f"dagster: ONE run over epochs 1..{epochs} ({epoch_key(1)}..{epoch_key(epochs)})")
        run_id = str(uuid.uuid4())
        jobs, commits = spark_jobs(spark), generation(storage)
        with RunWatch(spark, instance, run_id, storage, (1, epochs), say, progress_interval):
            start = clock.perf_counter()
            result = job.execute_in_process(
                run_config=QUIET_RUN,
                instance=instance,
                run_id=run_id,
                tags={RANGE_START: epoch_key(1), RANGE_END: epoch_key(epochs)},
                raise_on_error=False,
            )
            side.range_seconds = clock.perf_counter() - start
        side.spark_jobs = spark_jobs(spark) - jobs
        side.manifest_commits = generation(storage) - commits
        side.step_seconds = step_seconds(instance, run_id)
        say(
            f"dagster: the run over epochs 1..{epochs} ended after {side.range_seconds:.1f} s "
            f"({'succeeded' if result.success else 'FAILED'}); steps done: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in side.step_seconds.items())
        )
        side.checks_passed += verify_run(result, f"epochs 1..{epochs}")
        rel = next(iter(topo.relations))
        side.epoch_seconds = epoch_seconds(result, query.name, deltas_asset_name(rel))
        side.check_seconds = check_seconds(result)
        side.events = event_counts(result)
        count = _metadata(result, query.name, "count", epoch_key(epochs))
        side.final_count = None if count is None else int(count)
        say(f"dagster: epochs 1..{epochs} done in {side.range_seconds:.1f} s, checks passed")

    engine = WcojResource(master=str(spark.sparkContext.master), storage=str(storage)).engine(topo)
    changes: dict[int, Multiset] = {}
    for t in range(1, epochs + 1):
        table = engine.change(query.name, t)
        cols = [c for c in table.column_names if c != "diff"]
        rows = zip(*(table[c].to_pylist() for c in cols), table["diff"].to_pylist(), strict=True)
        changes[t] = multiset(list(rows))
    return side, changes, engine.output(query.name, 0)


# -- the floor: the same asset graph with empty bodies -------------------------------------


@dataclass
class HollowSide:
    range_seconds: float = 0.0
    events: dict[str, int] = field(default_factory=dict)


def run_hollow(
    root: Path,
    epochs: int,
    expected: Mapping[str, int],
    say: Say,
    kind: InstanceKind = InstanceKind.SQLITE,
    undirected: frozenset[str] = frozenset(),
) -> HollowSide:
    """The pipeline's runs again with empty bodies: epoch 0, then one timed run over ``1..epochs``,
    on a fresh instance of `kind`.

    Raises `BackfillError` if a run fails or the range run's events differ from `expected` (the
    real range run's): the floor must be the same bookkeeping.
    """
    from wcoj_assets.definitions import build_definitions
    from wcoj_assets.demo import QUIET_RUN
    from wcoj_assets.epochs import epoch_key
    from wcoj_assets.specs import DEFAULT_SPECS
    from wcoj_bench.hollow import HOLLOW_JOB, hollow_definitions

    real = build_definitions(DEFAULT_SPECS, undirected=sorted(undirected))
    job = hollow_definitions(real).resolve_job_def(HOLLOW_JOB)
    side = HollowSide()
    with bench_instance(kind, root / "dagster-hollow", say) as instance:
        first = job.execute_in_process(
            run_config=QUIET_RUN,
            instance=instance,
            partition_key=epoch_key(0),
            raise_on_error=False,
        )
        verify_run(first, "floor, epoch 0")
        say(f"floor: the same assets and checks with empty bodies, ONE run over 1..{epochs}")
        start = clock.perf_counter()
        result = job.execute_in_process(
            run_config=QUIET_RUN,
            instance=instance,
            tags={RANGE_START: epoch_key(1), RANGE_END: epoch_key(epochs)},
            raise_on_error=False,
        )
        side.range_seconds = clock.perf_counter() - start
    verify_run(result, f"floor, epochs 1..{epochs}")
    side.events = event_counts(result)
    if side.events != dict(expected):
        raise BackfillError(
            f"floor: the hollow run wrote {side.events}, the pipeline's run {dict(expected)}"
        )
    say(f"floor: epochs 1..{epochs} done in {side.range_seconds:.1f} s, events {side.events}")
    return side


# -- the CLI side ---------------------------------------------------------------------------


@dataclass
class CliSide:
    epoch0_seconds: float = 0.0
    seconds: list[float] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    spark_jobs: int = 0
    manifest_commits: int = 0
    final_count: int = 0


def run_cli(
    spark: SparkSession,
    root: Path,
    query: Query,
    epochs: int,
    say: Say,
    check_initial: Callable[[DataFrame], int],
    undirected: frozenset[str] = frozenset(),
) -> tuple[CliSide, dict[int, Multiset], int]:
    """Apply epoch 0 untimed, then time every epoch ``1..epochs`` with `Engine.apply_epoch`.

    `check_initial` compares the engine's output after epoch 0 and returns the tuples it
    compared. Returns the figures, the engine's output change at each timed epoch and that count.
    """
    from wcoj_core.engine import Engine

    storage, landing = root / "cli-state", root / "landing"
    engine = Engine(spark, str(storage), query, sizes={}, undirected=sorted(undirected))
    side = CliSide()
    start = clock.perf_counter()
    engine.apply_epoch(0, read_landed(spark, landing, query.relations, 0))
    side.epoch0_seconds = clock.perf_counter() - start
    say(f"cli: epoch 0 (the initial graph) applied in {side.epoch0_seconds:.1f} s, untimed")
    compared = check_initial(engine.output(query.name))
    say(f"checked: epoch 0 output identical ({compared} tuples)")
    changes: dict[int, Multiset] = {}
    commits = generation(storage)
    for t in range(1, epochs + 1):
        jobs = spark_jobs(spark)
        start = clock.perf_counter()
        result = engine.apply_epoch(t, read_landed(spark, landing, query.relations, t))
        seconds = clock.perf_counter() - start
        side.spark_jobs += spark_jobs(spark) - jobs
        side.seconds.append(seconds)
        side.paths.append(result.metrics.deployment)
        for phase, s in result.metrics.seconds.items():
            side.phase_seconds[phase] = side.phase_seconds.get(phase, 0.0) + s
        table = engine.change(query.name, t)
        cols = [c for c in table.column_names if c != "diff"]
        rows = zip(*(table[c].to_pylist() for c in cols), table["diff"].to_pylist(), strict=True)
        changes[t] = multiset(list(rows))
        say(
            f"cli: epoch {t}/{epochs}: {seconds:.3f} s (on the {result.metrics.deployment}), "
            f"output change rows {len(changes[t])}"
        )
    side.manifest_commits = generation(storage) - commits
    side.final_count = engine.count(query.name)
    return side, changes, compared


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
    from wcoj_bench.epochs import make_workload
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
