"""The small programs the process benchmarks run as fresh processes: ``python -m wcoj_bench.infra.probes``.

Each subcommand does one thing and ends with one JSON line on stdout; the benchmark times the
whole process (`wcoj_bench.infra.measure.run_process`). Nothing is imported before a subcommand asks
for it, so a probe's process pays for what its work needs and no more.

* ``prepare --input SPEC --out DIR --epochs-out DIR --epochs K --epoch-size N --seed S`` — a
  graph for the process benchmarks (`wcoj_bench.infra.prepared`): the canonical undirected edges of a
  file (read with pyarrow) or a generator (Spark), the symmetric table a Spark SQL recompute
  keeps (both kept when the folder has them), and K epochs of N changes as CSV files;
* ``generate --input SPEC --out DIR`` — a generated graph's canonical undirected edges written
  by Spark as Parquet (what ``prepare`` reads, so that its JVM is gone before the rest);
* ``open --state DIR --query Q --undirected REL [--bag REL]`` — construct the engine over a
  state and open every trace an epoch reads (what an epoch's ``open`` phase does), timed inside;
* ``recompute --relation DIR --out-relation DIR --output DIR [--changes CSV] [--query Q]`` —
  what a user's Spark SQL job does without wcoj: read the relation's Parquet table and the
  epoch's changes (an undirected edge once; both directions are added), write the new table,
  recompute the query with the binary-join plan of the ``recompute`` method
  (`wcoj_core.reference`), write the output, and sum it;
* ``warm --state DIR --first T --changes CSV ... [--bag REL]`` — one process applying epochs one
  after the other, each timed (what an in-process, warm epoch costs);
* ``static --method duckdb|spark-sql --edges PARQUET --symmetric PARQUET`` — one static
  triangle count of a prepared graph by DuckDB or Spark SQL (`wcoj_bench.parts.static`'s queries);
* ``triangles --edges PARQUET [--changes CSV ...] [--method scipy|forward]`` — the triangles of
  a graph after some epochs, counted by scipy (``sum((U @ U) ∘ U)``) or by the forward algorithm
  in numpy (`forward_triangles`: for large graphs): an independent check of a count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time as clock
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _emit(payload: dict[str, Any]) -> None:
    print(json.dumps(payload), flush=True)


def _specs(query: Any, undirected: Sequence[str], bags: Sequence[str]) -> Any:
    from wcoj_core.meaning import relation_specs

    return relation_specs(dict(query.relations), undirected=undirected, bags=bags)


# -- open ---------------------------------------------------------------------------------------


def open_state(args: argparse.Namespace) -> dict[str, Any]:
    """Engine construction and every trace opened, timed apart; what opening mapped and read."""
    start = clock.perf_counter()
    from wcoj_core.engine import Engine
    from wcoj_core.indexes import open_trace
    from wcoj_core.query.builtins import resolve_query

    imported = clock.perf_counter()
    query = resolve_query(args.query)
    engine = Engine(
        None,
        args.state,
        query,
        relations=_specs(query, args.undirected, args.bag),
        create=False,
    )
    made = clock.perf_counter()
    manifest = engine.store.current()
    before = (manifest.epoch if manifest.epoch is not None else -1) + 1
    opened = [
        open_trace(
            engine.store.root,
            manifest.traces[name],
            before,
            engine.served.views[name],
            engine.read_batch,
        )
        for name in engine.served.indexed()
    ]
    done = clock.perf_counter()
    return {
        "probe": "open",
        "epoch": manifest.epoch,
        "import_seconds": round(imported - start, 5),
        "engine_seconds": round(made - imported, 5),
        "traces_seconds": round(done - made, 5),
        "open_seconds": round(done - imported, 5),
        "traces": len(opened),
        "segments": sum(len(layers) for o in opened for layers in o.segments.values()),
        "mapped_bytes": sum(o.mapped for o in opened),
        "read_bytes": sum(o.read_bytes for o in opened),
        "rebuilt": [f"{o.name}: {o.rebuilt}" for o in opened if o.rebuilt],
    }


# -- recompute ----------------------------------------------------------------------------------


def recompute(args: argparse.Namespace) -> dict[str, Any]:
    """The relation updated and the query recomputed from scratch by Spark SQL (see above)."""
    start = clock.perf_counter()
    from pyspark.sql import functions as F

    from wcoj_core import spark as wspark
    from wcoj_core.query.builtins import resolve_query
    from wcoj_core.reference import reference_sql
    from wcoj_core.updates import consolidate

    query = resolve_query(args.query)
    spark = wspark.session(args.master, app_name="wcoj-bench-recompute", quiet=True)
    started = clock.perf_counter()
    relation = spark.read.parquet(args.relation)
    if args.changes:
        changes = spark.read.csv(args.changes, header=True, schema="c0 LONG, c1 LONG, diff LONG")
        flipped = changes.select(F.col("c1").alias("c0"), F.col("c0").alias("c1"), "diff")
        both = changes.unionByName(flipped).where(F.col("c0") != F.col("c1"))
        relation = consolidate(relation.unionByName(both), ["c0", "c1"])
    relation.write.parquet(args.out_relation)
    (rel,) = query.relations
    table = spark.read.parquet(args.out_relation)
    spark.sql(reference_sql(query), None, **{f"r_{rel}": table}).write.parquet(args.output)
    row = spark.read.parquet(args.output).agg(F.sum("diff").alias("n")).first()
    count = int(row["n"] or 0) if row is not None else 0
    done = clock.perf_counter()
    jvm: Any = spark.sparkContext._jvm
    system = jvm.java.lang.System
    java = f"{system.getProperty('java.runtime.name')} {system.getProperty('java.version')}"
    spark.stop()
    return {
        "probe": "recompute",
        "count": count,
        "java": java,
        "spark_start_seconds": round(started - start, 3),
        "work_seconds": round(done - started, 3),
    }


# -- warm ---------------------------------------------------------------------------------------


def warm(args: argparse.Namespace) -> dict[str, Any]:
    """Epochs applied one after the other in this process, each timed (its files read first)."""
    from wcoj_core.engine import Engine
    from wcoj_core.input_read import read_local
    from wcoj_core.query.builtins import resolve_query

    query = resolve_query(args.query)
    (rel,) = query.relations
    engine = Engine(
        None, args.state, query, relations=_specs(query, args.undirected, args.bag), create=False
    )
    tables = [read_local(path, query.relations[rel], rel) for path in args.changes]
    epochs = []
    for i, table in enumerate(tables):
        start = clock.perf_counter()
        result = engine.apply(args.first + i, {rel: table})
        seconds = clock.perf_counter() - start
        epochs.append(
            {
                "epoch": args.first + i,
                "seconds": round(seconds, 5),
                "phases": {k: round(v, 5) for k, v in result.metrics.seconds.items()},
                "count": result.count(query.name),
                "change_rows": result.metrics.outputs.get(query.name, 0),
                "deployment": result.metrics.deployment,
            }
        )
    return {"probe": "warm", "epochs": epochs}


# -- triangles ----------------------------------------------------------------------------------


def forward_triangles(src: Any, dst: Any, wedges_at_once: int = 1 << 25) -> int:
    """The triangles of an undirected simple graph (each edge once, any direction, no loops),
    counted by the *forward* algorithm in numpy, independently of wcoj's kernel: edges are
    oriented from the lower to the higher (degree, id) rank, and every pair of one vertex's
    out-neighbours (a wedge) is looked up among the edges. Degree order keeps a vertex's
    out-degree below ``sqrt(2m)``; wedges are made `wedges_at_once` at a time, so memory stays
    linear in the edges.

    >>> import numpy as np
    >>> forward_triangles(np.array([0, 0, 1, 1, 2]), np.array([1, 2, 2, 3, 3]))
    2
    """
    import numpy as np

    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    ids, index = np.unique(np.concatenate([src, dst]), return_inverse=True)
    n = len(ids)
    a, b = index[: len(src)], index[len(src) :]
    degree = np.bincount(np.concatenate([a, b]), minlength=n)
    rank = np.empty(n, dtype=np.int64)
    rank[np.lexsort((np.arange(n), degree))] = np.arange(n)
    ra, rb = rank[a], rank[b]
    lo, hi = np.minimum(ra, rb), np.maximum(ra, rb)
    keys = np.unique(lo * n + hi)  # sorted; duplicates (both directions listed) merged
    del src, dst, index, a, b, ra, rb, lo, hi
    tail, head = keys // n, keys % n
    starts = np.searchsorted(tail, np.arange(n + 1))
    after = starts[tail + 1] - np.arange(len(keys)) - 1  # out-neighbours after each edge's
    found = 0
    edge = 0
    while edge < len(keys):
        # Edges edge..stop: their wedges (head of the edge, each later out-neighbour of its tail).
        total = np.cumsum(after[edge:])
        stop = edge + max(1, int(np.searchsorted(total, wedges_at_once, "right")))
        sizes = after[edge:stop]
        firsts = np.repeat(head[edge:stop], sizes)
        offsets = np.arange(edge, stop) + 1 - (np.cumsum(sizes) - sizes)
        seconds = head[np.arange(int(sizes.sum()), dtype=np.int64) + np.repeat(offsets, sizes)]
        probe = np.minimum(firsts, seconds) * n + np.maximum(firsts, seconds)
        at = np.minimum(np.searchsorted(keys, probe), len(keys) - 1)
        found += int(np.count_nonzero(keys[at] == probe))
        edge = stop
    return found


def count_cliques(edges: Any, k: int) -> int:
    """The k-cliques of an undirected graph given as edge pairs (loops and repeats ignored),
    counted independently of wcoj: vertices in (degree, id) order, each one's higher
    neighbours as a set, cliques grown by intersecting them (pure Python).

    >>> count_cliques([(0, 1), (0, 2), (1, 2), (1, 3), (2, 3), (0, 3)], 4)
    1
    >>> count_cliques([(0, 1), (0, 2), (1, 2), (1, 3), (2, 3)], 3)
    2
    """
    adj: dict[int, set[int]] = {}
    for a, b in edges:
        if a != b:
            adj.setdefault(a, set()).add(b)
            adj.setdefault(b, set()).add(a)
    rank = {v: i for i, v in enumerate(sorted(adj, key=lambda v: (len(adj[v]), v)))}
    higher = {v: {w for w in ns if rank[w] > rank[v]} for v, ns in adj.items()}

    def grow(candidates: set[int], left: int) -> int:
        if left == 1:
            return len(candidates)
        return sum(grow(candidates & higher[v], left - 1) for v in candidates)

    return sum(grow(higher[v], k - 1) for v in higher) if k > 1 else len(adj)


def triangles(args: argparse.Namespace) -> dict[str, Any]:
    """The triangles of the graph after the epochs' changes: scipy's count, or with
    ``--method forward`` the forward algorithm's (`forward_triangles`: memory linear in the
    edges, for graphs whose wedges scipy's product cannot hold)."""
    if args.method == "forward":
        return _forward(args)
    import numpy as np
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    from scipy import sparse

    edges = pq.read_table(args.edges)
    src = edges.column("c0").to_numpy()
    dst = edges.column("c1").to_numpy()
    present = dict.fromkeys(zip(src.tolist(), dst.tolist(), strict=True), 1)
    for path in args.changes:
        change = pacsv.read_csv(path)
        for a, b, d in zip(
            *(change.column(c).to_pylist() for c in ("c0", "c1", "diff")), strict=True
        ):
            key = (min(a, b), max(a, b))
            if d > 0:
                present[key] = 1
            else:
                present.pop(key, None)
    pairs = np.array(list(present), dtype=np.int64).reshape(-1, 2)
    ids, index = np.unique(pairs.ravel(), return_inverse=True)
    index = index.reshape(-1, 2)
    n = len(ids)
    upper = sparse.csr_matrix(
        (np.ones(len(pairs), dtype=np.int64), (index[:, 0], index[:, 1])), shape=(n, n)
    )
    return {"probe": "triangles", "count": int(upper.multiply(upper @ upper).sum())}


