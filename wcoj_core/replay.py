"""Replaying a relation as epochs of changes, and checking the result against a static run.

`epoch_stream` turns a consolidated relation into update triples: each tuple inserted at an
epoch from a seeded ``xxhash64`` of it, a `delete_fraction` of them deleted at a later hashed
epoch (a pure function of ``(seed, tuple)``: the same under any partitioning); ``undirected``
draws per undirected edge. `replay` writes the stream to Parquet under the state directory
(``stream/<relation>/time=<t>``), feeds it epoch by epoch to a fresh `Engine` (``engine/``),
reports each epoch through `on_epoch` and, when asked, compares the final output with a static
run in ``check-*/`` as exact multisets. `check_parameters` checks the numbers without Spark:

>>> check_parameters(4, 0.25, 7)
>>> check_parameters(0, 0.0, 1)
Traceback (most recent call last):
  ...
wcoj_core.replay.ReplayError: the number of epochs must be at least 1, got 0
>>> check_parameters(3, 1.5, 1)
Traceback (most recent call last):
  ...
wcoj_core.replay.ReplayError: the delete fraction must be between 0 and 1, got 1.5
"""

from __future__ import annotations

import statistics
import tempfile
import time as clock
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from wcoj_core.engine import Engine, EpochMetrics, EpochResult
from wcoj_core.errors import InputError, QueryError, StateError, WcojError, listed
from wcoj_core.input_spark import canonical_undirected
from wcoj_core.meaning import RelationSpec
from wcoj_core.query.ir import Query
from wcoj_core.traces import DIFF, TIME, output_trace_name, relation_columns
from wcoj_core.updates import consolidate, update_schema

# Salts keep the three draws about one tuple independent of each other.
_INSERT_SALT, _DELETE_SALT, _REMOVAL_SALT = 1, 2, 3
_U53 = float(1 << 53)
_MIN_LONG, _MAX_LONG = -(2**63), 2**63 - 1


class ReplayError(WcojError):
    """Replay parameters that cannot describe a stream (no epochs, a fraction outside [0, 1])."""


