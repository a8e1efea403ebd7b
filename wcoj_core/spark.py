"""The only place that builds a SparkSession.

`session()` returns the active session if there is one (so tests, Dagster resources and the CLI
share a single JVM per process) and otherwise builds one for the given master. Local mode is the
embedded default; pass ``spark://host:port`` (or any master URL) to run the same code on a
cluster.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from wcoj_core.fence import lift_pandas_fence

lift_pandas_fence()  # Spark work is coming: pyspark's Arrow conversions import pandas
from pyspark.sql import SparkSession  # noqa: E402

from wcoj_core.deploy.daemon import DAEMON_MODULE  # noqa: E402
from wcoj_core.memory import keep_freed_memory  # noqa: E402

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


# Console logging for command-line runs: errors only, and no "default log level" banner.
QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
logger.spark.name = org.apache.spark
logger.spark.level = error
# A task that fails on a bad input file logs its Java stack trace here; the driver raises the same
# failure, which the CLI reports in one line.
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = off
"""


def cluster_defaults(master: str | None) -> dict[str, str]:
    """Settings a master needs: local mode's and a ``spark://`` cluster's Python workers run this
    interpreter, forked from a daemon that has imported the kernel already
    (`wcoj_core.deploy.daemon`), and a cluster on this machine (127.0.0.1 or localhost) reaches
    the driver on the loopback address.

    >>> cluster_defaults("spark://127.0.0.1:7077")["spark.driver.host"]
    '127.0.0.1'
    >>> cluster_defaults("local[2]")["spark.python.daemon.module"]
    'wcoj_core.deploy.daemon'
    >>> cluster_defaults("yarn")
    {}
    """
    # Local mode's Python workers run this interpreter too (the kernel runs in them).
    settings = {
        "spark.pyspark.python": sys.executable,
        "spark.python.daemon.module": DAEMON_MODULE,
    }
    if not master or master.startswith("local"):
        return settings
    if not master.startswith("spark://"):
        return {}
    hosts = {h.rsplit(":", 1)[0] for h in master.removeprefix("spark://").split(",")}
    if hosts <= {"127.0.0.1", "localhost"}:
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    return settings


def active_session(master: str | None = None) -> SparkSession | None:
    """The active session when there is one (for `master`, when given)."""
    active = SparkSession.getActiveSession()
    if active is not None and (master is None or active.sparkContext.master == master):
        return active
    return None


def session(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    app_name: str = "wcoj",
    quiet: bool = False,
) -> SparkSession:
    """Return the active SparkSession, or build one for `master` (default ``local[*]``).

    ``quiet=True`` starts the JVM with a log configuration that prints errors only (it has no
    effect on a session that is already running).
    """
    keep_freed_memory()  # before any thread allocates (see `wcoj_core.memory`)
    active = SparkSession.getActiveSession()
    if active is not None and (master is None or active.sparkContext.master == master):
        return active
    settings = {**DEFAULT_CONF, **cluster_defaults(master), **(conf or {})}
    if "spark.pyspark.python" in settings:
        # PySpark starts its Python workers with $PYSPARK_PYTHON (default: `python3` on the PATH,
        # which need not have pyarrow or wcoj): the kernel runs in them.
        os.environ.setdefault("PYSPARK_PYTHON", settings["spark.pyspark.python"])
    config = None
    if quiet and "spark.driver.extraJavaOptions" not in settings:
        fd, config = tempfile.mkstemp(prefix="wcoj-log4j2-", suffix=".properties")
        with os.fdopen(fd, "w") as handle:
            handle.write(QUIET_LOG4J2)
        settings["spark.driver.extraJavaOptions"] = (
            f"-Dlog4j2.configurationFile={Path(config).as_uri()}"
        )
    builder = SparkSession.builder.appName(app_name).master(master or DEFAULT_MASTER)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    finally:
        if config is not None:
            os.unlink(config)
    spark.sparkContext.setLogLevel("ERROR")
    return spark
