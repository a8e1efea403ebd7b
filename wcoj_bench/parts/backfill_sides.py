"""The three sides of the backfill benchmark (`wcoj_bench.parts.backfill`): the Dagster
pipeline's single run over a range of epochs, the same asset graph with empty bodies (the
floor), and the CLI's engine over the same landed files; the Dagster instance each runs on, the
landing, and the checks that the sides agree.
"""

from __future__ import annotations

import gc
import shutil
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

    from wcoj_bench.parts.epochs import Workload
    from wcoj_core.query.ir import Query

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"

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
    wcoj_bench.parts.backfill_sides.BackfillError: epoch 3: 2 output tuple(s) differ between the Dagster pipeline and the engine: (1, 2, 3): pipeline 1, engine 2; (2, 3, 4): pipeline 0, engine -1
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
    wcoj_bench.parts.backfill_sides.BackfillError: epoch 2: the engine has an output change, the Dagster pipeline none
    """
    for t in sorted(set(pipeline) ^ set(engine)):
        has, lacks = ("engine", "Dagster pipeline")[:: 1 if t in engine else -1]
        raise BackfillError(f"epoch {t}: the {has} has an output change, the {lacks} none")
    return sum(compare_changes(t, pipeline[t], engine[t]) for t in sorted(engine))


# -- landing --------------------------------------------------------------------------------


def land(spark: SparkSession, workload: Workload, landing: Path) -> list[str]:
    """Publish epoch 0 (the initial relations) and every epoch's changes as landing folders."""
    from pyspark.sql import functions as F

    from wcoj_assets.landing_write import write_epochs
    from wcoj_core.traces import TIME

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
    (`wcoj_assets.landing_read.read_epoch`: local files by pyarrow, Spark only for remote or very
    large ones)."""
    from wcoj_assets.epochs import epoch_key
    from wcoj_assets.landing_read import read_epoch

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

    from wcoj_assets.instance import dagster_settings, prepare_home
    from wcoj_bench.infra.postgres import running_postgres

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


def hollow_range(
    job: Any, instance: DagsterInstance, epochs: int
) -> tuple[ExecuteInProcessResult, float, float]:
    """The hollow job's epoch 0, then one timed run over ``1..epochs`` on `instance`: the range
    run's result, wall seconds and this process's CPU seconds (both runs verified)."""
    from wcoj_assets.demo import QUIET_RUN
    from wcoj_assets.epochs import epoch_key

    first = job.execute_in_process(
        run_config=QUIET_RUN, instance=instance, partition_key=epoch_key(0), raise_on_error=False
    )
    verify_run(first, "floor, epoch 0")
    start, cpu = clock.perf_counter(), clock.process_time()
    result = job.execute_in_process(
        run_config=QUIET_RUN,
        instance=instance,
        tags={RANGE_START: epoch_key(1), RANGE_END: epoch_key(epochs)},
        raise_on_error=False,
    )
    seconds, cpu = clock.perf_counter() - start, clock.process_time() - cpu
    verify_run(result, f"floor, epochs 1..{epochs}")
    return result, seconds, cpu


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
    from wcoj_assets.specs import DEFAULT_SPECS
    from wcoj_bench.infra.hollow import HOLLOW_JOB, hollow_definitions

    real = build_definitions(DEFAULT_SPECS, undirected=sorted(undirected))
    job = hollow_definitions(real).resolve_job_def(HOLLOW_JOB)
    side = HollowSide()
    with bench_instance(kind, root / "dagster-hollow", say) as instance:
        say(f"floor: the same assets and checks with empty bodies, ONE run over 1..{epochs}")
        result, side.range_seconds, _ = hollow_range(job, instance, epochs)
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
    """Apply epoch 0 untimed, then time every epoch ``1..epochs`` with `Engine.apply`.

    `check_initial` compares the engine's output after epoch 0 and returns the tuples it
    compared. Returns the figures, the engine's output change at each timed epoch and that count.
    """
    from wcoj_core.engine import Engine

    storage, landing = root / "cli-state", root / "landing"
    engine = Engine(spark, str(storage), query, sizes={}, undirected=sorted(undirected))
    side = CliSide()
    start = clock.perf_counter()
    engine.apply(0, read_landed(spark, landing, query.relations, 0))
    side.epoch0_seconds = clock.perf_counter() - start
    say(f"cli: epoch 0 (the initial graph) applied in {side.epoch0_seconds:.1f} s, untimed")
    compared = check_initial(engine.output(query.name))
    say(f"checked: epoch 0 output identical ({compared} tuples)")
    changes: dict[int, Multiset] = {}
    commits = generation(storage)
    for t in range(1, epochs + 1):
        jobs = spark_jobs(spark)
        start = clock.perf_counter()
        result = engine.apply(t, read_landed(spark, landing, query.relations, t))
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
