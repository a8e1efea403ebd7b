"""Spark's Python daemon with the kernel already imported, so a new Python worker starts warm.

An executor starts its Python workers by forking them from one daemon process, which lives as
long as the executor. Spark ends a worker that has been idle for about a minute (a timeout
hard-coded in its worker factory), so an epoch that arrives later meets a new worker. The
stock daemon (`pyspark.daemon`) imports almost nothing before it forks: each new worker then
imports pyspark's worker, numpy, pyarrow, the kernel and (through pyarrow's first conversion to
numpy) pandas before its task does any work (docs/benchmarks.md, "Epochs minutes apart on the
cluster"). This daemon does those imports once, before it forks; a new worker inherits them.

A worker maps the state's arrangement files where the state keeps them (`wcoj_core.indexes`),
pages the previous worker read still in the page cache; with this daemon, a worker that replaces
an ended one costs a fork and the opening of those files (`wcoj-bench idle` measures it).

A memory limit set with ``spark.executor.pyspark.memory`` is applied to the daemon before its
imports (`limit_memory`), so a worker has the address space a stock worker would have under it.

Spark selects it with ``spark.python.daemon.module`` (`wcoj_core.spark.cluster_defaults` sets
it where the workers run this interpreter; a user's own setting wins). If the imports fail, the
daemon says so on stderr and goes on as the stock one: workers then import what they need
themselves, as before.

Forking after these imports: pyspark imports its worker module after the fork because some
libraries start threads on import. These do: numpy's OpenBLAS starts its thread pool, pyarrow's
jemalloc a background thread. Both libraries handle fork (OpenBLAS stops its pool around it,
jemalloc re-initializes in the child), and no other thread is running when the daemon forks: it
is a single loop that accepts and forks, and pandas and the conversion below start none
(`test_the_daemon_preloads_without_starting_threads` counts them).
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
    """Apply ``spark.executor.pyspark.memory`` (which Spark hands the daemon and its workers as
    ``PYSPARK_EXECUTOR_MEMORY_MB``) before preloading, as pyspark's worker does before its own
    imports: the libraries reserve their address space under the same limit a stock worker
    would, and a worker forked from here finds the limit already set."""
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