def _forward(args: argparse.Namespace) -> dict[str, Any]:
    """`triangles` by the forward algorithm; the epochs' changes applied with numpy."""
    import numpy as np
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    start = clock.perf_counter()
    edges = pq.read_table(args.edges, columns=["c0", "c1"])
    src = edges.column("c0").to_numpy()
    dst = edges.column("c1").to_numpy()
    del edges
    if args.changes:
        width = int(max(src.max(), dst.max())) + 1
        for path in args.changes:
            change = pacsv.read_csv(path)
            c0, c1, d = (change.column(c).to_numpy() for c in ("c0", "c1", "diff"))
            width = max(width, int(max(c0.max(), c1.max())) + 1)
        keys = np.minimum(src, dst) * width + np.maximum(src, dst)
        for path in args.changes:
            change = pacsv.read_csv(path)
            c0, c1, d = (change.column(c).to_numpy() for c in ("c0", "c1", "diff"))
            changed = np.minimum(c0, c1) * width + np.maximum(c0, c1)
            keys = keys[~np.isin(keys, changed[d < 0])]
            keys = np.union1d(keys, changed[d > 0])
        src, dst = keys // width, keys % width
    count = forward_triangles(src, dst)
    return {
        "probe": "triangles",
        "method": "forward",
        "count": count,
        "seconds": round(clock.perf_counter() - start, 3),
    }


