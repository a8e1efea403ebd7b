"""The only place that builds a SparkSession.

`session()` returns the active session if there is one (so tests, Dagster resources and the CLI
share a single JVM per process) and otherwise builds one for the given master. Local mode is the
embedded default; pass ``spark://host:port`` (or any master URL) to run the same code on a
cluster.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"

# Settings that suit per-epoch jobs on small deltas: few shuffle partitions (AQE coalesces
# further), UTC, no UI port to collide with, and a driver big enough for a million-edge graph.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "6g",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.sources.partitionOverwriteMode": "static",
    "spark.sql.parquet.compression.codec": "zstd",
}


def session(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    app_name: str = "wcoj",
) -> SparkSession:
    """Return the active SparkSession, or build one for `master` (default ``local[*]``)."""
    active = SparkSession.getActiveSession()
    if active is not None and (master is None or active.sparkContext.master == master):
        return active
    builder = SparkSession.builder.appName(app_name).master(master or DEFAULT_MASTER)
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
