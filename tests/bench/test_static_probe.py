"""The static probes `wcoj-bench scale` runs in processes of their own (`wcoj_bench.infra.probes
static`): each counts the triangles of a prepared graph named by paths relative to the working
folder, as the part's default scratch (``.wcoj/bench``) names them.

Spark SQL once refused such a path (``Wrong FS: file://.wcoj/...``), which the scale part
recorded as Spark SQL failing to count the graph.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.spark  # the spark-sql probe starts a JVM of its own


def _prepared(folder: Path) -> int:
    """A small graph prepared as `wcoj_bench.infra.prepared` writes one; its triangle count."""
    rng = np.random.default_rng(7)
    pairs = {tuple(sorted(map(int, rng.integers(0, 30, 2)))) for _ in range(160)}
    edges = sorted((a, b) for a, b in pairs if a != b)
    src = np.array([a for a, _ in edges], dtype=np.int64)
    dst = np.array([b for _, b in edges], dtype=np.int64)
    ones = np.ones(len(src), dtype=np.int64)
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"c0": src, "c1": dst, "diff": ones}), folder / "edges.parquet")
    both = {"c0": np.r_[src, dst], "c1": np.r_[dst, src], "diff": np.r_[ones, ones]}
    pq.write_table(pa.table(both), folder / "symmetric.parquet")
    present = set(edges)
    return sum(
        1 for a, b, c in itertools.combinations(range(30), 3) if {(a, b), (b, c), (a, c)} <= present
    )


@pytest.mark.parametrize("method", ["duckdb", "spark-sql", "tc"])
def test_a_static_probe_counts_a_graph_named_by_relative_paths(tmp_path: Path, method: str) -> None:
    if method == "tc":
        from wcoj_bench.infra.peer import PeerMissing, build_tc

        try:
            build_tc()
        except PeerMissing as e:
            pytest.skip(f"tc: {e}")
    expected = _prepared(tmp_path / ".wcoj" / "g")
    assert expected > 0
    argv = [sys.executable, "-m", "wcoj_bench.infra.probes", "static", "--method", method]
    argv += ["--edges", ".wcoj/g/edges.parquet", "--symmetric", ".wcoj/g/symmetric.parquet"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["method"], result["count"]) == (method, expected)