class CheckOutcome(Enum):
    """What the comparison with a static recomputation found."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class EpochReport:
    """One applied epoch, as `replay` hands it to its `on_epoch` callback."""

    epoch: int
    epochs: int
    changes: int  # consolidated change rows staged over all relations
    output_changes: int  # rows of the query's output change at this epoch
    seconds: float  # wall-clock time of the whole `Engine.apply` call
    result: EpochResult

    @property
    def metrics(self) -> EpochMetrics:
        return self.result.metrics


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """The outcome of a replay: per-epoch metrics, the final count and the check."""

    query: str
    metrics: tuple[EpochMetrics, ...]
    seconds_per_epoch: tuple[float, ...]
    final_count: int
    check: CheckOutcome
    mismatches: int | None  # tuples whose multiplicities differ; None when the check was skipped
    groups: int | None = None  # an aggregate query's groups at the end (its final count: the sum)

    @property
    def epochs(self) -> int:
        return len(self.metrics)

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds_per_epoch) if self.seconds_per_epoch else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "epochs": self.epochs,
            "final_count": self.final_count,
            "check": self.check.value,
            "mismatches": self.mismatches,
            "seconds_per_epoch": [round(s, 3) for s in self.seconds_per_epoch],
            "median_seconds": round(self.median_seconds, 3),
            "epoch_metrics": [m.to_dict() for m in self.metrics],
            **({} if self.groups is None else {"groups": self.groups, "total": self.final_count}),
        }


def check_parameters(epochs: int, delete_fraction: float, seed: int) -> None:
    """Raise `ReplayError` unless the parameters describe a stream."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ReplayError(f"the number of epochs must be at least 1, got {epochs!r}")
    if not (isinstance(delete_fraction, int | float) and 0.0 <= delete_fraction <= 1.0):
        raise ReplayError(f"the delete fraction must be between 0 and 1, got {delete_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not _MIN_LONG <= seed <= _MAX_LONG:
        raise ReplayError(f"the seed must be a 64-bit integer, got {seed!r}")


def _draw(seed: int, salt: int, data: list[Column]) -> Column:
    """A 64-bit hash of the tuple, distinct per seed and salt."""
    return F.xxhash64(F.lit(seed).cast("long"), F.lit(salt).cast("long"), *data)


def _below(hashed: Column, bound: Column) -> Column:
    """A draw uniform over ``[0, bound)`` (bias ``bound / 2**64``, which is negligible)."""
    return F.pmod(hashed, bound.cast("long")).cast("long")


def epoch_stream(
    relation: DataFrame,
    epochs: int,
    delete_fraction: float,
    seed: int,
    *,
    undirected: bool = False,
) -> DataFrame:
    """The relation as update triples spread over `epochs` epochs (see the module contract):
    one Spark projection, each tuple's insert and (maybe) its later deletion inlined from an
    array of two rows, the deletion null where it is not drawn."""
    check_parameters(epochs, delete_fraction, seed)
    base = canonical_undirected(relation) if undirected else relation
    cols = [c for c in base.columns if c not in (TIME, DIFF)]
    distinct = consolidate(base.select(*cols, DIFF), cols)
    data = [F.col(c) for c in cols]
    inserted = _below(_draw(seed, _INSERT_SALT, data), F.lit(epochs))

    def row(time: Column, diff: Column) -> list[Column]:
        longs = [*data, time, diff]
        return [c.cast("long").alias(n) for c, n in zip(longs, [*cols, TIME, DIFF], strict=True)]

    insert = row(inserted, F.col(DIFF))
    if epochs == 1 or delete_fraction == 0:
        return distinct.select(*insert)
    later = F.lit(epochs - 1) - inserted  # epochs strictly after the insert
    unit = F.shiftrightunsigned(_draw(seed, _DELETE_SALT, data), 11).cast("double") / _U53
    chosen = (unit < F.lit(float(delete_fraction))) & (later > 0)
    # greatest(.., 1) keeps pmod away from zero on rows that are not chosen anyway.
    removed = inserted + 1 + _below(_draw(seed, _REMOVAL_SALT, data), F.greatest(later, F.lit(1)))
    deletion = row(removed, F.col(DIFF) * F.lit(-1).cast("long"))
    both = F.array(F.when(F.lit(True), F.struct(*insert)), F.when(chosen, F.struct(*deletion)))
    return distinct.select(F.inline(F.filter(both, lambda s: s.isNotNull()))).select(
        *cols, TIME, DIFF
    )


def _stream_columns(query: Query, rel: str, df: DataFrame) -> list[str]:
    cols = relation_columns(query.relations[rel])
    expected = [*cols, TIME, DIFF]
    if sorted(df.columns) != sorted(expected):
        raise InputError(
            f"an update stream needs the columns {expected}, got {listed(df.columns)}",
            f"relation {rel!r}",
        )
    return cols


def _write_streams(
    spark: SparkSession, query: Query, inputs: Mapping[str, DataFrame], root: Path
) -> dict[str, DataFrame]:
    """Write each stream once, partitioned by time; return readers over the written files."""
    stored: dict[str, DataFrame] = {}
    for rel, df in sorted(inputs.items()):
        cols = _stream_columns(query, rel, df)
        path = str(root / "stream" / rel)
        ordered = df.select(*[F.col(c).cast("long") for c in (*cols, TIME, DIFF)])
        ordered.repartition(TIME).write.mode("overwrite").partitionBy(TIME).parquet(path)
        # The schema is given, so an empty stream (no partition written) reads as empty.
        stored[rel] = spark.read.schema(update_schema(cols)).parquet(path)
    return stored


def _mismatches(
    spark: SparkSession,
    query: Query,
    streams: Mapping[str, DataFrame],
    incremental: DataFrame,
    root: Path,
    deployment: str,
    specs: Mapping[str, RelationSpec] | None,
) -> int:
    """Tuples whose multiplicity differs between `incremental` and a static recomputation."""
    finals = {
        rel: consolidate(df.drop(TIME), relation_columns(query.relations[rel]))
        for rel, df in streams.items()
    }
    cols = relation_columns(len(query.head))
    with tempfile.TemporaryDirectory(prefix="check-", dir=root) as scratch:
        engine = Engine(spark, scratch, query, relations=specs, deployment=deployment)
        engine.persist_index = False
        engine.apply(0, finals)
        static = engine.output(query.name)
        negated = static.select(*cols, (-F.col(DIFF)).alias(DIFF))
        difference = consolidate(incremental.select(*cols, DIFF).unionByName(negated), cols)
        return difference.count()


def replay(
    spark: SparkSession,
    query: Query,
    inputs: Mapping[str, DataFrame],
    epochs: int,
    state_dir: str,
    *,
    check: bool = False,
    on_epoch: Callable[[EpochReport], None] | None = None,
    deployment: str = "auto",
    specs: Mapping[str, RelationSpec] | None = None,
    memory: Any = None,
) -> ReplayResult:
    """Apply the update streams in `inputs` (every relation of `query`, times in ``[0, epochs)``)
    epoch by epoch to a new engine; `deployment` and `memory` as `wcoj_core.deploy` and
    `wcoj_core.budget.MemoryBudget.of` take them."""
    check_parameters(epochs, 0.0, 0)
    missing = sorted(set(query.relations) - set(inputs))
    unused = sorted(set(inputs) - set(query.relations))
    if missing or unused:
        raise QueryError(
            f"replay of {query.name} needs a stream for exactly its relations "
            f"{sorted(query.relations)}; missing {missing}, not used {unused}"
        )
    root = Path(state_dir)
    engine = Engine(
        spark, str(root / "engine"), query, relations=specs, deployment=deployment, memory=memory
    )
    if engine.epoch is not None:
        raise StateError(
            f"{root / 'engine'} already holds epochs up to {engine.epoch}; "
            "a replay needs a new or empty state directory"
        )
    streams = _write_streams(spark, query, inputs, root)
    metrics: list[EpochMetrics] = []
    seconds: list[float] = []
    for t in range(epochs):
        changes = {
            rel: df.where(F.col(TIME) == F.lit(t).cast("long")).select(
                *relation_columns(query.relations[rel]), DIFF
            )
            for rel, df in streams.items()
        }
        start = clock.perf_counter()
        result = engine.apply(t, changes)
        elapsed = clock.perf_counter() - start
        metrics.append(result.metrics)
        seconds.append(elapsed)
        if on_epoch is not None:
            on_epoch(
                EpochReport(
                    epoch=t,
                    epochs=epochs,
                    changes=sum(result.metrics.changes.values()),
                    output_changes=result.metrics.outputs.get(query.name, 0),
                    seconds=elapsed,
                    result=result,
                )
            )
    final = engine.output(query.name)
    final_count = engine.count(query.name)
    outcome, mismatches = CheckOutcome.SKIPPED, None
    if check:
        mismatches = _mismatches(spark, query, streams, final, root, deployment, specs)
        outcome = CheckOutcome.PASSED if mismatches == 0 else CheckOutcome.FAILED
    return ReplayResult(
        query=query.name,
        metrics=tuple(metrics),
        seconds_per_epoch=tuple(seconds),
        final_count=final_count,
        check=outcome,
        mismatches=mismatches,
        groups=None
        if query.aggregate is None
        else engine.figures(output_trace_name(query.name))[0],
    )
