"""The compiled kernel as a module: built by the install, current, never compiled at run time
by a user, rebuilt once when stale, and running its loops without the GIL."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from wcoj_core.kernel import native as loader
from wcoj_core.kernel.native import native


def test_the_module_loaded_is_built_from_the_source_beside_it() -> None:
    assert loader.source_hash() == native.SOURCE_HASH


def test_a_fresh_process_loads_the_installed_module_without_compiling() -> None:
    """The install built it where the package is: a new process (a `wcoj apply`, a worker)
    loads it in place, with no compiler run and nothing written to any cache."""
    code = (
        "import time; t = time.perf_counter();"
        "from wcoj_core.kernel.native import native;"
        "print(native.__file__, time.perf_counter() - t)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"WCOJ_NATIVE_CACHE": "/nonexistent/never-written", "PATH": ""},  # no compiler
    )
    path, _ = done.stdout.split()
    assert Path(path).parent == Path(loader.__file__).parent


def test_a_stale_module_is_built_once_into_the_cache(tmp_path, monkeypatch) -> None:
    """A checkout whose C source moved on since its install: the module is built into the
    cache the first time, then loaded from there."""
    monkeypatch.setenv("WCOJ_NATIVE_CACHE", str(tmp_path))
    digest = "0123456789abcdef"  # what a newer source would hash to
    built = loader._built(digest)
    assert digest == built.SOURCE_HASH
    (target,) = tmp_path.iterdir()
    stamp = target.stat().st_mtime_ns
    again = loader._built(digest)
    assert digest == again.SOURCE_HASH and target.stat().st_mtime_ns == stamp  # not rebuilt
    product, flags = np.empty(2, dtype=np.int64), np.zeros(2, dtype=np.uint8)
    assert built.multiply(np.array([3, 2**62]), np.array([5, 2]), product, flags)
    assert product[0] == 15 and flags.tolist() == [0, 1]


def test_an_unwritable_cache_costs_a_build_in_a_temporary_folder(monkeypatch) -> None:
    monkeypatch.setenv("WCOJ_NATIVE_CACHE", "/dev/null/cache")  # cannot be created
    built = loader._built("fedcba9876543210")
    assert built.SOURCE_HASH == "fedcba9876543210"
    assert "wcoj-native" in str(built.__file__)


def test_no_compiler_is_an_error_that_says_what_to_do(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WCOJ_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(loader.sysconfig, "get_config_var", lambda _: "no-such-cc")
    with pytest.raises(loader.WcojError, match="no C compiler"):
        loader._built("1111111111111111")


def test_the_compiled_loops_release_the_gil() -> None:
    """A long sort on one thread leaves this thread free to run Python meanwhile."""
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2**63, 8_000_000, dtype=np.int64).view(np.uint64)
    out, order = np.empty_like(keys), np.empty(len(keys), dtype=np.int64)
    worker = threading.Thread(target=native.argsort, args=(keys, out, order))
    worker.start()
    spins = 0
    while worker.is_alive():
        spins += 1
        time.sleep(0)
    worker.join()
    assert spins > 10
    assert bool((out[1:] >= out[:-1]).all()) and (keys[order] == out).all()


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(
    ("n", "high"), [(5, 9), (70_000, 1 << 20), (200_000, 1 << 38), (150_000, 1 << 63), (1 << 17, 2)]
)
def test_the_radix_sort_on_threads_is_numpys_stable_argsort(
    threads: int, n: int, high: int
) -> None:
    """Every pass shared out among threads still gives the stable order: equal keys keep the
    order they came in (what consolidating diffs through the permutation relies on)."""
    keys = np.random.default_rng(n + threads).integers(0, high, size=n, dtype=np.uint64)
    out, order = np.empty_like(keys), np.empty(n, dtype=np.int64)
    native.argsort(keys, out, order, threads)
    expected = np.argsort(keys, kind="stable")
    assert np.array_equal(order, expected)
    assert np.array_equal(out, keys[expected])
    alone = keys.copy()
    native.argsort(alone, alone, None, threads)  # keys alone, in place
    assert np.array_equal(alone, np.sort(keys))
