"""`wcoj-bench static`: one whole graph counted by wcoj and by the usual alternatives — checked, then timed.

The input. Every relation is read once and written as Parquet under the state directory, before
any timing. A relation read with ``--undirected`` is the set of its undirected edges, and every
method counts over that set: the Spark methods read it as its symmetric table (both directions of
each edge, loop-free: their binary plans run over the symmetric set); wcoj reads each edge once
(``c0 < c1``) and declares the relation an undirected set, as ``wcoj count --undirected`` does —
the engine reads the edges in both directions itself. Any other relation is read as it is, by
every method. The single-machine methods get the same graph as its canonical undirected edge list
(``src < dst``, each edge once), collected once, outside the timing, as numpy arrays and a
Parquet file.

The methods, each counting the query's output (the sum of its multiplicities):

* **wcoj** — exactly what `wcoj count` runs (no ``--state``, no ``--output``): the whole input
  evaluated as epoch 0 of a fresh, empty state that keeps nothing (`Engine.evaluate` with
  ``count_only``: an output whose bindings are distinct is counted by the kernel, never made),
  the count read from the epoch's figures. Its kernel runs where ``--deploy`` says (default
  ``auto``: on the driver when the relations fit its limits).
* **wcoj-apply** — the same input applied as one epoch and committed (batches written, the
  output written; no index files): what ``wcoj count --state DIR`` runs.
* **wcoj-executors** — the same with the kernel in Spark's executors (one job, the traces read
  by every task), what a state too large for the driver, or on a cluster's storage, gets.
* **spark-sql** — Spark SQL's plan for the binary-join query `wcoj_core.reference` writes (one
  self-join per atom, a ``GROUP BY`` of the head), then summed.
* **neighbour-array** — the neighbour-array intersection of GraphFrames' triangle count, on
  Spark DataFrames: orient every edge from its lower to its higher endpoint, collect each
  vertex's set of higher neighbours, and for every edge add the size of the intersection of its
  two endpoints' sets (each triangle ``a < b < c`` is found once, on its edge ``a b``).
* **wcoj-count** — the whole ``wcoj count`` process, exec to exit, reading the input files
  itself (``--json``; its own ``seconds``, landing and rules, are kept too): what a user runs.
* **wcoj-count-baseline** — the same command from another checkout (``--baseline-wcoj CMD``,
  e.g. main's kernel before a change), in the same run: a before/after on the same machine
  at the same load.
* **duckdb** — DuckDB's SQL triangle query (two joins on the oriented edge table).
* **kuzu** — Kùzu's Cypher triangle pattern over the oriented edges.
* **scipy** — a sparse-matrix count: ``sum((U @ U) ∘ U)`` for the upper-triangular adjacency
  matrix ``U`` (the machine's practical limit for a single-threaded count), timed from the
  deduplicated edge array (each undirected edge in both directions, as ``wcoj count`` lands
  them) through orientation (``src < dst``), relabelling, the CSR build and the masked product.
* **tc** — the peer C counter (`wcoj_bench.infra.peer`: ``../shared/peers/tc.c``, built with the
  machine's C compiler, OpenMP when it has it): (degree, id) orientation and sorted-list merges,
  on the same deduplicated edges written as ``uint32`` pairs; timed exec to exit (after one
  untimed warm-up run). Without a compiler it is skipped with a one-line reason.

The last five count undirected triangles only: they refuse any query other than the built-in
``triangles`` over a relation read with ``--undirected``. What is timed: for the Spark methods,
from DataFrames over the input Parquet to the count on the driver (after one untimed warm-up
run each, so that the JVM's code generation is not charged to the first method); for duckdb and
kuzu, the query alone — loading the edges into DuckDB's table and Kùzu's node and relationship
tables happens before, untimed; for scipy, from the deduplicated edge array (above); for the
``wcoj count`` and ``tc`` processes, exec to exit (after one untimed warm-up run each: the input's pages
in the page cache, the kernel's compiled module loaded once). Between Spark runs Spark's cache is cleared, untimed, so no run reads
what an earlier one kept.

Every run of every method must give the same count as the first run; one that does not stops the
benchmark with a `BenchError` naming both methods and counts, before anything is reported.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import time as clock
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from wcoj_bench.infra.measure import BenchError, MemoryWatch, SparkMeter
from wcoj_bench.infra.peer import PeerMissing, build_tc, run_tc, write_pairs
from wcoj_bench.parts.epochs import specs_for
from wcoj_core.engine import Engine
from wcoj_core.input_spark import canonical_undirected
from wcoj_core.meaning import Meaning
from wcoj_core.query.builtins import builtin
from wcoj_core.query.ir import Atom, Filter, Query, Term, Var
from wcoj_core.query.plan import counted
from wcoj_core.reference import reference_sql
from wcoj_core.updates import total_diff


class Runtime(Enum):
    """Where a method runs: in Spark (warmed up, join rows measured), on the driver alone, or
    as a process of its own (warmed up)."""

    SPARK = "spark"
    LOCAL = "local"
    PROCESS = "process"


@dataclass(frozen=True, slots=True)
class StaticMethod:
    name: str
    runtime: Runtime
    triangles_only: bool
    package: str | None = None  # the PyPI package (from the `bench` extra) it needs


STATIC_METHODS: dict[str, StaticMethod] = {
    m.name: m
    for m in (
        StaticMethod("wcoj", Runtime.SPARK, triangles_only=False),
        StaticMethod("wcoj-apply", Runtime.SPARK, triangles_only=False),
        StaticMethod("wcoj-executors", Runtime.SPARK, triangles_only=False),
        StaticMethod("wcoj-count", Runtime.PROCESS, triangles_only=False),
        StaticMethod("wcoj-count-baseline", Runtime.PROCESS, triangles_only=False),
        StaticMethod("spark-sql", Runtime.SPARK, triangles_only=False),
        StaticMethod("neighbour-array", Runtime.SPARK, triangles_only=True),
        StaticMethod("duckdb", Runtime.LOCAL, triangles_only=True, package="duckdb"),
        StaticMethod("kuzu", Runtime.LOCAL, triangles_only=True, package="kuzu"),
        StaticMethod("scipy", Runtime.LOCAL, triangles_only=True, package="scipy"),
        StaticMethod("tc", Runtime.PROCESS, triangles_only=True),
    )
}
STATIC_DEFAULT = tuple(m for m in STATIC_METHODS if m != "wcoj-count-baseline")


@dataclass(frozen=True, slots=True)
class CountCommand:
    """How the process methods run ``wcoj count``: the query and inputs as given on the command
    line (relation -> file or generator spec), the undirected relations, and the program of
    the baseline (None: no baseline)."""

    query: str
    inputs: Mapping[str, str]
    undirected: tuple[str, ...]
    baseline: tuple[str, ...] | None = None

    def argv(self, program: Sequence[str]) -> list[str]:
        args = [*program, "count", "--query", self.query]
        for rel, path in sorted(self.inputs.items()):
            args += ["--input", f"{rel}={path}"]
        for rel in self.undirected:
            args += ["--undirected", rel]
        return [*args, "--json"]


def wcoj_program() -> tuple[str, ...]:
    """The ``wcoj`` program installed with this Python (a user's command)."""
    beside = Path(sys.executable).with_name("wcoj")
    return (str(beside),) if beside.exists() else (sys.executable, "-m", "wcoj_core.cli")


# -- which queries the methods take ------------------------------------------------------------


def triangle_relation(query: Query, undirected: frozenset[str]) -> str | None:
    """The relation of `query` if it is the built-in undirected triangles over it, else None.

    Variables and the relation may be named differently; atoms and filters may come in any order.

    >>> from wcoj_core.query.parse import parse_query
    >>> q = parse_query("t(x, y, z) :- g(y, z), g(x, y), g(x, z), y < z, x < y")
    >>> triangle_relation(q, frozenset({"g"})), triangle_relation(q, frozenset())
    ('g', None)
    >>> triangle_relation(builtin("directed-triangles"), frozenset({"edge"})) is None
    True
    """
    model = builtin("triangles")
    if len(query.relations) != 1 or len(set(query.head)) != len(model.head):
        return None
    rel = next(iter(query.relations))
    if rel not in undirected:
        return None
    names = dict(zip(query.head, model.head, strict=True))

    def term(t: Term) -> Term:
        return names.get(t, t) if isinstance(t, Var) else t

    atoms = {Atom(model.atoms[0].relation, tuple(term(t) for t in a.terms)) for a in query.atoms}
    filters = {Filter(term(f.left), f.op, term(f.right)) for f in query.filters}
    return rel if atoms == set(model.atoms) and filters == set(model.filters) else None


def check_methods(
    methods: Sequence[str], query: Query, undirected: frozenset[str]
) -> tuple[str, ...]:
    """The methods to run, in order; refuse unknown ones, missing packages and unsupported queries."""
    chosen = tuple(dict.fromkeys(methods))
    unknown = [m for m in chosen if m not in STATIC_METHODS]
    if unknown:
        raise BenchError(
            f"unknown static methods {unknown}; choose from {', '.join(STATIC_METHODS)}"
        )
    if "wcoj" not in chosen:
        raise BenchError("the static benchmark compares the other methods with wcoj; include it")
    picky = [m for m in chosen if STATIC_METHODS[m].triangles_only]
    if picky and triangle_relation(query, undirected) is None:
        hint = (
            f"read relation {next(iter(query.relations))!r} with --undirected"
            if len(query.relations) == 1 and not undirected
            else "run this query with --methods wcoj,spark-sql"
        )
        raise BenchError(
            f"method(s) {', '.join(picky)} count undirected triangles only (the built-in "
            f"'triangles' query over a relation read with --undirected), and query "
            f"{query.name} is not that; {hint}"
        )
    for m in chosen:
        package = STATIC_METHODS[m].package
        if package is not None and importlib.util.find_spec(package) is None:
            raise BenchError(
                f"method {m} needs the Python package {package!r}, which is not installed; "
                "install the benchmark's extra: pip install 'wcoj[bench]'"
            )
    return chosen


# -- the inputs --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EdgeList:
    """The canonical undirected edges (``src < dst``, each once), in memory and as Parquet."""

    src: np.ndarray
    dst: np.ndarray
    parquet: Path


class StaticInputs:
    """The query's relations, materialized as Parquet once; the edge list, collected on demand."""

    def __init__(
        self,
        spark: SparkSession,
        query: Query,
        relations: Mapping[str, DataFrame],
        undirected: frozenset[str],
        root: Path,
        deployment: str = "auto",
        command: CountCommand | None = None,
    ) -> None:
        self.spark = spark
        self.query = query
        self.root = root
        self.deployment = deployment  # where the `wcoj` method's kernel runs
        self.command = command  # how the process methods run `wcoj count`
        self.specs = specs_for(query, undirected, Meaning.SET)
        # What the Spark methods read (an undirected relation symmetric), and what wcoj reads
        # (an undirected relation's edges once).
        self.frames: dict[str, DataFrame] = {}
        self.once: dict[str, DataFrame] = {}
        self.rows: dict[str, int] = {}
        for rel in sorted(query.relations):
            df = relations[rel]
            path = str(root / "input" / rel)
            if rel in undirected:
                edges = canonical_undirected(df)
                edges.write.parquet(f"{path}-once")
                self.once[rel] = spark.read.parquet(f"{path}-once")
                # Both directions of each edge (the set holds no loop and each edge once).
                backward = self.once[rel].select(
                    F.col("c1").alias("c0"), F.col("c0").alias("c1"), "diff"
                )
                df = self.once[rel].unionByName(backward)
            df.write.parquet(path)
            self.frames[rel] = spark.read.parquet(path)
            self.once.setdefault(rel, self.frames[rel])
            self.rows[rel] = self.frames[rel].count()
        self._edges: EdgeList | None = None

    def edges(self) -> EdgeList:
        if self._edges is None:
            import pyarrow as pa
            import pyarrow.parquet as pq

            (rel,) = self.query.relations
            oriented = self.frames[rel].where(F.col("c0") < F.col("c1"))
            table = oriented.select(F.col("c0").alias("src"), F.col("c1").alias("dst")).toArrow()
            src = table.column("src").to_numpy().astype(np.int64)
            dst = table.column("dst").to_numpy().astype(np.int64)
            path = self.root / "local" / "edges.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"src": src, "dst": dst}), path)
            self._edges = EdgeList(src, dst, path)
        return self._edges


# -- the methods -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Runner:
    """One method, ready: `run` is what is timed; `after` runs untimed after each run."""

    run: Callable[[], int]
    after: Callable[[], None] = lambda: None
    close: Callable[[], None] = lambda: None
    phases: list[dict[str, float]] = field(default_factory=lambda: [])
    # Per run, the join rows the method counted itself (the kernel's lookups), which Spark's
    # SQL metrics cannot see; where wcoj's kernel ran; a process's own seconds (its --json).
    own_rows: list[int] = field(default_factory=lambda: [])
    deployments: list[str] = field(default_factory=lambda: [])
    own_seconds: list[float] = field(default_factory=lambda: [])


def _wcoj(inputs: StaticInputs, deployment: str | None = None, *, apply: bool = False) -> Runner:
    where = deployment or inputs.deployment
    runs = inputs.root / ("wcoj" if deployment is None else f"wcoj-{deployment}")
    runs = runs.with_name(runs.name + "-apply") if apply else runs
    phases: list[dict[str, float]] = []
    own_rows: list[int] = []
    deployments: list[str] = []

    def run() -> int:
        state = runs / f"run-{len(phases)}"
        undirected = [r for r, s in inputs.specs.items() if s.undirected]
        query = inputs.query if apply else counted(inputs.query, undirected)
        engine = Engine(inputs.spark, str(state), query, relations=inputs.specs, deployment=where)
        engine.persist_index = False  # as `wcoj count` without --state
        if apply:
            result = engine.apply(0, dict(inputs.once))
        else:
            result = engine.evaluate(dict(inputs.once), count_only=True)
        phases.append(result.metrics.seconds)
        own_rows.append(result.metrics.join_rows)
        deployments.append(result.metrics.deployment)
        return result.count(inputs.query.name)

    def after() -> None:
        inputs.spark.catalog.clearCache()
        shutil.rmtree(runs, ignore_errors=True)

    return Runner(run, after, phases=phases, own_rows=own_rows, deployments=deployments)


def _spark_sql(inputs: StaticInputs) -> Runner:
    def run() -> int:
        frames = {f"r_{rel}": df for rel, df in inputs.frames.items()}
        return total_diff(inputs.spark.sql(reference_sql(inputs.query), None, **frames))

    return Runner(run, inputs.spark.catalog.clearCache)


def _neighbour_array(inputs: StaticInputs) -> Runner:
    (rel,) = inputs.query.relations

    def run() -> int:
        # Each edge once, from its lower to its higher endpoint.
        edges = inputs.frames[rel].where(F.col("c0") < F.col("c1")).select("c0", "c1")
        # Every vertex with its set of higher neighbours.
        higher = edges.groupBy("c0").agg(F.collect_set("c1").alias("nbrs"))
        low = higher.select(F.col("c0").alias("u"), F.col("nbrs").alias("u_nbrs"))
        high = higher.select(F.col("c0").alias("v"), F.col("nbrs").alias("v_nbrs"))
        # Edge u < v closes a triangle with every w > v in both sets.
        pairs = edges.select(F.col("c0").alias("u"), F.col("c1").alias("v"))
        shared = pairs.join(low, "u").join(high, "v")
        row = shared.agg(
            F.sum(F.size(F.array_intersect("u_nbrs", "v_nbrs"))).alias("triangles")
        ).first()
        return int(row["triangles"] or 0) if row is not None else 0

    return Runner(run, inputs.spark.catalog.clearCache)


TRIANGLES_SQL = """
SELECT count(*)
FROM edges AS ab
JOIN edges AS bc ON bc.src = ab.dst
JOIN edges AS ac ON ac.src = ab.src AND ac.dst = bc.dst
"""


def _duckdb(inputs: StaticInputs) -> Runner:
    import duckdb

    edges = inputs.edges()
    con = duckdb.connect()
    con.execute(f"CREATE TABLE edges AS SELECT src, dst FROM read_parquet('{edges.parquet}')")

    def run() -> int:
        row = con.execute(TRIANGLES_SQL).fetchone()
        return int(row[0]) if row is not None else 0

    return Runner(run, close=con.close)


TRIANGLES_CYPHER = "MATCH (a:V)-[:E]->(b:V)-[:E]->(c:V), (a)-[:E]->(c) RETURN count(*)"


def _kuzu(inputs: StaticInputs) -> Runner:
    import kuzu
    import pyarrow as pa
    import pyarrow.parquet as pq

    edges = inputs.edges()
    folder = inputs.root / "local" / "kuzu"
    folder.mkdir(parents=True)
    nodes = folder / "nodes.parquet"
    pq.write_table(pa.table({"id": np.unique(np.concatenate([edges.src, edges.dst]))}), nodes)
    db = kuzu.Database(str(folder / "db"), buffer_pool_size=2 << 30)
    con = kuzu.Connection(db)
    for statement in (
        "CREATE NODE TABLE V(id INT64, PRIMARY KEY(id))",
        "CREATE REL TABLE E(FROM V TO V)",
        f"COPY V FROM '{nodes}'",
        f"COPY E FROM '{edges.parquet}'",
    ):
        con.execute(statement)

    def run() -> int:
        result = con.execute(TRIANGLES_CYPHER)
        assert not isinstance(result, list)
        row: list[Any] = result.get_next()  # pyright: ignore[reportAssignmentType]
        return int(row[0])

    def close() -> None:
        con.close()
        db.close()

    return Runner(run, close=close)


def _scipy(inputs: StaticInputs) -> Runner:
    from scipy import sparse

    edges = inputs.edges()
    # The deduplicated edge array as wcoj lands it: every undirected edge in both directions.
    both_src = np.concatenate([edges.src, edges.dst])
    both_dst = np.concatenate([edges.dst, edges.src])

    def run() -> int:
        upward = both_src < both_dst  # orientation: each edge once, from its lower end
        src, dst = both_src[upward], both_dst[upward]
        ids, index = np.unique(np.concatenate([src, dst]), return_inverse=True)
        m = len(src)
        n = len(ids)
        upper = sparse.csr_matrix(
            (np.ones(m, dtype=np.int64), (index[:m], index[m:])), shape=(n, n)
        )
        return int(upper.multiply(upper @ upper).sum())

    return Runner(run)


def _tc(inputs: StaticInputs) -> Runner:
    program = build_tc()
    edges = inputs.edges()
    pairs = inputs.root / "local" / "edges.u32"
    write_pairs(edges.src, edges.dst, pairs)
    return Runner(partial(run_tc, program, pairs))


def _wcoj_count(inputs: StaticInputs, baseline: bool = False) -> Runner:
    command = inputs.command
    if command is None:
        raise BenchError("the wcoj-count methods need the command line's query and inputs")
    program = command.baseline if baseline else wcoj_program()
    if program is None:
        raise BenchError("method wcoj-count-baseline needs --baseline-wcoj CMD")
    argv = command.argv(program)
    phases: list[dict[str, float]] = []
    own: list[float] = []
    runs = inputs.root / ("count-baseline" if baseline else "count")
    runs.mkdir(parents=True, exist_ok=True)

    def run() -> int:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=runs)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise BenchError(f"{' '.join(argv[:2])} count failed ({done.returncode}): {tail}")
        data = json.loads(done.stdout.strip().splitlines()[-1])
        own.append(float(data["seconds"]))
        phases.append(data["metrics"]["seconds"])
        return int(data["count"])

    return Runner(run, phases=phases, own_seconds=own)


