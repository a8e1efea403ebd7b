"""Spark's Python daemon with the kernel already imported, so a new Python worker starts warm.

Spark forks its Python workers from one daemon and ends a worker idle for about a minute; the
stock daemon imports almost nothing before it forks, so each new worker imports numpy, pyarrow,
pandas and the kernel itself. This one imports them once, before it forks (selected with
``spark.python.daemon.module`` by `wcoj_core.spark.cluster_defaults`; a user's setting wins),
after applying ``spark.executor.pyspark.memory`` (`limit_memory`). If the imports fail it says
so on stderr and goes on as the stock one. Forking after them is safe: OpenBLAS and jemalloc
handle fork and no other thread runs when the daemon forks
(`test_the_daemon_preloads_without_starting_threads`).
"""

from __future__ import annotations

import os
import sys

# This module's name, for ``spark.python.daemon.module`` (run as ``-m``, `__name__` is "__main__").
DAEMON_MODULE = "wcoj_core.deploy.daemon"

# What a worker imports for the kernel's tasks, in the order a task would.
PRELOAD = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "numpy",
    "pyarrow",
    "wcoj_core.deploy.executors",
)


def preload() -> None:
    """Import what a kernel task needs, and run one Arrow-to-numpy conversion (pyarrow imports
    pandas on the first one)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    import pyarrow as pa

    pa.table({"x": [1, 2]}).column(0).to_numpy()


def limit_memory() -> None:
    """Apply ``spark.executor.pyspark.memory`` (``PYSPARK_EXECUTOR_MEMORY_MB``) before
    preloading, as pyspark's worker does before its imports, so forked workers find the limit
    set."""
    megabytes = int(os.environ.get("PYSPARK_EXECUTOR_MEMORY_MB", "-1"))
    if megabytes > 0:
        from pyspark.worker_util import setup_memory_limits

        setup_memory_limits(megabytes)


def main() -> None:
    try:
        limit_memory()
        preload()
    except Exception as exc:  # the stock daemon's behaviour is the fallback, not a failure
        print(f"wcoj daemon: not preloading ({type(exc).__name__}: {exc})", file=sys.stderr)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
