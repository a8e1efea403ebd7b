"""`wcoj-bench aggregates`: issue 40's figures for aggregate queries, side by side in one run.

Three parts, each on an undirected graph (``--input edge=PATH``, a SNAP edge list read once
with pandas: loop-free, each edge once) held by an engine in this process (no Spark):

* **static** — the whole graph's per-vertex triangle counts three ways, ``--runs`` times each:
  ``triangles-per-vertex`` as `wcoj count` evaluates it (a fresh state keeping nothing: the
  counts summed per vertex by the kernel), the plain ``triangles`` count as `wcoj count` runs it
  (the kernel's count of the triangles, nothing written: today's fastest path), and scipy's
  per-vertex ``(A @ A) * A`` row sums (from the edge array: the CSR build and the masked product
  timed). The per-vertex counts must equal scipy's, vertex by vertex.
* **warm epochs** — the graph loaded as epoch 0 of a kept state, then ``--epochs`` epochs of
  ``--epoch-size`` changes (``--delete-fraction`` of them deletions of present edges, the rest
  new edges between the graph's vertices), applied by one warm engine for
  ``triangles-per-vertex`` and, in the same run on the same changes, for ``triangles`` (the full
  output). Timed: each `Engine.apply` (land, derive, write, commit); reported as sustained
  changes per second over the epochs after the first, per wall second and per CPU second of
  the process (what a loaded machine distorts least), with each phase's CPU per epoch. Outside
  the timing, every epoch's per-vertex table is compared with scipy's (`Recount`), every
  epoch is audited in full (`wcoj_core.audit_sample.audit_epoch` with ``FULL``: every changed
  group recounted by binary joins over the stored arrangements), and the last epoch's table
  equals scipy's recount of the final graph.
* **skew** — two hubs sharing ``N`` neighbours (``--hubs``, several N), then a stream of
  single-change epochs inserting and deleting the edge between the hubs: the kernel's work per
  change (candidates proposed plus validated, every step of every rule) for
  ``triangles-per-vertex`` and ``triangle-count``, against N, and the keys each change changes.

``--parts`` runs some of them (default all three).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time as clock
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from wcoj_core.aggregates import table
from wcoj_core.audit import AuditMode
from wcoj_core.audit_sample import audit_epoch
from wcoj_core.engine import Engine
from wcoj_core.meaning import relation_specs
from wcoj_core.query.builtins import builtin

SPECS = relation_specs({"edge": 2}, undirected=["edge"])
PER_VERTEX = builtin("triangles-per-vertex")
TRIANGLES = builtin("triangles")


def add_parser(commands: Any) -> None:
    p = commands.add_parser("aggregates", help="issue 40: aggregate queries, static, warm, skew")
    p.add_argument("--input", required=True, metavar="edge=PATH", help="a SNAP edge list")
    p.add_argument("--runs", type=int, default=3, help="static runs per method (default 3)")
    p.add_argument("--epochs", type=int, default=100, help="warm epochs (default 100)")
    p.add_argument("--epoch-size", type=int, default=10_000, help="changes (default 10000)")
    p.add_argument("--delete-fraction", type=float, default=0.1, help="(default 0.1)")
    p.add_argument("--hubs", default="1000,4000,16000,64000", help="the skew part's N")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--parts", default="static,warm,skew", help="which parts (default all)")
    p.add_argument("--json", action="store_true", help="end with one JSON line")


def read_edges(path: str) -> np.ndarray:
    """An edge list's undirected simple graph: rows (a, b), a < b, each edge once."""
    import pandas as pd

    pairs = pd.read_csv(path, sep=r"\s+", comment="#", header=None, dtype=np.int64).to_numpy()
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    key = np.unique(
        np.minimum(pairs[:, 0], pairs[:, 1]) << 32 | np.maximum(pairs[:, 0], pairs[:, 1])
    )
    return np.stack([key >> 32, key & 0xFFFFFFFF], axis=1)


