"""The update-triple contract on Spark: `consolidate` as exact multisets."""

from __future__ import annotations

from pyspark.sql import SparkSession

from wcoj_core.updates import consolidate


def test_consolidate_sums_equal_data_and_time_and_drops_zeros(small: SparkSession) -> None:
    ups = [(1, 2, 0, 1), (1, 2, 0, 1), (1, 2, 1, -2), (2, 3, 1, 1), (3, 4, 2, 5), (3, 4, 2, -5)]
    df = small.createDataFrame(ups, "c0 long, c1 long, time long, diff long")
    assert sorted(map(tuple, consolidate(df).collect())) == [
        (1, 2, 0, 2),
        (1, 2, 1, -2),
        (2, 3, 1, 1),
    ]
    # Without a time column it sums per data.
    assert sorted(map(tuple, consolidate(df.drop("time")).collect())) == [(2, 3, 1)]
