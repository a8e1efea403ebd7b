"""`wcoj-bench epochs`: the same epochs through recompute, binary-delta and wcoj — checked, then timed.

The workload. Each input relation is consolidated (undirected relations reduced to their edges)
and split by a seeded hash: ``epochs * epoch_size`` tuples are picked, half of them held back
from the initial state and inserted over the epochs, the other half deleted over the epochs. So
epoch ``t`` (1-based) inserts ``epoch_size // 2`` real tuples of the input and deletes the rest
of its ``epoch_size`` (an undirected edge counts once and changes in both directions). With
`skew` ``D`` one more epoch follows in which a new vertex (its id below every other) gains ``D``
edges to the endpoints of about ``D / 2`` existing edges: a hub whose every pair of neighbours a
binary plan must consider.

The methods, each in its own folder under the state directory, each handed exactly the same
changes, each timed from receiving an epoch's changes to having written its output change and
its state for the next epoch:

* **recompute** — what a user writes by hand (and what GraphFrames' motif finding does): update
  the relations' tables, recompute the query with a plain Spark SQL binary-join plan
  (`wcoj_core.reference`), write the output. Its output change is the difference of two outputs,
  taken outside the timing.
* **binary-delta** — incremental delta rules, the same rules and the same old/new visibility as
  wcoj's, each evaluated by binary joins: the rule's SQL with atom ``i`` read from the changes,
  the atoms before it from the new and those after it from the old relation.
* **wcoj** — `Engine.apply_epoch`.

Before any time is reported every epoch's three output changes are compared as exact multisets;
one difference stops the benchmark with the differing tuples (`BenchError`).

Measured per method and epoch: wall-clock seconds, intermediate rows (the rows every join
operator of the method's Spark plans produced, from Spark's SQL metrics, plus for wcoj the rows
its keyed lookups produced outside Spark SQL, `EpochMetrics.join_rows`), shuffle bytes written
(Spark's stage metrics), and over the run the persistent state on disk and the peak resident
memory of the process tree (Spark's JVM included) while the method ran. The first epoch is a
warm-up: medians leave it out; the skew epoch is reported on its own.

Seeding without outputs (``seed_outputs=False``). Loading epoch 0 normally computes wcoj's whole
initial output, which for a large graph costs far more than the epochs measured after it. With
``seed_outputs=False`` wcoj loads epoch 0 with ``Engine.apply_epoch(..., rules=False)``: its
arrangements are built, its output is not. Every later epoch's output change is still exact (a
delta rule reads arrangements, never earlier outputs) and still checked against the other
methods. binary-delta's load only writes its tables anyway; recompute's load computes a whole
output whatever this setting, which is why the scale curves leave it out by default.
"""

from __future__ import annotations

import re
import shutil
import statistics
import threading
import time as clock
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from wcoj_core.engine import Engine, output_trace_name
from wcoj_core.errors import WcojError
from wcoj_core.query.ir import Query
from wcoj_core.reference import compare, reference_sql
from wcoj_core.sources import canonical_undirected
from wcoj_core.updates import DIFF, consolidate, relation_columns, update_schema

METHODS = ("recompute", "binary-delta", "wcoj")
JOIN_NODE = re.compile(r"Join|CartesianProduct")


class BenchError(WcojError):
    """A benchmark that cannot run (too small an input) or whose methods disagree."""


# -- the workload ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Workload:
    """The initial relations (epoch 0) and each epoch's changes (epochs 1..), as Spark
    DataFrames and, the same rows already on the driver, as Arrow tables."""

    initial: dict[str, DataFrame]
    epochs: list[dict[str, DataFrame]]
    epoch_size: int
    skew_epoch: int | None  # the 1-based number of the skew epoch, if any
    tables: list[dict[str, pa.Table]] = field(default_factory=lambda: [])

    def changes(self, t: int) -> dict[str, DataFrame]:
        return self.epochs[t - 1]

    def changes_table(self, t: int) -> dict[str, pa.Table]:
        return self.tables[t - 1]


