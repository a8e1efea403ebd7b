"""The epochs the in-process benchmarks run: an initial state and epochs of changes, from any input.

Each input relation is consolidated (an undirected relation reduced to the set of its edges) and
split by a seeded hash: ``epochs * epoch_size`` tuples are picked, half of them held back from
the initial state and inserted over the epochs, the other half deleted over the epochs. So epoch
``t`` (1-based) inserts ``epoch_size // 2`` real tuples of the input and deletes the rest of its
``epoch_size`` (an undirected edge counts once). With `skew` ``D`` one more epoch follows in
which a new vertex (its id below every other) gains ``D`` edges to the endpoints of about
``D / 2`` existing edges: a hub whose every pair of neighbours a binary plan must consider.

The same changes come in two forms (`Workload`): as Spark DataFrames, an undirected relation in
both directions (the symmetric set a Spark SQL method keeps), and as Arrow tables on the driver,
an undirected edge once, in a seeded random direction, as a user's file names it (what wcoj is
handed: the engine reads an undirected relation in both directions itself).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from wcoj_bench.infra.measure import BenchError
from wcoj_core.input_spark import canonical_undirected
from wcoj_core.query.ir import Query
from wcoj_core.traces import DIFF, relation_columns
from wcoj_core.updates import consolidate, update_schema

__all__ = ["Workload", "make_workload"]


@dataclass(frozen=True, slots=True)
class Workload:
    """The initial relations (epoch 0) and each epoch's changes (epochs 1..) as Spark DataFrames
    (an undirected relation in both directions), and the same changes as Arrow tables on the
    driver (an undirected edge once, in a seeded random direction), for wcoj."""

    initial: dict[str, DataFrame]
    epochs: list[dict[str, DataFrame]]
    epoch_size: int
    skew_epoch: int | None  # the 1-based number of the skew epoch, if any
    tables: list[dict[str, pa.Table]] = field(default_factory=lambda: [])
    undirected: frozenset[str] = frozenset()

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
    flips = random.Random(seed)
    for rel in sorted(query.relations):
        cols = relation_columns(query.relations[rel])
        both = rel in undirected
        base, changes = _split(spark, relations[rel], cols, epochs, epoch_size, seed, both)
        initial[rel] = base
        for t, rows in enumerate(changes):
            per_epoch[t][rel] = _frame(spark, cols, _both_ways(rows) if both else rows)
            tables[t][rel] = _table(cols, _once(rows, flips) if both else rows)
    skew_epoch = None
    if skew:
        rel = _skew_relation(query, undirected)
        hub = _hub_changes(initial[rel], skew, seed)
        empty = {r: [] for r in query.relations}
        per_epoch.append(
            {
                **{r: _frame(spark, relation_columns(a), []) for r, a in query.relations.items()},
                rel: _frame(spark, ["c0", "c1"], _both_ways(hub)),
            }
        )
        tables.append(
            {
                **{r: _table(relation_columns(query.relations[r]), v) for r, v in empty.items()},
                rel: _table(["c0", "c1"], hub),
            }
        )
        skew_epoch = len(per_epoch)
    return Workload(initial, per_epoch, epoch_size, skew_epoch, tables, frozenset(undirected))


def _frame(spark: SparkSession, cols: Sequence[str], rows: Sequence[tuple[int, ...]]) -> DataFrame:
    return spark.createDataFrame(list(rows), update_schema(cols, with_time=False))


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
    """The initial relation (symmetric when undirected) and each epoch's changes (an undirected
    edge once, as ``(low, high)``)."""
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
        changes.append(rows)
    return (_symmetric(initial) if undirected else initial), changes


def _both_ways(rows: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    return [*rows, *((b, a, d) for a, b, d in rows)]


def _once(rows: Sequence[tuple[int, ...]], flips: random.Random) -> list[tuple[int, ...]]:
    """Each undirected edge once, in a random direction."""
    return [(a, b, d) if flips.random() < 0.5 else (b, a, d) for a, b, d in rows]


def _symmetric(df: DataFrame) -> DataFrame:
    return df.unionByName(df.select(F.col("c1").alias("c0"), F.col("c0").alias("c1"), DIFF))


def _skew_relation(query: Query, undirected: frozenset[str]) -> str:
    binary = sorted(r for r, arity in query.relations.items() if arity == 2)
    if not binary:
        raise BenchError("the skew epoch adds edges to a binary relation; the query has none")
    preferred = [r for r in binary if r in undirected]
    return (preferred or binary)[0]


def _hub_changes(initial: DataFrame, degree: int, seed: int) -> list[tuple[int, ...]]:
    """A new vertex joined to `degree` vertices, the endpoints of existing edges: each edge once.

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
    return [(hub, v, 1) for v in neighbours]