PREPARE: dict[str, Callable[[StaticInputs], Runner]] = {
    "wcoj": _wcoj,
    "wcoj-apply": partial(_wcoj, apply=True),
    "wcoj-executors": partial(_wcoj, deployment="executors"),
    "spark-sql": _spark_sql,
    "neighbour-array": _neighbour_array,
    "duckdb": _duckdb,
    "kuzu": _kuzu,
    "scipy": _scipy,
    "tc": _tc,
    "wcoj-count": _wcoj_count,
    "wcoj-count-baseline": partial(_wcoj_count, baseline=True),
}


# -- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StaticRun:
    """One run of one method, as reported while the benchmark goes (`run` 0 is a warm-up)."""

    method: str
    run: int
    runs: int
    seconds: float
    count: int
    join_rows: int | None

    @property
    def warm_up(self) -> bool:
        return self.run == 0


@dataclass
class StaticMethodResult:
    name: str
    count: int
    seconds: list[float]
    join_rows: int | None
    warm_up_seconds: float | None
    phases: dict[str, float] | None = None
    # The largest Spark Python worker on this machine during the method's runs, and where
    # wcoj's kernel ran (its deployments).
    peak_worker_rss_bytes: int | None = None
    deployments: tuple[str, ...] = ()
    # A process method's own seconds per timed run (its --json seconds).
    own_seconds: list[float] = field(default_factory=lambda: [])

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


