"""`wcoj-bench ask`: issue 46's figures — questions asked of a kept state, and a query attached to
one — side by side with their baselines in one run.

Four parts over an undirected graph (``--input edge=PATH``, a SNAP edge list read once: loop-free,
each edge once) kept as a ``triangles`` state (built here in a scratch folder under ``--work``):

* **vertex** — in one process, ``--vertices`` random vertices of positive degree: the triangles
  at a vertex (``t(v, b, c)``, listed) and the 4-cliques at a vertex (``k(v, b, c, d)``)
  asked of the state (`wcoj_core.ask.Snapshot`), all vertices in one call (``--runs`` times: the
  seconds per vertex) and one vertex a call (each vertex once a run: the median of the calls);
  beside them scipy's listing of the same from the graph's neighbour sets (CSR, built once,
  not timed). Every answer must equal scipy's (the triangles and, for vertices of degree at
  most `LISTED`, the 4-cliques listed; every vertex's 4-clique count from its neighbourhood's
  triangles).
* **fresh** — ``wcoj query STATE --query ... --bind v=X`` as a fresh process (exec to exit) for
  ``--runs`` random vertices, beside ``wcoj status STATE`` (a fresh process reading the
  manifest only) and ``python -c 'import numpy, pyarrow'`` (the imports' floor).
* **cold** — the same one-vertex question on ``--cold-state`` (a large state kept elsewhere, e.g.
  the 18.6 M-edge R-MAT one) with every page of its files dropped from the cache first
  (`wcoj_bench.infra.measure.evict`), beside the same question warm.
* **attach** — ``wcoj attach STATE --query 4-cliques`` on a triangles state of its own, beside ``wcoj
  count --query 4-cliques`` (the static count, nothing kept) and the same count keeping its
  output in a new state (``--state``); then ``--epochs`` epochs of ``--epoch-size`` changes
  (``--delete-fraction`` deletions) applied to both states: every epoch's 4-clique change must
  be the same tuples in both. The relation's traces must be the same records before and after
  the attach; the bytes it added are its output's and the counts arrangement it reads.

``--parts`` picks some (default all but cold, which needs ``--cold-state``). The JSON ends with
issue 46's ``targets``: each figure beside its limit and whether it is met (the attach held
against the static count that keeps the same output; the one that keeps nothing beside it).
Fresh processes run without ``PYTHONDONTWRITEBYTECODE``, as an installed package's would.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time as clock
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from wcoj_bench.infra.measure import BenchError, evict, run_process
from wcoj_bench.parts.aggregates import SPECS, edges_table, read_edges, workload
from wcoj_core.ask import Snapshot
from wcoj_core.engine import Engine
from wcoj_core.query.builtins import builtin
from wcoj_core.query.parse import parse_query
from wcoj_core.store.store import Store

TRIANGLES_AT = "t(v, b, c) :- edge(v, b), edge(b, c), edge(v, c), b < c"
CLIQUES_AT = (
    "k(v, b, c, d) :- edge(v, b), edge(v, c), edge(v, d), edge(b, c), edge(b, d), edge(c, d), "
    "b < c, c < d"
)
# The 4-cliques of vertices of at most this degree are listed by scipy's side and compared
# tuple by tuple (the others by their count).
LISTED = 400


def add_parser(commands: Any) -> None:
    p = commands.add_parser("ask", help="issue 46: questions asked of a kept state, attach")
    p.add_argument("--input", required=True, metavar="edge=PATH", help="a SNAP edge list")
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--vertices", type=int, default=1000, help="vertices asked (default 1000)")
    p.add_argument("--runs", type=int, default=5, help="runs of each (default 5)")
    p.add_argument("--cold-state", default=None, help="a large state for the cold part")
    p.add_argument("--epochs", type=int, default=10, help="epochs after attach (default 10)")
    p.add_argument("--epoch-size", type=int, default=1000, help="changes (default 1000)")
    p.add_argument("--delete-fraction", type=float, default=0.5, help="(default 0.5)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--parts", default="vertex,fresh,attach", help="vertex,fresh,cold,attach")
    p.add_argument("--json", action="store_true", help="end with one JSON line")


def wcoj(*args: str) -> list[str]:
    return [sys.executable, "-m", "wcoj_core.cli", *args]


def neighbours(edges: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR neighbour lists of the undirected graph (sorted)."""
    import scipy.sparse as sp

    both = np.concatenate([edges, edges[:, ::-1]])
    a = sp.csr_matrix((np.ones(len(both), dtype=np.int8), (both[:, 0], both[:, 1])), (n, n))
    a.sort_indices()
    return a.indptr, a.indices