# -- static --------------------------------------------------------------------------------------


def static(args: argparse.Namespace) -> dict[str, Any]:
    """One static triangle count of a prepared graph, as ``wcoj-bench static`` runs the method:
    DuckDB's SQL over the oriented edges (``--edges``, each edge once, low first), or Spark
    SQL's binary plan over the symmetric table (``--symmetric``); the query alone timed inside,
    the process timed outside."""
    from wcoj_bench.parts.static import TRIANGLES_SQL

    start = clock.perf_counter()
    if args.method == "duckdb":
        import duckdb

        con = duckdb.connect()
        con.execute(
            f"CREATE TABLE edges AS SELECT c0 AS src, c1 AS dst FROM read_parquet('{args.edges}')"
        )
        loaded = clock.perf_counter()
        row = con.execute(TRIANGLES_SQL).fetchone()
        count = int(row[0]) if row is not None else 0
        con.close()
    else:
        from wcoj_core import spark as wspark
        from wcoj_core.query.builtins import builtin
        from wcoj_core.reference import reference_sql
        from wcoj_core.updates import total_diff

        spark = wspark.session(args.master, app_name="wcoj-bench-static", quiet=True)
        frame = spark.read.parquet(Path(args.symmetric).resolve().as_uri())  # relative paths too
        loaded = clock.perf_counter()
        query = builtin("triangles")
        count = total_diff(spark.sql(reference_sql(query), None, r_edge=frame))
        spark.stop()
    done = clock.perf_counter()
    return {
        "probe": "static",
        "method": args.method,
        "count": count,
        "query_seconds": round(done - loaded, 3),
        "seconds": round(done - start, 3),
    }