@dataclass
class StaticResult:
    query: str
    count: int
    repeat: int
    input_rows: dict[str, int]
    undirected_edges: int | None
    methods: dict[str, StaticMethodResult]
    skipped: dict[str, str] = field(default_factory=lambda: {})  # method -> why

    def ratio(self, method: str) -> float:
        """How many times longer `method` took than wcoj (median against median)."""
        return round(self.methods[method].median / self.methods["wcoj"].median, 3)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "command": "bench",
            "mode": "static",
            "query": self.query,
            "count": self.count,
            "check": "passed",
            "repeat": self.repeat,
            "input_rows": self.input_rows,
            "undirected_edges": self.undirected_edges,
            "skipped": self.skipped,
            "methods": {
                name: {
                    "median_seconds": round(m.median, 3),
                    "seconds": [round(s, 3) for s in m.seconds],
                    "warm_up_seconds": (
                        None if m.warm_up_seconds is None else round(m.warm_up_seconds, 3)
                    ),
                    "count": m.count,
                    "join_rows": m.join_rows,
                    "ratio_to_wcoj": self.ratio(name),
                    "peak_worker_rss_bytes": m.peak_worker_rss_bytes,
                    **({"phases": m.phases} if m.phases is not None else {}),
                    **({"deployments": list(m.deployments)} if m.deployments else {}),
                    **(
                        {
                            "own_seconds": [round(x, 3) for x in m.own_seconds],
                            "own_median_seconds": round(statistics.median(m.own_seconds), 3),
                        }
                        if m.own_seconds
                        else {}
                    ),
                }
                for name, m in self.methods.items()
            },
        }
        for other, key in (("spark-sql", "spark_sql"), ("neighbour-array", "neighbour_array")):
            if other in self.methods:
                out[f"speedup_vs_{key}"] = self.ratio(other)
        count = self.methods.get("wcoj-count")
        if count is not None and count.own_seconds and "scipy" in self.methods:
            # issue 29: `wcoj count`'s own seconds against scipy's, in the same run
            own = statistics.median(count.own_seconds)
            out["count_seconds_over_scipy"] = round(own / self.methods["scipy"].median, 3)
        if "tc" in self.methods:
            # issue 47: against the peer's whole process, in the same run
            tc = self.methods["tc"].median
            out["wcoj_over_tc"] = round(self.methods["wcoj"].median / tc, 2)
            if count is not None and count.own_seconds:
                out["count_seconds_over_tc"] = round(statistics.median(count.own_seconds) / tc, 2)
                out["count_process_over_tc"] = round(count.median / tc, 2)
        base = self.methods.get("wcoj-count-baseline")
        if count is not None and base is not None:
            out["count_speedup_vs_baseline"] = round(base.median / count.median, 3)
        return out