def edges_table(edges: np.ndarray, diff: np.ndarray | None = None) -> pa.Table:
    d = np.ones(len(edges), dtype=np.int64) if diff is None else diff
    return pa.table({"c0": edges[:, 0], "c1": edges[:, 1], "diff": d})


def scipy_per_vertex(edges: np.ndarray, n: int) -> np.ndarray:
    """Each vertex's triangles: the row sums of (A @ A) * A over 2."""
    import scipy.sparse as sp

    both = np.concatenate([edges, edges[:, ::-1]])
    a = sp.csr_matrix((np.ones(len(both), dtype=np.int64), (both[:, 0], both[:, 1])), (n, n))
    return np.asarray(a.multiply(a @ a).sum(axis=1)).ravel() // 2


def timed(fn: Any) -> tuple[float, Any]:
    start = clock.perf_counter()
    got = fn()
    return clock.perf_counter() - start, got


def static(edges: np.ndarray, runs: int) -> dict[str, Any]:
    """The static part (see the module)."""
    n = int(edges.max()) + 1
    seconds: dict[str, list[float]] = {"per-vertex": [], "triangles": [], "scipy": []}
    counts = per_vertex = None
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as root:
            engine = Engine(None, root, PER_VERTEX, relations=SPECS)
            s, result = timed(lambda e=engine: e.evaluate({"edge": edges_table(edges)}))
            seconds["per-vertex"].append(s)
            rows, diff = result.changes[PER_VERTEX.name]
            per_vertex = np.zeros(n, dtype=np.int64)
            per_vertex[np.asarray(rows)[:, 0]] = diff
        with tempfile.TemporaryDirectory() as root:
            engine = Engine(None, root, TRIANGLES, relations=SPECS)
            count = lambda e=engine: e.evaluate({"edge": edges_table(edges)}, count_only=True)  # noqa: E731
            s, result = timed(count)
            seconds["triangles"].append(s)
        s, counts = timed(lambda: scipy_per_vertex(edges, n))
        seconds["scipy"].append(s)
    assert per_vertex is not None and counts is not None
    if not np.array_equal(per_vertex, counts):
        raise AssertionError("triangles-per-vertex differs from scipy's per-vertex counts")
    med = {k: statistics.median(v) for k, v in seconds.items()}
    return {
        "seconds": seconds,
        "median": med,
        "per_vertex_over_triangles": round(med["per-vertex"] / med["triangles"], 2),
        "scipy_over_per_vertex": round(med["scipy"] / med["per-vertex"], 1),
        "triangles": int(counts.sum()) // 3,
        "exact": True,
    }


def workload(edges: np.ndarray, epochs: int, size: int, share: float, seed: int) -> list[pa.Table]:
    """Epochs of changes: deletions of present edges, insertions of new ones (see the module)."""
    rng = random.Random(seed)
    n = int(edges.max()) + 1
    present = set((edges[:, 0] << 32 | edges[:, 1]).tolist())
    out = []
    for _ in range(epochs):
        gone = rng.sample(list(present), int(size * share))
        new: set[int] = set()
        while len(new) < size - len(gone):
            a, b = rng.randrange(n), rng.randrange(n)
            key = min(a, b) << 32 | max(a, b)
            if a != b and key not in present:
                new.add(key)
        present.difference_update(gone)
        present.update(new)
        keys = np.array([*gone, *new], dtype=np.int64)
        diff = np.array([-1] * len(gone) + [1] * len(new), dtype=np.int64)
        out.append(edges_table(np.stack([keys >> 32, keys & 0xFFFFFFFF], axis=1), diff))
    return out


