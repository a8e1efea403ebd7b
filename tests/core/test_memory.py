"""The driver's allocator setting (`wcoj_core.memory`): set once, switchable off."""

from __future__ import annotations

import sys

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