def static_bench(
    spark: SparkSession,
    query: Query,
    relations: Mapping[str, DataFrame],
    state_dir: str,
    *,
    undirected: frozenset[str] = frozenset(),
    methods: Sequence[str] = STATIC_DEFAULT,
    repeat: int = 3,
    on_run: Callable[[StaticRun], None] | None = None,
    deployment: str = "auto",
    command: CountCommand | None = None,
) -> StaticResult:
    """Count `query` over whole relations with every method, `repeat` timed runs each (the
    `wcoj` method's kernel where `deployment` says; the process methods run `command`)."""
    if repeat < 1:
        raise BenchError(f"--repeat must be at least 1, got {repeat}")
    chosen = check_methods(methods, query, undirected)
    inputs = StaticInputs(
        spark, query, relations, undirected, Path(state_dir) / "static", deployment, command
    )
    meter = SparkMeter(spark)
    watch = MemoryWatch()
    expected: tuple[str, int] | None = None
    results: dict[str, StaticMethodResult] = {}
    skipped: dict[str, str] = {}
    for name in chosen:
        method = STATIC_METHODS[name]
        try:
            runner = PREPARE[name](inputs)
        except PeerMissing as missing:
            skipped[name] = str(missing)
            continue
        first = 1 if method.runtime is Runtime.LOCAL else 0
        seconds: list[float] = []
        warm_up: float | None = None
        rows: int | None = None
        count = 0
        try:
            for k in range(first, repeat + 1):
                mark = meter.mark()
                with watch.watching(name):
                    start = clock.perf_counter()
                    count = runner.run()
                    took = clock.perf_counter() - start
                if method.runtime is Runtime.SPARK:
                    rows = meter.since(mark)[0] + (runner.own_rows[-1] if runner.own_rows else 0)
                runner.after()
                if expected is None:
                    expected = (name, count)
                elif count != expected[1]:
                    raise BenchError(
                        f"the methods disagree: {name} counted {count} "
                        f"({'warm-up' if k == 0 else f'run {k}'}), {expected[0]} counted "
                        f"{expected[1]}; nothing is reported"
                    )
                if k == 0:
                    warm_up = took
                else:
                    seconds.append(took)
                if on_run is not None:
                    on_run(StaticRun(name, k, repeat, took, count, rows))
        finally:
            runner.close()
        results[name] = StaticMethodResult(
            name,
            count,
            seconds,
            rows,
            warm_up,
            phases=_median_phases(runner.phases[1 - first :]) if runner.phases else None,
            peak_worker_rss_bytes=watch.worker_peaks.get(name),
            deployments=tuple(sorted(set(runner.deployments))),
            own_seconds=runner.own_seconds[1 - first :],
        )
    watch.close()
    assert expected is not None
    collected = any(STATIC_METHODS[m].runtime is Runtime.LOCAL or m == "tc" for m in chosen)
    return StaticResult(
        query=query.name,
        count=expected[1],
        repeat=repeat,
        input_rows=inputs.rows,
        undirected_edges=len(inputs.edges().src) if collected else None,
        methods=results,
        skipped=skipped,
    )


def _median_phases(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each engine phase's median seconds over the timed runs."""
    return {k: round(statistics.median(r.get(k, 0.0) for r in runs), 4) for k in runs[0]}


__all__ = [
    "STATIC_DEFAULT",
    "STATIC_METHODS",
    "CountCommand",
    "StaticResult",
    "StaticRun",
    "check_methods",
    "static_bench",
    "triangle_relation",
]