def warm(edges: np.ndarray, changes: list[pa.Table]) -> dict[str, Any]:
    """The warm part (see the module)."""
    out: dict[str, Any] = {}
    for query in (PER_VERTEX, TRIANGLES):
        with tempfile.TemporaryDirectory() as root:
            engine = Engine(None, root, query, relations=SPECS)
            load, _ = timed(lambda e=engine: e.apply(0, {"edge": edges_table(edges)}))
            check = Recount(edges) if query is PER_VERTEX else None
            if check is not None:
                check.whole(engine)
            seconds, cpu, phases = [], [], dict[str, float]()
            first = 2 if len(changes) > 1 else 1  # the first epoch maps what it reads: untimed
            for t, change in enumerate(changes, 1):
                start = clock.process_time()
                s, result = timed(lambda e=engine, t=t, c=change: e.apply(t, {"edge": c}))
                if t >= first:
                    seconds.append(s)
                    cpu.append(clock.process_time() - start)
                    for k, v in result.metrics.cpu_seconds.items():
                        phases[k] = phases.get(k, 0.0) + v
                if check is not None:
                    check.epoch(engine, change, result.changes[query.name])
            steady = sum(c.num_rows for c in changes[first - 1 :])
            figures: dict[str, Any] = {
                "load_seconds": round(load, 3),
                "median_epoch_seconds": round(statistics.median(seconds), 4),
                "changes_per_second": round(steady / sum(seconds)),
                "changes_per_cpu_second": round(steady / sum(cpu)),
                "cpu_ms_per_epoch": {k: round(v / len(cpu) * 1000, 1) for k, v in phases.items()},
            }
            if check is not None:
                figures["epochs_equal_scipy"] = check.passed
                audits = [
                    audit_epoch(engine, query.name, t, AuditMode.FULL)
                    for t in range(1, len(changes) + 1)
                ]
                figures["audited_epochs_passed"] = sum(a.passed for a in audits)
                out["final_table"] = table(engine, query)
            out[query.name] = figures
    return out


class Recount:
    """Each epoch's per-vertex triangle counts checked against scipy, independently of the
    engine: the graph is kept as a key array, and every vertex whose count an epoch can change
    (the changed edges' ends and their common neighbours, before and after) is recounted from
    the row sums of ``(A[X] @ A) * A[X]`` and compared with the engine's table; the engine's
    change may name no other vertex. With the load epoch compared whole, every epoch's table
    is then exact."""

    def __init__(self, edges: np.ndarray) -> None:
        self.keys = np.sort(edges[:, 0] << 32 | edges[:, 1])
        self.a = self.matrix()
        self.passed = 0

    def matrix(self) -> Any:
        import scipy.sparse as sp

        a, b = self.keys >> 32, self.keys & 0xFFFFFFFF
        n = int(max(a.max(), b.max())) + 1 if len(self.keys) else 1
        ones = np.ones(2 * len(a), dtype=np.int64)
        return sp.csr_matrix((ones, (np.concatenate([a, b]), np.concatenate([b, a]))), (n, n))

    def whole(self, engine: Engine) -> None:
        n = self.a.shape[0]
        want = scipy_per_vertex(np.stack([self.keys >> 32, self.keys & 0xFFFFFFFF], 1), n)
        if not np.array_equal(self.values(engine, np.arange(n)), want):
            raise AssertionError("the load epoch's per-vertex counts differ from scipy's")

    @staticmethod
    def values(engine: Engine, vertices: np.ndarray) -> np.ndarray:
        """The engine's table (read from its arrangement) at `vertices` (0 where it has none)."""
        got = table(engine, PER_VERTEX)
        keys, values = got.column(0).to_numpy(), got.column(1).to_numpy()
        at = np.searchsorted(keys, vertices)
        found = at < len(keys)
        found[found] = keys[at[found]] == vertices[found]
        return np.where(found, values[np.minimum(at, max(len(keys) - 1, 0))], 0)

    def epoch(self, engine: Engine, change: pa.Table, made: Any) -> None:
        a, b = change.column("c0").to_numpy(), change.column("c1").to_numpy()
        key, diff = a << 32 | b, change.column("diff").to_numpy()
        before = self.a
        kept = np.delete(self.keys, np.searchsorted(self.keys, key[diff < 0]))
        new = np.sort(key[diff > 0])
        self.keys = np.insert(kept, np.searchsorted(kept, new), new)  # (sorted, not hashed)
        after = self.a = self.matrix()
        touched = [a, b]
        for m in (before, after):
            n = m.shape[0]
            inside = (a < n) & (b < n)
            common = m[a[inside]].multiply(m[b[inside]])
            touched.append(common.indices)
        vertices = np.unique(np.concatenate(touched))
        vertices = vertices[vertices < after.shape[0]]
        rows = after[vertices]
        want = np.asarray((rows @ after).multiply(rows).sum(axis=1)).ravel() // 2
        got = self.values(engine, vertices)
        changed = np.asarray(made[0])[:, 0] if made is not None else np.empty(0, np.int64)
        if not np.array_equal(got, want) or not np.isin(changed, vertices).all():
            raise AssertionError("an epoch's per-vertex counts differ from scipy's recount")
        self.passed += 1


