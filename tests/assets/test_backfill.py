"""Backfills: once the arrangements exist, the rules' epochs may run in any order.

The relations and arrangements of four epochs are built in ONE run over the whole range (what a
single-run backfill or ``dagster asset materialize --partition-range`` does); then the query's
assets run one epoch per run, newest first. Every output equals the oracle — the answer of
processing the epochs one by one.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from wcoj_support import Pipeline, checks, failures, materializations, oracle, updates

from wcoj_assets.epochs import epoch_key
from wcoj_assets.provenance import CURRENT

EPOCHS = 4
ARRANGEMENTS = ["edge_deltas", "edge_snapshot", "edge_counts_c0", "edge_counts_c1"]
QUERY_ASSETS = ["triangles_rule_0", "triangles_rule_1", "triangles_rule_2", "triangles_deltas"]


def test_rules_backfilled_in_reverse_order_equal_processing_in_order(
    small: SparkSession, tmp_path
) -> None:
    p = Pipeline(small, tmp_path)
    history = updates(seed=5, epochs=EPOCHS)
    for n, ups in enumerate(history):
        p.land(n, ups, "parquet" if n % 2 else "csv")

    result = p.run((0, EPOCHS - 1), assets=ARRANGEMENTS)
    assert result.success, failures(result)
    mats = materializations(result)
    # One run, one materialization per asset and epoch.
    assert sorted((m.asset_key.to_user_string(), m.partition) for m in mats) == sorted(
        (a, epoch_key(n)) for a in ARRANGEMENTS for n in range(EPOCHS)
    )
    for n in reversed(range(EPOCHS)):
        result = p.run(n, assets=QUERY_ASSETS)
        assert result.success, failures(result)
    # The accumulated output sums the stored changes: one run over the range, checked.
    result = p.run((0, EPOCHS - 1), assets=["triangles"])
    assert result.success and all(c.passed for c in checks(result)), checks(result)
    assert [c.name for c in checks(result) if c.name != CURRENT] == ["matches_binary_join"]
    # `current_history` once for the range (Dagster records a range's result without a
    # partition). The output had no partition yet, so none was stale before the run and none is
    # after: no evaluation of a partition on its own (`test_pipeline` shows the stale ones').
    assert [c.partition for c in checks(result) if c.name == CURRENT] == [None]
    for t in range(EPOCHS):
        assert p.output("triangles", t) == oracle(p.topology, "triangles", history, t), t