def make_workload(
    spark: SparkSession,
    query: Query,
    relations: Mapping[str, DataFrame],
    *,
    epochs: int,
    epoch_size: int,
    seed: int = 1,
    undirected: frozenset[str] = frozenset(),
    skew: int | None = None,
) -> Workload:
    """Split every relation into an initial state and `epochs` epochs of changes (see above)."""
    if epochs < 2:
        raise BenchError(f"a benchmark needs at least 2 epochs (one is a warm-up), got {epochs}")
    if epoch_size < 2:
        raise BenchError(f"an epoch needs at least 2 changes, got {epoch_size}")
    initial: dict[str, DataFrame] = {}
    per_epoch: list[dict[str, DataFrame]] = [{} for _ in range(epochs)]
    tables: list[dict[str, pa.Table]] = [{} for _ in range(epochs)]
    for rel in sorted(query.relations):
        cols = relation_columns(query.relations[rel])
        base, changes = _split(
            spark, relations[rel], cols, epochs, epoch_size, seed, rel in undirected
        )
        initial[rel] = base
        for t, rows in enumerate(changes):
            per_epoch[t][rel] = spark.createDataFrame(rows, update_schema(cols, with_time=False))
            tables[t][rel] = _table(cols, rows)
    skew_epoch = None
    if skew:
        rel = _skew_relation(query, undirected)
        hub = _hub_changes(spark, initial[rel], skew, seed)
        empty = {
            r: spark.createDataFrame([], update_schema(relation_columns(a), with_time=False))
            for r, a in query.relations.items()
        }
        per_epoch.append(
            {**empty, rel: spark.createDataFrame(hub, update_schema(["c0", "c1"], with_time=False))}
        )
        tables.append(
            {
                **{r: _table(relation_columns(a), []) for r, a in query.relations.items()},
                rel: _table(["c0", "c1"], hub),
            }
        )
        skew_epoch = len(per_epoch)
    return Workload(initial, per_epoch, epoch_size, skew_epoch, tables)


def _table(cols: Sequence[str], rows: Sequence[tuple[int, ...]]) -> pa.Table:
    """Change rows (data, diff) as an Arrow table of longs."""
    names = [*cols, DIFF]
    return pa.table({n: pa.array([r[i] for r in rows], pa.int64()) for i, n in enumerate(names)})


def _split(
    spark: SparkSession,
    df: DataFrame,
    cols: list[str],
    epochs: int,
    size: int,
    seed: int,
    undirected: bool,
) -> tuple[DataFrame, list[list[tuple[int, ...]]]]:
    base = canonical_undirected(df) if undirected else consolidate(df, cols)
    inserts = size // 2
    deletes = size - inserts
    wanted = epochs * size
    ranked = base.withColumn("_h", F.xxhash64(F.lit(seed), *cols)).orderBy("_h", *cols)
    picked = [tuple(r[c] for c in (*cols, DIFF)) for r in ranked.limit(wanted).collect()]
    if len(picked) < wanted:
        raise BenchError(
            f"{epochs} epochs of {size} changes need {wanted} distinct tuples; "
            f"the input has {len(picked)}"
        )
    held, gone = picked[: epochs * inserts], picked[epochs * inserts :]
    schema = update_schema(cols, with_time=False)
    held_df = spark.createDataFrame(held, schema)
    initial = base.join(F.broadcast(held_df.select(*cols)), cols, "left_anti")
    changes = []
    for t in range(epochs):
        rows = held[t * inserts : (t + 1) * inserts]
        rows += [(*r[:-1], -r[-1]) for r in gone[t * deletes : (t + 1) * deletes]]
        changes.append(_both_ways(rows) if undirected else rows)
    return (_symmetric(initial) if undirected else initial), changes