def skew(hubs: list[int], changes: int = 20) -> list[dict[str, Any]]:
    """The skew part (see the module): work and changed keys per change against N."""
    out = []
    for n, query in ((n, q) for n in hubs for q in (PER_VERTEX, builtin("triangle-count"))):
        leaves = np.arange(2, n + 2, dtype=np.int64)
        hub = [np.stack([np.full(n, h, np.int64), leaves], 1) for h in (0, 1)]
        with tempfile.TemporaryDirectory() as root:
            engine = Engine(None, root, query, relations=SPECS)
            engine.apply(0, {"edge": edges_table(np.concatenate(hub))})
            work, seconds, keys = [], [], []
            for t in range(1, changes + 1):
                hub_edge = edges_table(np.array([[0, 1]]), np.array([1 if t % 2 else -1]))
                s, result = timed(lambda e=engine, t=t, c=hub_edge: e.apply(t, {"edge": c}))
                seconds.append(s)
                work.append(sum(m.proposed + m.validated for m in result.metrics.steps))
                keys.append(result.metrics.outputs[query.name])
            out.append(
                {
                    "query": query.name,
                    "N": n,
                    "work_per_change": statistics.median(work),
                    "keys_per_change": statistics.median(keys),
                    "median_seconds": round(statistics.median(seconds), 4),
                }
            )
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    path = args.input.split("=", 1)[1]
    edges = read_edges(path)
    result: dict[str, Any] = {"graph": Path(path).name, "edges": len(edges)}
    parts = args.parts.split(",")
    if "static" in parts:
        result["static"] = static(edges, args.runs)
    if "warm" in parts:
        changes = workload(edges, args.epochs, args.epoch_size, args.delete_fraction, args.seed)
        got = warm(edges, changes)
        final = got.pop("final_table")
        after = _final_edges(pa.concat_tables([edges_table(edges), *changes]))
        counts = scipy_per_vertex(after, int(max(edges.max(), after.max())) + 1)
        mine = np.zeros(len(counts), dtype=np.int64)
        mine[final.column(0).to_numpy()] = final.column(1).to_numpy()
        got["final_equals_scipy"] = bool(np.array_equal(mine, counts))
        result["warm"] = got
    if "skew" in parts:
        result["skew"] = skew([int(x) for x in args.hubs.split(",")])
    return result


def _final_edges(updates: pa.Table) -> np.ndarray:
    """The edges whose summed diff is positive (each change named once, a < b)."""
    key = updates.column("c0").to_numpy() << 32 | updates.column("c1").to_numpy()
    keys, inverse = np.unique(key, return_inverse=True)
    total = np.bincount(inverse, weights=updates.column("diff").to_numpy())
    kept = keys[total > 0]
    return np.stack([kept >> 32, kept & 0xFFFFFFFF], axis=1)
