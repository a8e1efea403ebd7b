"""The driver's allocator setting (`wcoj_core.memory`): set once, switchable off, and made by
every process that runs the kernel: a Spark session's driver, and (since the one-pass engine
runs local commands without Spark) a command that never starts one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from wcoj_core import memory
from wcoj_core.spark import session


@pytest.fixture(autouse=True)
def fresh() -> None:
    memory.keep_freed_memory.cache_clear()


def test_switched_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WCOJ_KEEP_MEMORY", "0")
    assert memory.keep_freed_memory() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_set_on_linux_and_arrays_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WCOJ_KEEP_MEMORY", raising=False)
    assert memory.keep_freed_memory() is True
    # Arrow's buffers come from the same (kept) heap, not from mimalloc's own pages.
    assert pa.default_memory_pool().backend_name == "system"
    table = pa.table({"x": np.arange(1_000_000, dtype=np.int64)})
    assert table.column("x").to_numpy()[-1] == 999_999
    # Large arrays now come from the heap and are reused after they are freed.
    for _ in range(3):
        a = np.arange(8_000_000, dtype=np.int64)
        assert int(a[-1]) == 7_999_999 and int(a.sum()) == 7_999_999 * 8_000_000 // 2
        del a


def test_the_session_sets_it_first(spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """`session` makes the setting before anything else (here the session is already running)."""
    monkeypatch.delenv("WCOJ_KEEP_MEMORY", raising=False)
    assert memory.keep_freed_memory.cache_info().currsize == 0
    assert session() is spark
    assert memory.keep_freed_memory.cache_info().currsize == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_command_without_spark_sets_it_too(tmp_path: Path) -> None:
    edges = tmp_path / "edges.txt"
    edges.write_text("1\t2\n2\t3\n1\t3\n")
    code = f"""
import sys
from wcoj_core import cli, memory
argv = ["count", "--query", "triangles", "--input", "edge={edges}", "--undirected", "edge"]
assert cli.main(argv) == 0
assert "pyspark.sql" not in sys.modules, "Spark was imported"
print(memory.keep_freed_memory.cache_info().currsize)
"""
    env = {k: v for k, v in os.environ.items() if k != "WCOJ_KEEP_MEMORY"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "1", "the allocator setting was never made"
