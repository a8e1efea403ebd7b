"""The update-triple contract and the general linear operator, on Spark, as exact multisets."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from wcoj_core import linear
from wcoj_core.updates import accumulate, compact, consolidate

Triple = tuple[tuple[int, ...], int, int]


def frame(spark: SparkSession, triples: list[Triple]) -> DataFrame:
    return spark.createDataFrame(
        [(a, b, t, d) for (a, b), t, d in triples], "c0 long, c1 long, time long, diff long"
    )


def triples(df: DataFrame) -> Counter[tuple[tuple[int, ...], int]]:
    """(data, time) -> summed diff, zeros dropped: the meaning of an update stream."""
    out: Counter[tuple[tuple[int, ...], int]] = Counter()
    data = [c for c in df.columns if c not in ("time", "diff")]
    for row in df.collect():
        out[(tuple(row[c] for c in data), row["time"])] += row["diff"]
    return Counter({k: v for k, v in out.items() if v})


STREAM = st.lists(
    st.tuples(
        st.tuples(st.integers(0, 3), st.integers(0, 3)), st.integers(0, 3), st.integers(-2, 2)
    ),
    max_size=12,
)


def test_consolidate_accumulate_compact(small: SparkSession) -> None:
    ups = [((1, 2), 0, 1), ((1, 2), 0, 1), ((1, 2), 1, -2), ((2, 3), 1, 1), ((3, 4), 2, 5)]
    df = frame(small, ups)
    assert sorted(map(tuple, consolidate(df).collect())) == [
        (1, 2, 0, 2),
        (1, 2, 1, -2),
        (2, 3, 1, 1),
        (3, 4, 2, 5),
    ]
    assert sorted(map(tuple, accumulate(df, 0).collect())) == [(1, 2, 2)]
    assert sorted(map(tuple, accumulate(df, 1, strict=True).collect())) == [(1, 2, 2)]
    assert sorted(map(tuple, accumulate(df, 1).collect())) == [(2, 3, 1)]
    # Compaction to 1 merges times 0 and 1 (the (1,2) updates cancel) and keeps time 2.
    assert sorted(map(tuple, compact(df, 1).collect())) == [(2, 3, 1, 1), (3, 4, 2, 5)]


@given(STREAM)
def test_symmetrize_is_linear_and_drops_loops(small: SparkSession, stream: list[Triple]) -> None:
    out = triples(linear.symmetrize().apply(frame(small, stream)))
    expected: Counter = Counter()
    for (a, b), t, d in stream:
        if a != b:
            expected[((a, b), t)] += d
            expected[((b, a), t)] += d
    assert out == Counter({k: v for k, v in expected.items() if v})


def test_a_chain_fuses_into_one_projection(small: SparkSession) -> None:
    chain = (
        linear.filter_(lambda r: r["c0"] < r["c1"], "lt")
        .then(linear.map_(lambda r: {"c0": r["c1"], "c1": r["c0"] + 10}, "swap"))
        .then(
            linear.explode(lambda r: [(r, F.lit(3)), ({"c0": r["c0"], "c1": r["c0"]}, F.lit(-1))])
        )
    )
    df = frame(small, [((1, 2), 0, 1), ((2, 1), 0, 1), ((0, 5), 3, 2)])
    result = chain.apply(df)
    assert triples(result) == Counter(
        {
            ((2, 11), 0): 3,
            ((2, 2), 0): -1,
            ((5, 10), 3): 6,
            ((5, 5), 3): -2,
        }
    )
    # One projection (with one generator) over the scan, whatever the length of the chain.
    plan = result._jdf.queryExecution().optimizedPlan().toString()
    assert plan.count("Generate") == 1
    assert plan.count("Filter") <= 1


def test_validity_window_emits_at_the_later_time(small: SparkSession) -> None:
    df = small.createDataFrame(
        [(7, 2, 5, 0, 1), (8, 0, 1, 3, 2)], "c0 long, start long, end long, time long, diff long"
    )
    out = triples(linear.validity("start", "end").apply(df))
    # (7) counts from 2 until 5; (8) arrives at 3 after its window already closed: +2 and -2
    # land at the same time and cancel.
    assert out == Counter({((7,), 2): 1, ((7,), 5): -1})


def test_flat_map_and_identity(small: SparkSession) -> None:
    df = frame(small, [((1, 2), 0, 1)])
    dup = linear.flat_map(lambda r: [dict(r), {"c0": r["c1"], "c1": r["c0"]}])
    assert triples(linear.identity().then(dup).apply(df)) == Counter(
        {((1, 2), 0): 1, ((2, 1), 0): 1}
    )