def _both_ways(rows: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    return rows + [(b, a, d) for a, b, d in rows]


def _symmetric(df: DataFrame) -> DataFrame:
    return df.unionByName(df.select(F.col("c1").alias("c0"), F.col("c0").alias("c1"), DIFF))


def _skew_relation(query: Query, undirected: frozenset[str]) -> str:
    binary = sorted(r for r, arity in query.relations.items() if arity == 2)
    if not binary:
        raise BenchError("the skew epoch adds edges to a binary relation; the query has none")
    preferred = [r for r in binary if r in undirected]
    return (preferred or binary)[0]


def _hub_changes(
    spark: SparkSession, initial: DataFrame, degree: int, seed: int
) -> list[tuple[int, ...]]:
    """A new vertex joined to `degree` vertices: the endpoints of existing edges, both ways.

    The hub's id is below every other, so with the usual ``a < b < c`` orientation it is the
    first vertex of each of its triangles: the one a binary plan joins on.
    """
    low = initial.agg(F.min(F.least("c0", "c1")).alias("m")).first()
    hub = int(low["m"] or 0) - 1 if low is not None else -1
    ranked = initial.where(F.col("c0") < F.col("c1")).orderBy(
        F.xxhash64(F.lit(seed + 1), "c0", "c1"), "c0", "c1"
    )
    neighbours: list[int] = []
    seen: set[int] = set()
    for row in ranked.toLocalIterator():
        for v in (row["c0"], row["c1"]):
            if v not in seen and len(neighbours) < degree:
                seen.add(v)
                neighbours.append(v)
        if len(neighbours) >= degree:
            break
    if len(neighbours) < degree:
        raise BenchError(
            f"a hub of degree {degree} needs as many vertices; the input has {len(neighbours)}"
        )
    return _both_ways([(hub, v, 1) for v in neighbours])


# -- measuring ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    seconds: float
    intermediate_rows: int
    shuffle_bytes: int


class SparkMeter:
    """Join output rows and shuffle bytes of the Spark work done since a mark.

    Reads Spark's own status stores (the data behind its UI, kept whether or not the UI runs):
    every SQL execution's plan graph and metric values, every stage's shuffle write bytes.
    """

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._sql = spark._jsparkSession.sharedState().statusStore()  # type: ignore[attr-defined]
        self._app = spark.sparkContext._jsc.sc().statusStore()  # type: ignore[union-attr]

    def mark(self) -> tuple[int, int]:
        return self._last_execution(), self._last_stage()

    def since(self, mark: tuple[int, int]) -> tuple[int, int]:
        execution, stage = mark
        return self._join_rows(execution), self._shuffle_bytes(stage)

    def _executions(self) -> Iterator[Any]:
        found = self._sql.executionsList()
        for i in range(found.size()):
            yield found.apply(i)

    def _last_execution(self) -> int:
        return max((int(e.executionId()) for e in self._executions()), default=-1)

    def _join_rows(self, after: int) -> int:
        total = 0
        for e in self._executions():
            eid = e.executionId()
            if int(eid) <= after:
                continue
            values = self._sql.executionMetrics(eid)
            nodes = self._sql.planGraph(eid).allNodes()
            for j in range(nodes.size()):
                node = nodes.apply(j)
                if not JOIN_NODE.search(str(node.name())):
                    continue
                metrics = node.metrics()
                for k in range(metrics.size()):
                    metric = metrics.apply(k)
                    if str(metric.name()) == "number of output rows":
                        value = values.get(metric.accumulatorId())
                        if value.isDefined():
                            total += int(re.sub(r"[^0-9]", "", str(value.get())) or 0)
        return total

    def _stages(self) -> Iterator[Any]:
        gateway: Any = self.spark.sparkContext._gateway
        jvm: Any = gateway.jvm
        no_quantiles = gateway.new_array(jvm.double, 0)
        found = self._app.stageList(
            jvm.java.util.ArrayList(), False, False, no_quantiles, jvm.java.util.ArrayList()
        )
        for i in range(found.size()):
            yield found.apply(i)

    def _last_stage(self) -> int:
        return max((int(s.stageId()) for s in self._stages()), default=-1)

    def _shuffle_bytes(self, after: int) -> int:
        return sum(int(s.shuffleWriteBytes()) for s in self._stages() if int(s.stageId()) > after)


class MemoryWatch:
    """Peak resident memory of this process and its children (Spark's JVM), per label; and of
    the largest Spark Python worker on this machine (``pyspark.daemon`` processes: a local
    cluster's executors are not this process's children), per label too."""

    def __init__(self, interval: float = 0.2) -> None:
        self.peaks: dict[str, int] = {}
        self.worker_peaks: dict[str, int] = {}
        self._label: str | None = None
        self._stop = threading.Event()
        self._interval = interval
        try:
            import psutil  # pyright: ignore[reportMissingModuleSource]
        except ImportError:  # the bench extra is not installed: no memory figures
            self._process = None
            return
        self._psutil = psutil
        self._process = psutil.Process()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        assert self._process is not None
        total = 0
        for p in [self._process, *self._process.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except Exception:  # a child that just ended
                continue
        return total

    def _worker_rss(self) -> int:
        largest = 0
        for p in self._psutil.process_iter(["cmdline", "memory_info"]):
            try:
                if "pyspark.daemon" in " ".join(p.info["cmdline"] or ()):
                    largest = max(largest, p.info["memory_info"].rss)
            except Exception:  # a process that just ended
                continue
        return largest

    def _sample(self, label: str) -> None:
        self.peaks[label] = max(self.peaks.get(label, 0), self._rss())
        self.worker_peaks[label] = max(self.worker_peaks.get(label, 0), self._worker_rss())

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            label = self._label
            if label is not None:
                self._sample(label)

    @contextmanager
    def watching(self, label: str) -> Iterator[None]:
        self._label = label
        try:
            yield
        finally:
            if self._process is not None:
                self._sample(label)
            self._label = None

    def close(self) -> None:
        self._stop.set()


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# -- the methods ------------------------------------------------------------------------------


class Method:
    """One way of keeping the query's output: load epoch 0, apply epochs, report changes."""

    name = ""

    def __init__(self, spark: SparkSession, query: Query, root: Path) -> None:
        self.spark = spark
        self.query = query
        self.root = root / self.name
        self.root.mkdir(parents=True)
        self.out_cols = relation_columns(len(query.head))
        # Rows the last `apply` joined outside Spark SQL, where `SparkMeter` cannot see them.
        self.lookup_rows = 0

    def load(self, initial: Mapping[str, DataFrame]) -> None:
        raise NotImplementedError

    def apply(
        self, t: int, changes: Mapping[str, DataFrame], tables: Mapping[str, pa.Table]
    ) -> None:
        """Apply epoch `t`: its changes as DataFrames (cached) or the same rows as Arrow tables
        on the driver, whichever the method takes."""
        raise NotImplementedError

    def change(self, t: int) -> DataFrame:
        """The output change of epoch `t` (c0.., diff), from what `apply` wrote."""
        raise NotImplementedError

    def state_bytes(self) -> int:
        return folder_bytes(self.root)

    # Tables the SQL methods keep: one Parquet folder per relation and epoch, the previous one
    # removed once the next is written.
    def _write(self, df: DataFrame, kind: str, name: str, t: int) -> DataFrame:
        path = self.root / kind / name / str(t)
        df.write.parquet(str(path))
        previous = self.root / kind / name / str(t - 1)
        if kind == "rel" and previous.exists():
            shutil.rmtree(previous)
        return self.spark.read.parquet(str(path))

    def _table(self, kind: str, name: str, t: int) -> DataFrame:
        return self.spark.read.parquet(str(self.root / kind / name / str(t)))

    def _sql(
        self,
        sources: Mapping[str, DataFrame],
        table: Callable[[int, str], str],
        start: int | None = None,
    ) -> DataFrame:
        return self.spark.sql(reference_sql(self.query, table, start), None, **sources)


class Recompute(Method):
    name = "recompute"

    def load(self, initial: Mapping[str, DataFrame]) -> None:
        for rel, df in initial.items():
            self._write(consolidate(df, relation_columns(self.query.relations[rel])), "rel", rel, 0)
        self._output(0)

    def _output(self, t: int) -> None:
        tables = {f"r_{rel}": self._table("rel", rel, t) for rel in self.query.relations}
        self._write(self._sql(tables, lambda _i, rel: f"r_{rel}"), "out", "full", t)
        previous = self.root / "out" / "full" / str(t - 2)
        if previous.exists():  # keep the last two outputs: their difference is the change
            shutil.rmtree(previous)

    def apply(
        self, t: int, changes: Mapping[str, DataFrame], tables: Mapping[str, pa.Table]
    ) -> None:
        for rel in self.query.relations:
            cols = relation_columns(self.query.relations[rel])
            old = self._table("rel", rel, t - 1)
            self._write(consolidate(old.unionByName(changes[rel]), cols), "rel", rel, t)
        self._output(t)

    def change(self, t: int) -> DataFrame:
        new = self._table("out", "full", t)
        old = self._table("out", "full", t - 1).select(*self.out_cols, (-F.col(DIFF)).alias(DIFF))
        return consolidate(new.unionByName(old), self.out_cols)


class BinaryDelta(Method):
    name = "binary-delta"

    def load(self, initial: Mapping[str, DataFrame]) -> None:
        for rel, df in initial.items():
            self._write(consolidate(df, relation_columns(self.query.relations[rel])), "rel", rel, 0)

    def apply(
        self, t: int, changes: Mapping[str, DataFrame], tables: Mapping[str, pa.Table]
    ) -> None:
        old = {rel: self._table("rel", rel, t - 1) for rel in self.query.relations}
        new = {rel: old[rel].unionByName(changes[rel]) for rel in self.query.relations}
        sources = {
            **{f"old_{r}": df for r, df in old.items()},
            **{f"new_{r}": df for r, df in new.items()},
            **{f"delta_{r}": df for r, df in changes.items()},
        }
        rules = []
        for i, atom in enumerate(self.query.atoms):
            if changes[atom.relation].isEmpty():
                continue

            def table(j: int, rel: str, i: int = i) -> str:
                return f"new_{rel}" if j < i else (f"delta_{rel}" if j == i else f"old_{rel}")

            rules.append(self._sql(sources, table, start=i))
        if rules:
            total = rules[0]
            for r in rules[1:]:
                total = total.unionByName(r)
            out = consolidate(total, self.out_cols)
        else:
            out = self.spark.createDataFrame([], update_schema(self.out_cols, with_time=False))
        self._write(out, "out", "change", t)
        for rel in self.query.relations:
            cols = relation_columns(self.query.relations[rel])
            self._write(consolidate(new[rel], cols), "rel", rel, t)

    def change(self, t: int) -> DataFrame:
        return self._table("out", "change", t)


class Wcoj(Method):
    name = "wcoj"

    def __init__(
        self,
        spark: SparkSession,
        query: Query,
        root: Path,
        *,
        seed_outputs: bool = True,
        deployment: str = "auto",
    ) -> None:
        super().__init__(spark, query, root)
        self.engine = Engine(spark, str(self.root / "engine"), query, deployment=deployment)
        self.seed_outputs = seed_outputs
        self.deployments: list[str] = []  # where each epoch's kernel ran

    def load(self, initial: Mapping[str, DataFrame]) -> None:
        self.engine.apply_epoch(0, dict(initial), rules=self.seed_outputs)

    def apply(
        self, t: int, changes: Mapping[str, DataFrame], tables: Mapping[str, pa.Table]
    ) -> None:
        # The rows are on the driver already: the engine takes them as Arrow tables.
        result = self.engine.apply_epoch(t, dict(tables))
        self.lookup_rows = result.metrics.join_rows
        self.deployments.append(result.metrics.deployment)

    def change(self, t: int) -> DataFrame:
        store = self.engine.store
        trace = store.current().trace(output_trace_name(self.query.name))
        assert trace is not None
        batches = [b for b in trace.batches if b.time == t]
        return consolidate(store.read(trace, batches).drop("time"), self.out_cols)

    def arrangement_bytes(self) -> int:
        """The state without the output's own trace: the arrangements of the inputs."""
        manifest = self.engine.store.current()
        total = 0
        for name, trace in manifest.traces.items():
            if name.startswith("out/"):
                continue
            for b in trace.batches:
                total += folder_bytes(self.root / "engine" / b.path)
        return total


# -- the run ----------------------------------------------------------------------------------


@dataclass
class MethodResult:
    name: str
    samples: dict[int, Sample] = field(default_factory=dict)
    state_bytes: int = 0
    peak_rss_bytes: int | None = None
    peak_worker_rss_bytes: int | None = None

    def timed(self, skip: Sequence[int]) -> list[Sample]:
        return [s for t, s in sorted(self.samples.items()) if t not in skip]

    def to_dict(self, skip: Sequence[int]) -> dict[str, Any]:
        timed = self.timed(skip)
        return {
            "median_seconds": round(statistics.median(s.seconds for s in timed), 3),
            "seconds_per_epoch": [round(s.seconds, 3) for _, s in sorted(self.samples.items())],
            "intermediate_rows": sum(s.intermediate_rows for s in timed),
            "intermediate_rows_per_epoch": [
                s.intermediate_rows for _, s in sorted(self.samples.items())
            ],
            "shuffle_bytes": sum(s.shuffle_bytes for s in timed),
            "state_bytes": self.state_bytes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "peak_worker_rss_bytes": self.peak_worker_rss_bytes,
        }


@dataclass
class BenchResult:
    query: str
    epochs: int
    epoch_size: int
    input_parquet_bytes: int
    methods: dict[str, MethodResult]
    output_change_rows: list[int]
    skew_epoch: int | None
    arrangement_bytes: int
    seed_outputs: bool = True
    wcoj_deployments: tuple[str, ...] = ()  # where wcoj's kernel ran, epoch by epoch

    @property
    def warm_up_and_skew(self) -> list[int]:
        return [1] + ([self.skew_epoch] if self.skew_epoch else [])

    def median(self, method: str) -> float:
        return statistics.median(
            s.seconds for s in self.methods[method].timed(self.warm_up_and_skew)
        )

    def to_dict(self) -> dict[str, Any]:
        skip = self.warm_up_and_skew
        out: dict[str, Any] = {
            "command": "bench",
            "query": self.query,
            "epochs": self.epochs,
            "epoch_size": self.epoch_size,
            "check": "passed",
            "input_parquet_bytes": self.input_parquet_bytes,
            "wcoj_arrangement_bytes": self.arrangement_bytes,
            "state_ratio_vs_input": round(
                self.arrangement_bytes / max(1, self.input_parquet_bytes), 3
            ),
            "output_change_rows": self.output_change_rows,
            "seed_outputs": self.seed_outputs,
            "wcoj_deployments": sorted(set(self.wcoj_deployments)),
            "methods": {name: m.to_dict(skip) for name, m in self.methods.items()},
        }
        wcoj = self.median("wcoj")
        if "recompute" in self.methods:
            out["speedup_vs_recompute"] = round(self.median("recompute") / wcoj, 3)
        if "binary-delta" in self.methods:
            out["speedup_vs_binary_delta"] = round(self.median("binary-delta") / wcoj, 3)
            mine = sum(s.intermediate_rows for s in self.methods["wcoj"].timed(skip))
            theirs = sum(s.intermediate_rows for s in self.methods["binary-delta"].timed(skip))
            out["intermediate_ratio_vs_binary_delta"] = round(theirs / max(1, mine), 3)
        if self.skew_epoch:
            t = self.skew_epoch
            skew = {name: m.samples[t] for name, m in self.methods.items()}
            out["skew"] = {
                "epoch": t,
                **{
                    name: {"seconds": round(s.seconds, 3), "intermediate_rows": s.intermediate_rows}
                    for name, s in skew.items()
                },
            }
            if "binary-delta" in skew:
                b, w = skew["binary-delta"], skew["wcoj"]
                out["skew"]["speedup_vs_binary_delta"] = round(b.seconds / w.seconds, 3)
                out["skew"]["intermediate_ratio_vs_binary_delta"] = round(
                    b.intermediate_rows / max(1, w.intermediate_rows), 3
                )
        return out


CLASSES: dict[str, type[Method]] = {
    "recompute": Recompute,
    "binary-delta": BinaryDelta,
    "wcoj": Wcoj,
}


def bench(
    spark: SparkSession,
    query: Query,
    workload: Workload,
    state_dir: str,
    *,
    methods: Sequence[str] = METHODS,
    on_epoch: Callable[[int, int, dict[str, Sample], int], None] | None = None,
    seed_outputs: bool = True,
    deployment: str = "auto",
) -> BenchResult:
    """Run every method over the workload, epoch by epoch, checking each epoch's output change.

    ``seed_outputs=False`` loads wcoj's epoch 0 without computing its output (see above);
    `deployment` says where wcoj's kernel runs (see `wcoj_core.deploy`).
    """
    if "wcoj" not in methods:
        raise BenchError("the benchmark compares the other methods with wcoj; include it")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise BenchError(f"unknown methods {unknown}; choose from {list(METHODS)}")
    root = Path(state_dir)
    inputs = root / "input"
    for rel, df in workload.initial.items():
        df.write.parquet(str(inputs / rel))
    input_bytes = folder_bytes(inputs)
    runners = [
        Wcoj(spark, query, root, seed_outputs=seed_outputs, deployment=deployment)
        if m == "wcoj"
        else CLASSES[m](spark, query, root)
        for m in methods
    ]
    results = {m.name: MethodResult(m.name) for m in runners}
    meter = SparkMeter(spark)
    watch = MemoryWatch()
    try:
        for m in runners:
            m.load(workload.initial)
        changes_rows: list[int] = []
        for t in range(1, len(workload.epochs) + 1):
            changes = {rel: df.cache() for rel, df in workload.changes(t).items()}
            tables = workload.changes_table(t)
            for df in changes.values():
                df.count()
            samples: dict[str, Sample] = {}
            for m in runners:
                mark = meter.mark()
                with watch.watching(m.name):
                    start = clock.perf_counter()
                    m.apply(t, changes, tables)
                    seconds = clock.perf_counter() - start
                rows, shuffled = meter.since(mark)
                samples[m.name] = Sample(seconds, rows + m.lookup_rows, shuffled)
                results[m.name].samples[t] = samples[m.name]
            changes_rows.append(_check_epoch(t, runners, query))
            for df in changes.values():
                df.unpersist()
            if on_epoch is not None:
                on_epoch(t, len(workload.epochs), samples, changes_rows[-1])
        for m in runners:
            results[m.name].state_bytes = m.state_bytes()
            results[m.name].peak_rss_bytes = watch.peaks.get(m.name)
            results[m.name].peak_worker_rss_bytes = watch.worker_peaks.get(m.name)
    finally:
        watch.close()
    wcoj = next(m for m in runners if isinstance(m, Wcoj))
    return BenchResult(
        query=query.name,
        epochs=len(workload.epochs) - (1 if workload.skew_epoch else 0),
        epoch_size=workload.epoch_size,
        input_parquet_bytes=input_bytes,
        methods=results,
        output_change_rows=changes_rows,
        skew_epoch=workload.skew_epoch,
        arrangement_bytes=wcoj.arrangement_bytes(),
        seed_outputs=seed_outputs,
        wcoj_deployments=tuple(wcoj.deployments),
    )


def _check_epoch(t: int, runners: Sequence[Method], query: Query) -> int:
    """Compare every method's output change with wcoj's; return its row count."""
    cols = relation_columns(len(query.head))
    wcoj = next(m for m in runners if isinstance(m, Wcoj))
    mine = wcoj.change(t).cache()
    try:
        for other in runners:
            if other is wcoj:
                continue
            found = compare(other.change(t), mine, cols)
            if not found.equal:
                examples = "; ".join(
                    f"{tup}: {other.name} {e}, wcoj {a}" for tup, e, a in found.examples
                )
                raise BenchError(
                    f"epoch {t}: {found.mismatches} output tuples differ between "
                    f"{other.name} and wcoj ({examples})"
                )
        return mine.count()
    finally:
        mine.unpersist()


__all__ = [
    "METHODS",
    "BenchError",
    "BenchResult",
    "Sample",
    "SparkMeter",
    "Workload",
    "bench",
    "make_workload",
]
