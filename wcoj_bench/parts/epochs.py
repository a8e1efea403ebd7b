"""`wcoj-bench epochs`: the same epochs through recompute, binary-delta and wcoj — checked, then timed.

The workload (`wcoj_bench.infra.workload`): the input split into an initial state and epochs that each
insert half of their changes (tuples held back from the initial state) and delete the other half,
and optionally a skew epoch (a new hub vertex).

What each method is handed. An undirected relation means the same thing to every method: the
set of its edges, each present in both directions (``--undirected``, the product's default
meaning). The Spark SQL methods keep it as that symmetric table and get each epoch's changes in
both directions (their binary plans run over the symmetric set); wcoj declares the relation an
undirected set and gets each changed edge once, in a seeded random direction, as a user's file
names it — the engine reads it in both directions itself. `wcoj-bag` is wcoj with the relation
declared an undirected bag (the same changes; over a graph whose edges are each named once the
outputs are identical), to show what the set's bookkeeping costs.

The methods, each in its own folder under the state directory, each timed from receiving an
epoch's changes to having written its output change and its state for the next epoch:

* **recompute** — what a user writes by hand (and what GraphFrames' motif finding does): update
  the relations' tables, recompute the query with a plain Spark SQL binary-join plan
  (`wcoj_core.reference`), write the output. Its output change is the difference of two outputs,
  taken outside the timing.
* **binary-delta** — incremental delta rules, the same rules and the same old/new visibility as
  wcoj's, each evaluated by binary joins: the rule's SQL with atom ``i`` read from the changes,
  the atoms before it from the new and those after it from the old relation.
* **wcoj** (and **wcoj-bag**) — `Engine.apply`, the changes given as Arrow tables.

Before any time is reported every epoch's output changes are compared as exact multisets (on the
driver, `wcoj_bench.infra.measure.compare_changes`); one difference stops the benchmark with the
differing tuples (`BenchError`).

Measured per method and epoch: wall-clock seconds, intermediate rows (the rows every join
operator of the method's Spark plans produced, from Spark's SQL metrics, plus for wcoj the rows
its kernel's lookups produced, `EpochMetrics.join_rows`), shuffle bytes written (Spark's stage
metrics), and over the run the persistent state on disk and the peak resident memory of the
process tree (Spark's JVM included) while the method ran. The first epoch is a warm-up: medians
leave it out; the skew epoch is reported on its own.

Loading. Every method loads epoch 0 untimed. wcoj loads it on the driver (whatever deployment
its epochs use) in epochs of at most `LOAD_ROWS` tuples each (a graph of 20 M edges is loaded as
five epochs; the timed epochs follow them), computing its whole initial output: the engine has
no way to load a state without deriving it.
"""

from __future__ import annotations

import shutil
import statistics
import time as clock
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from wcoj_bench.infra.measure import (
    BenchError,
    MemoryWatch,
    Sample,
    SparkMeter,
    change_arrays,
    compare_changes,
    folder_bytes,
)
from wcoj_bench.infra.workload import Workload, make_workload
from wcoj_core.engine import Engine
from wcoj_core.meaning import Meaning, RelationSpec, relation_specs
from wcoj_core.query.ir import Query
from wcoj_core.reference import reference_sql
from wcoj_core.traces import DIFF, output_trace_name, relation_columns
from wcoj_core.updates import consolidate, update_schema

METHODS = ("recompute", "binary-delta", "wcoj", "wcoj-bag")
# The most tuples wcoj loads in one epoch (an undirected edge counts once, changes twice): the
# driver's epoch budget (`wcoj_core.deploy.DRIVER_EPOCH_ROWS`) with room to spare.
LOAD_ROWS = 4_000_000

