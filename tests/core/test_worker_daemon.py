"""Spark's Python workers fork from wcoj's daemon, which has imported the kernel already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from wcoj_core.deploy import daemon
from wcoj_core.deploy.daemon import DAEMON_MODULE

PROBE = """
import json, os, sys
def threads():
    return len(os.listdir("/proc/self/task"))
import numpy, pyarrow  # the two libraries that start threads on import
before = threads()
from wcoj_core.deploy.daemon import PRELOAD, preload
preload()
print(json.dumps({"before": before, "after": threads(),
                  "loaded": [m for m in (*PRELOAD, "pandas") if m in sys.modules]}))
"""


def test_the_daemon_preloads_without_starting_threads() -> None:
    """Every module a kernel task needs is imported (pandas too, through pyarrow's first
    conversion), and no thread is started beyond numpy's and pyarrow's own on import: the
    daemon forks with no other thread running."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    seen = json.loads(done.stdout)
    assert seen["after"] == seen["before"], seen
    assert seen["loaded"] == [*daemon.PRELOAD, "pandas"]


def test_spark_workers_fork_from_the_preloading_daemon(spark: SparkSession) -> None:
    def parents(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """A task's report of the process its Python worker was forked from: its command line,
        and whether numpy's and Arrow's libraries are loaded in it. (Defined here so that Spark
        ships it by value: the tests are not importable in a worker.)"""
        parent = os.getppid()
        with open(f"/proc/{parent}/cmdline", "rb") as handle:
            line = handle.read().replace(b"\0", b" ").decode()
        with open(f"/proc/{parent}/maps") as handle:
            maps = handle.read()
        for _ in batches:
            yield pa.RecordBatch.from_pydict(
                {
                    "cmdline": [line],
                    "numpy": ["_multiarray_umath" in maps],
                    "arrow": ["libarrow" in maps],
                }
            )

    rows = (
        spark.range(0, 2, 1, 2)
        .mapInArrow(parents, "cmdline string, numpy boolean, arrow boolean")
        .collect()
    )
    assert len(rows) == 2
    for row in rows:
        assert f"-m {DAEMON_MODULE} " in row.cmdline
        assert row.numpy and row.arrow  # loaded in the daemon, before any worker was forked


def test_a_daemon_that_cannot_preload_runs_as_the_stock_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyspark.daemon

    started: list[bool] = []
    monkeypatch.setattr(daemon, "PRELOAD", ("wcoj_no_such_module",))
    monkeypatch.setattr(pyspark.daemon, "manager", lambda: started.append(True))
    daemon.main()
    assert started == [True]
    assert capsys.readouterr().err == (
        "wcoj daemon: not preloading (ModuleNotFoundError: No module named 'wcoj_no_such_module')\n"
    )


LIMITED = """
import json, resource, sys
import pyspark.daemon
from wcoj_core.deploy import daemon
from wcoj_core.deploy.daemon import DAEMON_MODULE
pyspark.daemon.manager = lambda: print(json.dumps({
    "limit": resource.getrlimit(resource.RLIMIT_AS)[0],
    "loaded": [m for m in daemon.PRELOAD if m in sys.modules]}))
daemon.main()
"""


def test_the_daemon_preloads_under_the_workers_memory_limit() -> None:
    """``spark.executor.pyspark.memory`` reaches the daemon as ``PYSPARK_EXECUTOR_MEMORY_MB``:
    the limit is set before the imports, as a stock worker sets it before its own."""
    env = {**os.environ, "PYSPARK_EXECUTOR_MEMORY_MB": "1024"}
    done = subprocess.run(
        [sys.executable, "-c", LIMITED], capture_output=True, text=True, check=True, env=env
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"limit": 1024 << 20, "loaded": list(daemon.PRELOAD)}