def scipy_triangles(ptr: np.ndarray, idx: np.ndarray, v: int) -> list[tuple[int, int, int]]:
    """The triangles at v from neighbour sets: adjacent pairs b < c of v's neighbours."""
    nv = idx[ptr[v] : ptr[v + 1]]
    out = []
    for b in nv.tolist():
        nb = idx[ptr[b] : ptr[b + 1]]
        for c in np.intersect1d(nv[nv > b], nb, assume_unique=True).tolist():
            out.append((v, b, c))
    return out


def scipy_cliques(ptr: np.ndarray, idx: np.ndarray, v: int) -> list[tuple[int, ...]]:
    """The 4-cliques at v: triples b < c < d of v's neighbours, pairwise adjacent."""
    nv = idx[ptr[v] : ptr[v + 1]]
    out = []
    for b in nv.tolist():
        bc = np.intersect1d(nv[nv > b], idx[ptr[b] : ptr[b + 1]], assume_unique=True)
        for c in bc.tolist():
            for d in np.intersect1d(
                bc[bc > c], idx[ptr[c] : ptr[c + 1]], assume_unique=True
            ).tolist():
                out.append((v, b, c, d))
    return out


def cliques_counted(edges: np.ndarray, n: int, vs: list[int]) -> dict[int, int]:
    """Each vertex's 4-cliques counted: the triangles of its neighbourhood, trace(A_N^3) / 6."""
    import scipy.sparse as sp

    both = np.concatenate([edges, edges[:, ::-1]])
    a = sp.csr_matrix((np.ones(len(both), dtype=np.int64), (both[:, 0], both[:, 1])), (n, n))
    out = {}
    for v in vs:
        nv = a.indices[a.indptr[v] : a.indptr[v + 1]]
        sub = a[nv][:, nv]
        out[v] = int((sub @ sub).multiply(sub).sum()) // 6
    return out


def rows_of(table: pa.Table) -> Counter[tuple[int, ...]]:
    cols = [table.column(k).to_numpy() for k in table.column_names[:-1]]
    return Counter(zip(*(c.tolist() for c in cols), strict=True))


def timed(fn: Any) -> tuple[float, Any]:
    start = clock.perf_counter()
    got = fn()
    return clock.perf_counter() - start, got


def vertex(state: str, edges: np.ndarray, vs: list[int], runs: int) -> dict[str, Any]:
    """The vertex part (see the module)."""
    n = int(edges.max()) + 1
    ptr, idx = neighbours(edges, n)
    snapshot = Snapshot.open(state)
    out: dict[str, Any] = {"vertices": len(vs)}
    listed = [v for v in vs if ptr[v + 1] - ptr[v] <= LISTED]
    for name, text, scipy_of in (
        ("triangles", TRIANGLES_AT, scipy_triangles),
        ("4-cliques", CLIQUES_AT, scipy_cliques),
    ):
        question = snapshot.question(parse_query(text), ["v"])
        values = np.array(vs, dtype=np.int64)
        snapshot.ask(question, values)  # the first call maps what it reads
        batched = [timed(lambda q=question, x=values: snapshot.ask(q, x))[0] for _ in range(runs)]
        single = [
            timed(lambda q=question, v=v: snapshot.ask(q, [v]))[0] for _ in range(runs) for v in vs
        ]
        answer = snapshot.ask(question, values)
        mine = rows_of(answer)
        some = vs if name == "triangles" else listed
        base_s, theirs = timed(
            lambda f=scipy_of, some=some: [t for v in some for t in f(ptr, idx, v)]
        )
        if name == "triangles":
            exact = mine == Counter(theirs)
        else:
            small = set(listed)
            exact = Counter(t for t in mine.elements() if t[0] in small) == Counter(theirs)
            per = Counter(t[0] for t in mine.elements())
            exact = exact and all(
                per.get(v, 0) == c for v, c in cliques_counted(edges, n, vs).items()
            )
        if not exact:
            raise BenchError(f"{name} at a vertex differs from scipy's neighbour sets")
        out[name] = {
            "rows": answer.num_rows,
            "batched_us_per_vertex": round(statistics.median(batched) / len(vs) * 1e6, 2),
            "one_at_a_time_median_us": round(statistics.median(single) * 1e6, 1),
            "scipy_us_per_vertex": round(base_s / max(len(some), 1) * 1e6, 1),
            "scipy_vertices": len(some),
            "exact": True,
        }
    return out