# -- generate -----------------------------------------------------------------------------------


def generate_graph(args: argparse.Namespace) -> dict[str, Any]:
    """A generated graph's canonical undirected edges (``c0 < c1``, each once) written by Spark
    as Parquet into ``--out`` (a 3 GiB heap: Spark spills its shuffle beyond it)."""
    from wcoj_core import spark as wspark
    from wcoj_core.generate import generate
    from wcoj_core.input_spark import canonical_undirected

    conf = {"spark.driver.memory": "3g"}
    spark = wspark.session(args.master, conf, app_name="wcoj-bench-prepare", quiet=True)
    edges = canonical_undirected(generate(spark, args.input)).select("c0", "c1")
    edges.write.parquet(Path(args.out).resolve().as_uri())
    spark.stop()
    return {"probe": "generate", "input": args.input, "out": args.out}


# -- prepare ------------------------------------------------------------------------------------


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    from wcoj_bench.infra.prepared import write_graph

    return write_graph(
        args.input, args.out, args.epochs_out, args.epochs, args.epoch_size, args.seed, args.master
    )


# -- the command --------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m wcoj_bench.infra.probes")
    sub = p.add_subparsers(dest="probe", required=True)
    pre = sub.add_parser("prepare")
    pre.add_argument("--input", required=True)
    pre.add_argument("--out", required=True)
    pre.add_argument("--epochs-out", required=True)
    pre.add_argument("--epochs", type=int, required=True)
    pre.add_argument("--epoch-size", type=int, required=True)
    pre.add_argument("--seed", type=int, default=1)
    pre.add_argument("--master")
    pre.set_defaults(run=prepare)
    for name, run in (("open", open_state), ("warm", warm)):
        q = sub.add_parser(name)
        q.add_argument("--state", required=True)
        q.add_argument("--query", default="triangles")
        q.add_argument("--undirected", action="append", default=[])
        q.add_argument("--bag", action="append", default=[])
        q.set_defaults(run=run)
        if name == "warm":
            q.add_argument("--first", type=int, required=True)
            q.add_argument("--changes", nargs="+", required=True)
    rec = sub.add_parser("recompute")
    rec.add_argument("--relation", required=True)
    rec.add_argument("--out-relation", required=True)
    rec.add_argument("--output", required=True)
    rec.add_argument("--changes")
    rec.add_argument("--query", default="triangles")
    rec.add_argument("--master")
    rec.set_defaults(run=recompute)
    gen = sub.add_parser("generate")
    gen.add_argument("--input", required=True)
    gen.add_argument("--out", required=True)
    gen.add_argument("--master")
    gen.set_defaults(run=generate_graph)
    sta = sub.add_parser("static")
    sta.add_argument("--method", choices=("duckdb", "spark-sql"), required=True)
    sta.add_argument("--edges", required=True)
    sta.add_argument("--symmetric", required=True)
    sta.add_argument("--master")
    sta.set_defaults(run=static)
    tri = sub.add_parser("triangles")
    tri.add_argument("--edges", required=True)
    tri.add_argument("--changes", nargs="*", default=[])
    tri.add_argument("--method", choices=("scipy", "forward"), default="scipy")
    tri.set_defaults(run=triangles)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _emit(args.run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