__all__ = [
    "METHODS",
    "BenchError",
    "BenchResult",
    "Sample",
    "Workload",
    "bench",
    "make_workload",
]


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

    def load(self, initial: Mapping[str, DataFrame], folder: Path) -> None:
        """Load epoch 0: the relations as DataFrames over their Parquet files in `folder`."""
        raise NotImplementedError

    def apply(
        self, t: int, changes: Mapping[str, DataFrame], tables: Mapping[str, pa.Table]
    ) -> None:
        """Apply epoch `t`: its changes as DataFrames (cached) or as Arrow tables on the driver,
        whichever the method takes."""
        raise NotImplementedError

    def change(self, t: int) -> DataFrame:
        """The output change of epoch `t` (c0.., diff), from what `apply` wrote."""
        raise NotImplementedError

    def arrays(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The output change of epoch `t` on the driver, as (rows, diffs)."""
        return change_arrays(self.change(t).toArrow(), self.out_cols)

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

    def load(self, initial: Mapping[str, DataFrame], folder: Path) -> None:
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

    def load(self, initial: Mapping[str, DataFrame], folder: Path) -> None:
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
    """The engine, each relation declared as the workload means it (see the module)."""

    name = "wcoj"
    meaning = Meaning.SET

    def __init__(
        self,
        spark: SparkSession,
        query: Query,
        root: Path,
        *,
        undirected: frozenset[str] = frozenset(),
        deployment: str = "auto",
    ) -> None:
        super().__init__(spark, query, root)
        self.state = str(self.root / "engine")
        self.specs = specs_for(query, undirected, self.meaning)
        self.deployment = deployment
        self.undirected = undirected
        self.engine: Engine | None = None
        self.offset = 0  # the engine's epoch of the bench's epoch 0 (the last load epoch)
        self.deployments: list[str] = []  # where each epoch's kernel ran
        self.results: dict[int, Any] = {}

    def load(self, initial: Mapping[str, DataFrame], folder: Path) -> None:
        """Load the relations' Parquet files on the driver, in epochs of at most `LOAD_ROWS`
        tuples (an undirected relation's edges each once)."""
        chunks: dict[str, list[pa.Table]] = {}
        for rel in initial:
            table = pq.read_table(str(folder / rel))
            if rel in self.undirected:
                low = table.column("c0").to_numpy() < table.column("c1").to_numpy()
                table = table.filter(pa.array(low))
            chunks[rel] = [
                table.slice(i, LOAD_ROWS) for i in range(0, max(1, table.num_rows), LOAD_ROWS)
            ]
        loads = max(len(c) for c in chunks.values())
        loader = Engine(
            self.spark, self.state, self.query, relations=self.specs, deployment="driver"
        )
        for t in range(loads):
            loader.apply(t, {rel: c[t] for rel, c in chunks.items() if t < len(c)})
        self.offset = loads - 1
        # The timed engine is made after the load: its plan sees the relations' sizes.
        self.engine = Engine(
            self.spark, self.state, self.query, relations=self.specs, deployment=self.deployment
        )

    def apply(
        self, t: int, changes: Mapping[str, DataFrame], tables: Mapping[str, pa.Table]
    ) -> None:
        assert self.engine is not None
        result = self.engine.apply(self.offset + t, dict(tables))
        self.lookup_rows = result.metrics.join_rows
        self.deployments.append(result.metrics.deployment)
        self.results[t] = result

    def arrays(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        assert self.engine is not None
        found = self.results[t].changes.get(self.query.name)
        if found is not None:
            return found
        table = self.engine.change(self.query.name, self.offset + t)
        return change_arrays(table, self.out_cols)

    def arrangement_bytes(self) -> tuple[int, int]:
        """The state without the output's own trace: (Parquet batch bytes, index file bytes)."""
        assert self.engine is not None
        manifest = self.engine.store.current()
        batches = index = 0
        for name, trace in manifest.traces.items():
            if name == output_trace_name(self.query.name):
                continue
            batches += sum(f.size for b in trace.batches for f in b.files)
            if trace.index is not None:
                index += sum(f.size for s in trace.index.segments for f in s.files.values())
        return batches, index


class WcojBag(Wcoj):
    name = "wcoj-bag"
    meaning = Meaning.BAG


def specs_for(
    query: Query, undirected: frozenset[str], meaning: Meaning
) -> dict[str, RelationSpec]:
    """Every relation's spec: the undirected ones with `meaning`, the others bags (the
    engine's default)."""
    undirected_used = [r for r in sorted(undirected) if r in query.relations]
    bags = undirected_used if meaning is Meaning.BAG else []
    return relation_specs(dict(query.relations), undirected=undirected_used, bags=bags)


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
            "median_seconds": round(statistics.median(s.seconds for s in timed), 4),
            "seconds_per_epoch": [round(s.seconds, 4) for _, s in sorted(self.samples.items())],
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
    batch_bytes: int
    index_bytes: int
    load_epochs: int = 1
    wcoj_deployments: tuple[str, ...] = ()  # where wcoj's kernel ran, epoch by epoch
    meanings: dict[str, str] = field(default_factory=dict)

    @property
    def warm_up_and_skew(self) -> list[int]:
        return [1] + ([self.skew_epoch] if self.skew_epoch else [])

    def median(self, method: str) -> float:
        return statistics.median(
            s.seconds for s in self.methods[method].timed(self.warm_up_and_skew)
        )

    def to_dict(self) -> dict[str, Any]:
        skip = self.warm_up_and_skew
        arrangements = self.batch_bytes + self.index_bytes
        out: dict[str, Any] = {
            "command": "bench",
            "query": self.query,
            "epochs": self.epochs,
            "epoch_size": self.epoch_size,
            "check": "passed",
            "meanings": self.meanings,
            "input_parquet_bytes": self.input_parquet_bytes,
            "wcoj_arrangement_bytes": arrangements,
            "wcoj_batch_bytes": self.batch_bytes,
            "wcoj_index_bytes": self.index_bytes,
            "state_ratio_vs_input": round(arrangements / max(1, self.input_parquet_bytes), 3),
            "output_change_rows": self.output_change_rows,
            "load_epochs": self.load_epochs,
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
        if "wcoj-bag" in self.methods:
            out["set_over_bag"] = round(wcoj / self.median("wcoj-bag"), 3)
        if self.skew_epoch:
            t = self.skew_epoch
            skew = {name: m.samples[t] for name, m in self.methods.items()}
            out["skew"] = {
                "epoch": t,
                **{
                    name: {"seconds": round(s.seconds, 4), "intermediate_rows": s.intermediate_rows}
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
}


def check_methods(methods: Sequence[str], what: str = "the benchmark") -> tuple[str, ...]:
    """The methods to run, in order, wcoj among them (`what` compares them with it)."""
    chosen = tuple(dict.fromkeys(m.strip() for m in methods if m.strip()))
    unknown = [m for m in chosen if m not in METHODS]
    if unknown:
        raise BenchError(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    if "wcoj" not in chosen:
        raise BenchError(f"{what} compares the other methods with wcoj; include it")
    return chosen


def bench(
    spark: SparkSession,
    query: Query,
    workload: Workload,
    state_dir: str,
    *,
    methods: Sequence[str] = METHODS,
    on_epoch: Callable[[int, int, dict[str, Sample], int], None] | None = None,
    deployment: str = "auto",
) -> BenchResult:
    """Run every method over the workload, epoch by epoch, checking each epoch's output change;
    `deployment` says where wcoj's kernel runs (see `wcoj_core.deploy`)."""
    chosen = check_methods(methods)
    root = Path(state_dir)
    inputs = root / "input"
    for rel, df in workload.initial.items():
        df.write.parquet(str(inputs / rel))
    input_bytes = folder_bytes(inputs)
    frames = {rel: spark.read.parquet(str(inputs / rel)) for rel in workload.initial}
    runners: list[Method] = []
    for m in chosen:
        if m in ("wcoj", "wcoj-bag"):
            kind = Wcoj if m == "wcoj" else WcojBag
            runners.append(
                kind(spark, query, root, undirected=workload.undirected, deployment=deployment)
            )
        else:
            runners.append(CLASSES[m](spark, query, root))
    results = {m.name: MethodResult(m.name) for m in runners}
    meter = SparkMeter(spark)
    watch = MemoryWatch()
    try:
        for m in runners:
            m.load(frames, inputs)
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
            changes_rows.append(check_epoch(t, runners))
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
    wcoj = next(m for m in runners if isinstance(m, Wcoj) and m.name == "wcoj")
    batches, index = wcoj.arrangement_bytes()
    return BenchResult(
        query=query.name,
        epochs=len(workload.epochs) - (1 if workload.skew_epoch else 0),
        epoch_size=workload.epoch_size,
        input_parquet_bytes=input_bytes,
        methods=results,
        output_change_rows=changes_rows,
        skew_epoch=workload.skew_epoch,
        batch_bytes=batches,
        index_bytes=index,
        load_epochs=wcoj.offset + 1,
        wcoj_deployments=tuple(wcoj.deployments),
        meanings={
            m.name: ", ".join(f"{r} {s.describe()}" for r, s in m.specs.items())
            for m in runners
            if isinstance(m, Wcoj)
        },
    )


def check_epoch(t: int, runners: Sequence[Method]) -> int:
    """Compare every method's output change with wcoj's, as exact multisets; its row count."""
    wcoj = next(m for m in runners if m.name == "wcoj")
    mine = wcoj.arrays(t)
    for other in runners:
        if other is wcoj:
            continue
        found = compare_changes(other.arrays(t), mine)
        if not found.equal:
            examples = "; ".join(
                f"{tup}: {other.name} {e}, wcoj {a}" for tup, e, a in found.examples
            )
            raise BenchError(
                f"epoch {t}: {found.mismatches} output tuples differ between "
                f"{other.name} and wcoj ({examples})"
            )
    return len(mine[1])