def fresh(state: str, vs: list[int], runs: int) -> dict[str, Any]:
    """The fresh part (see the module): fresh processes, exec to exit."""
    env = fresh_env()
    sides: dict[str, list[float]] = {"query": [], "status": [], "imports": []}
    for v in vs[:runs]:
        argv = wcoj("query", state, "--query", TRIANGLES_AT, "--bind", f"v={v}", "--json")
        sides["query"].append(run_process(argv, env=env).seconds)
        sides["status"].append(run_process(wcoj("status", state), env=env).seconds)
        floor = [sys.executable, "-c", "import numpy, pyarrow"]
        sides["imports"].append(run_process(floor, env=env).seconds)
    return {k: round(statistics.median(v), 3) for k, v in sides.items()} | {"runs": runs}


def fresh_env() -> dict[str, str]:
    """A fresh process's environment: as a user's, whose installed package has its bytecode
    (``PYTHONDONTWRITEBYTECODE`` would compile every module again in every process)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return env | {"OPENBLAS_NUM_THREADS": "1"}


def cold(state: str, runs: int, seed: int) -> dict[str, Any]:
    """The cold part (see the module): one vertex asked of a large state, its pages dropped."""
    from wcoj_core.served import StateAccess
    from wcoj_core.session import starter_of
    from wcoj_core.state_read import read_table

    access = StateAccess.open(state, starter_of(None), create=False)
    keys = read_table(access, "counts/edge/0").column("c0").to_numpy()  # vertices of degree > 0
    tuples = access.store.current().traces["rel/edge"].figures_at()[0]
    picks = np.random.default_rng(seed).choice(keys, size=runs, replace=False).tolist()
    env = fresh_env()
    out: dict[str, list[float]] = {"evicted": [], "warm": []}
    rows: list[int] = []
    for v in picks:
        argv = wcoj("query", state, "--query", TRIANGLES_AT, "--bind", f"v={v}", "--json")
        evict(state)
        done = run_process(argv, env=env)
        out["evicted"].append(done.seconds)
        rows.append(int(done.result.get("rows", 0)))
        out["warm"].append(run_process(argv, env=env).seconds)
    return {
        "edges": tuples // 2,
        "median_seconds": {k: round(statistics.median(v), 3) for k, v in out.items()},
        "rows": rows,
        "runs": runs,
    }


def attach(work: Path, path: str, edges: np.ndarray, changes: list[pa.Table]) -> dict[str, Any]:
    """The attach part (see the module)."""
    copy, static = work / "attached", work / "static"
    for folder in (copy, static):
        shutil.rmtree(folder, ignore_errors=True)
    # A state of its own, made as `state` was (a copy's files would fail their stamps and be
    # hashed whole on their first open).
    Engine(None, str(copy), builtin("triangles"), relations=SPECS).apply(
        0, {"edge": edges_table(edges)}
    )
    before = Store.open(copy, create=False).current()
    attached = run_process(wcoj("attach", str(copy), "--query", "4-cliques", "--json"))
    given = ["--query", "4-cliques", "--input", f"edge={path}", "--undirected", "edge", "--json"]
    counted = run_process(wcoj("count", *given))
    kept = run_process(wcoj("count", *given, "--state", str(static)))
    counts = {attached.result["count"], counted.result["count"], kept.result["count"]}
    if len(counts) != 1:
        raise BenchError(f"the attached 4-cliques differ from the static count: {counts}")
    after = Store.open(copy, create=False).current()
    same = all(after.traces[n] == t for n, t in before.traces.items())
    added = {n: t.bytes() for n, t in after.traces.items() if n not in before.traces}
    query = builtin("4-cliques")
    engines = [
        Engine(None, str(copy), builtin("triangles"), relations=SPECS),
        Engine(None, str(static), query, relations=SPECS),
    ]
    agreed = 0
    for t, change in enumerate(changes, 1):
        results = [e.apply(t, {"edge": change}) for e in engines]
        tables = [e.change(query.name, t) for e in engines]
        if rows_and_diffs(tables[0]) != rows_and_diffs(tables[1]):
            raise BenchError(f"epoch {t}: the attached 4-cliques changed otherwise")
        agreed += results[0].count(query.name) == results[1].count(query.name)
    return {
        "attach_seconds": round(attached.seconds, 3),
        "attach_cpu_seconds": round(attached.cpu_seconds, 3),
        "static_count_seconds": round(counted.seconds, 3),
        "static_count_cpu_seconds": round(counted.cpu_seconds, 3),
        "static_kept_seconds": round(kept.seconds, 3),
        "static_kept_cpu_seconds": round(kept.cpu_seconds, 3),
        "cliques": attached.result["count"],
        "relation_unchanged": same,
        "bytes_added": added,
        "output_bytes_static": Store.open(static, create=False)
        .current()
        .traces["out/cliques4"]
        .bytes(),
        "epochs_exact": agreed,
        "epochs": len(changes),
    }


def rows_and_diffs(table: pa.Table) -> Counter[tuple[int, ...]]:
    cols = [table.column(c).to_numpy().tolist() for c in table.column_names]
    return Counter(zip(*cols, strict=True))


def run(args: argparse.Namespace) -> dict[str, Any]:
    path = args.input.split("=", 1)[1]
    edges = read_edges(path)
    parts = args.parts.split(",")
    result: dict[str, Any] = {
        "graph": Path(path).name,
        "edges": len(edges),
        "load": os.getloadavg(),
    }
    Path(args.work).mkdir(parents=True, exist_ok=True)  # --work need not exist yet
    with tempfile.TemporaryDirectory(dir=args.work) as scratch:
        work = Path(scratch)
        state = str(work / "state")
        if {"vertex", "fresh"} & set(parts):
            Engine(None, state, builtin("triangles"), relations=SPECS).apply(
                0, {"edge": edges_table(edges)}
            )
        degree = np.bincount(edges.ravel())
        live = np.flatnonzero(degree)
        rng = np.random.default_rng(args.seed)
        vs = sorted(rng.choice(live, size=min(args.vertices, len(live)), replace=False).tolist())
        if "vertex" in parts:
            result["vertex"] = vertex(state, edges, vs, args.runs)
        if "fresh" in parts:
            result["fresh"] = fresh(state, [int(v) for v in rng.permutation(vs)], args.runs)
        if "cold" in parts:
            if args.cold_state is None:
                raise BenchError("the cold part needs --cold-state (a large state)")
            result["cold"] = cold(args.cold_state, args.runs, args.seed)
        if "attach" in parts:
            changes = workload(edges, args.epochs, args.epoch_size, args.delete_fraction, args.seed)
            result["attach"] = attach(work, path, edges, changes)
    result["load_after"] = os.getloadavg()
    result["targets"] = targets(result)
    return result


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """Issue 46's targets, each with the figure measured and whether it is met (a part not
    run: absent). The attach is held against the static count that keeps the same output
    (``wcoj count --state``: what the attach makes); the count that keeps nothing is beside it."""
    out: dict[str, Any] = {}
    tri = result.get("vertex", {}).get("triangles")
    if tri:
        out["batched_us_per_vertex<=50"] = tri["batched_us_per_vertex"]
        out["one_at_a_time_median_us<=200"] = tri["one_at_a_time_median_us"]
    if "fresh" in result:
        out["fresh_query_seconds<=0.3"] = result["fresh"]["query"]
    if "cold" in result:
        out["cold_vertex_seconds<=1"] = result["cold"]["median_seconds"]["evicted"]
    a = result.get("attach")
    if a:
        out["attach_over_static_kept<=1"] = round(a["attach_seconds"] / a["static_kept_seconds"], 2)
        out["attach_over_static_count"] = round(a["attach_seconds"] / a["static_count_seconds"], 2)
    limits = {k: float(k.rpartition("<=")[2]) for k in out if "<=" in k}
    return {"figures": out, "met": {k: out[k] <= v for k, v in limits.items()}}


def say_result(result: dict[str, Any], say: Any) -> None:
    for name in ("triangles", "4-cliques"):
        f = result.get("vertex", {}).get(name)
        if f:
            say(
                f"{name} at a vertex: {f['batched_us_per_vertex']} us a vertex batched, "
                f"{f['one_at_a_time_median_us']} us one at a time (scipy {f['scipy_us_per_vertex']} us)"
            )
    if "fresh" in result:
        say(f"fresh processes (median s): {json.dumps(result['fresh'])}")
    if "cold" in result:
        say(f"cold: {json.dumps(result['cold']['median_seconds'])}")
    if "attach" in result:
        a = result["attach"]
        say(
            f"attach 4-cliques {a['attach_seconds']} s; static count {a['static_count_seconds']} s, "
            f"kept {a['static_kept_seconds']} s; epochs exact {a['epochs_exact']}/{a['epochs']}"
        )
    say(f"targets: {json.dumps(result['targets'])}")
