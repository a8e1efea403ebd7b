"""Graphs, epoch files and built states for the benchmarks that time whole processes; cached.

A **prepared graph** (`PreparedGraph`) is a folder per input holding

* ``edges.parquet`` — the input's undirected edges, each once as ``(low, high)`` with diff 1
  (self-loops dropped, duplicates and both directions merged: the set ``--undirected`` means);
* ``symmetric.parquet`` — the same set in both directions: the table a Spark SQL recompute
  keeps and joins (the binary plan over the symmetric set);
* ``graph.json`` — the input, its edges and vertices;

and, in a subfolder per (epochs, epoch size, seed), ``e-<t>.csv`` (``t`` = 1, 2, ...): epochs of
changes, header ``c0,c1,diff``. Half of each epoch deletes present edges, half inserts absent
ones, each edge named once in a random direction and in no other epoch. An inserted edge closes
a wedge (``a - b - c`` with ``a c`` absent: a friend of a friend), so inserts make triangles as
deletions remove them; a graph with too few wedges gets random absent pairs for the rest.

`write_graph` makes one (run as ``python -m wcoj_bench.probes prepare``: a generator needs
Spark, a file is read with pyarrow). A **base state** (`base_state`) is a state directory holding
a prepared graph as its first epochs, built by the real command line, ``wcoj apply``, in epochs of
at most `wcoj_bench.epochs.LOAD_ROWS` edges each (``wcoj apply`` refuses larger ones). Both are
cached under a scratch directory by a key of everything they depend on (for a state: the graph's
edges, the meaning and the source of `wcoj_core`, so a changed engine builds afresh; not the
epochs, so the parts that run other epochs on the same graph share its state). A benchmark never
applies epochs to a cached state: it works on a copy (`working_copy`), which ``wcoj verify
--repair`` stamps again (a copied arrangement file has a new inode, so its stamp no longer
matches and every open would read it whole to check its digest).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wcoj_bench.measure import BenchError, ProcessRun, run_process

# Bumped when what `write_graph` writes changes: cached graphs of another version are remade.
GRAPH_VERSION = 1
Say = Callable[[str], None]


def wcoj_command() -> list[str]:
    """The ``wcoj`` command line as installed next to this Python (the console script users
    run), or ``python -m wcoj_core.cli`` where there is none."""
    script = Path(sys.executable).with_name("wcoj")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "wcoj_core.cli"]


def probe_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "wcoj_bench.probes", *args]


# -- a prepared graph -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreparedGraph:
    folder: Path
    facts: dict[str, Any]
    epochs: Path | None = None  # the folder of the epochs' files
    epoch_size: int = 0

    @property
    def edges(self) -> Path:
        return self.folder / "edges.parquet"

    @property
    def symmetric(self) -> Path:
        return self.folder / "symmetric.parquet"

    def epoch(self, t: int) -> Path:
        assert self.epochs is not None
        return self.epochs / f"e-{t}.csv"

    @property
    def edge_count(self) -> int:
        return int(self.facts["edges"])


def _canonical(source: str, master: str | None) -> tuple[np.ndarray, np.ndarray]:
    """The undirected edges of a file or generator, each once as ``(low, high)``, sorted."""
    from wcoj_core.local_read import is_generator_spec

    if is_generator_spec(source):
        from wcoj_core import spark as wspark
        from wcoj_core.generate import generate
        from wcoj_core.sources import canonical_undirected

        spark = wspark.session(master, app_name="wcoj-bench-prepare", quiet=True)
        table = canonical_undirected(generate(spark, source)).toArrow()
        spark.stop()
    else:
        from wcoj_core.local_read import canonical_undirected_local, read_local

        table, _ = canonical_undirected_local(read_local(source, 2, "edge"))
    src = table.column("c0").to_numpy().astype(np.int64)
    dst = table.column("c1").to_numpy().astype(np.int64)
    order = np.lexsort((dst, src))
    return src[order], dst[order]


def epoch_changes(
    src: np.ndarray, dst: np.ndarray, epochs: int, size: int, seed: int
) -> list[np.ndarray]:
    """`epochs` epochs of `size` changes over the graph ``(src, dst)`` (each edge once, low
    first, sorted): per epoch an array of rows ``(a, b, diff)`` (see the module).

    >>> src, dst = np.array([0, 0, 1, 1, 2, 3]), np.array([1, 2, 2, 3, 3, 4])
    >>> out = epoch_changes(src, dst, 2, 2, seed=3)
    >>> [len(e) for e in out], sorted(int(d) for e in out for d in e[:, 2])
    ([2, 2], [-1, -1, 1, 1])
    """
    n = len(src)
    inserts, deletes = size // 2, size - size // 2
    if n < epochs * deletes:
        raise BenchError(
            f"{epochs} epochs deleting {deletes} edges each need {epochs * deletes} edges; "
            f"the graph has {n}"
        )
    rng = np.random.default_rng(seed)
    width = int(max(int(src.max(initial=0)), int(dst.max(initial=0)))) + 1
    if width > 3_000_000_000:
        raise BenchError(f"vertex ids up to {width - 1} are too large to pack two in 64 bits")
    keys = src * width + dst  # sorted, as the edges are
    gone = rng.choice(n, size=epochs * deletes, replace=False)
    taken = set(keys[gone].tolist())
    added = _inserts(src, dst, keys, width, epochs * inserts, taken, rng)
    out = []
    for t in range(epochs):
        d = gone[t * deletes : (t + 1) * deletes]
        a = added[t * inserts : (t + 1) * inserts]
        rows = np.concatenate(
            [
                np.column_stack([src[d], dst[d], -np.ones(len(d), dtype=np.int64)]),
                np.column_stack([a // width, a % width, np.ones(len(a), dtype=np.int64)]),
            ]
        )
        flip = rng.random(len(rows)) < 0.5
        rows[flip, 0], rows[flip, 1] = rows[flip, 1], rows[flip, 0].copy()
        out.append(rows[rng.permutation(len(rows))])
    return out


def _inserts(
    src: np.ndarray,
    dst: np.ndarray,
    keys: np.ndarray,
    width: int,
    wanted: int,
    taken: set[int],
    rng: np.random.Generator,
) -> np.ndarray:
    """`wanted` absent edges (packed keys), wedge closers first, none in `taken`."""
    both_src = np.concatenate([src, dst])
    both_dst = np.concatenate([dst, src])
    order = np.argsort(both_src, kind="stable")
    neighbours = both_dst[order]
    starts = np.searchsorted(both_src[order], np.arange(width + 1))
    degree = np.diff(starts)
    found: list[int] = []
    seen = set(taken)
    for attempt in range(60):
        if len(found) >= wanted:
            break
        m = max(64, 4 * (wanted - len(found)))
        if attempt < 50:  # a random wedge a - b - c: an edge (a, b), a neighbour c of b
            i = rng.integers(0, len(both_src), m)
            a, b = both_src[i], both_dst[i]
            c = neighbours[starts[b] + (rng.random(m) * degree[b]).astype(np.int64)]
        else:  # too few wedges: random pairs of vertices
            a, c = rng.integers(0, width, m), rng.integers(0, width, m)
        lo, hi = np.minimum(a, c), np.maximum(a, c)
        cand = lo * width + hi
        cand = cand[lo != hi]
        at = np.searchsorted(keys, cand)
        absent = (at >= len(keys)) | (keys[np.minimum(at, len(keys) - 1)] != cand)
        for k in cand[absent].tolist():
            if k not in seen:
                seen.add(k)
                found.append(k)
    if len(found) < wanted:
        raise BenchError(f"found {len(found)} absent edges to insert, {wanted} needed")
    return np.array(found[:wanted], dtype=np.int64)


def write_graph(
    source: str,
    folder: str,
    epochs_folder: str,
    epochs: int,
    size: int,
    seed: int,
    master: str | None = None,
) -> dict[str, Any]:
    """Prepare a graph into `folder` (kept when it is there) and its epochs into `epochs_folder`
    (see the module); the graph's facts."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    root = Path(folder)
    facts_path = root / "graph.json"
    if facts_path.is_file():
        edges = pq.read_table(root / "edges.parquet")
        src = edges.column("c0").to_numpy()
        dst = edges.column("c1").to_numpy()
        facts = json.loads(facts_path.read_text())
    else:
        root.mkdir(parents=True, exist_ok=True)
        src, dst = _canonical(source, master)
        ones = np.ones(len(src), dtype=np.int64)
        pq.write_table(pa.table({"c0": src, "c1": dst, "diff": ones}), root / "edges.parquet")
        both = {
            "c0": np.concatenate([src, dst]),
            "c1": np.concatenate([dst, src]),
            "diff": np.concatenate([ones, ones]),
        }
        pq.write_table(pa.table(both), root / "symmetric.parquet")
        vertices = len(np.unique(np.concatenate([src, dst])))
        facts = {"input": source, "edges": len(src), "vertices": vertices}
        facts_path.write_text(json.dumps(facts, indent=1) + "\n")
    out = Path(epochs_folder)
    out.mkdir(parents=True, exist_ok=True)
    for t, rows in enumerate(epoch_changes(src, dst, epochs, size, seed), start=1):
        table = pa.table({"c0": rows[:, 0], "c1": rows[:, 1], "diff": rows[:, 2]})
        pacsv.write_csv(table, out / f"e-{t}.csv")
    return {"probe": "prepare", **facts}


def _input_key(source: str) -> dict[str, Any]:
    from wcoj_core.local_read import is_generator_spec

    if is_generator_spec(source):
        return {"spec": source}
    st = Path(source).stat()
    return {"file": str(Path(source).resolve()), "size": st.st_size, "mtime": st.st_mtime_ns}


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def prepare_graph(
    source: str,
    cache: Path,
    *,
    epochs: int,
    epoch_size: int,
    seed: int = 1,
    master: str | None = None,
    say: Say = lambda _line: None,
) -> PreparedGraph:
    """The prepared graph of `source` and its epochs from the cache, made first when they are
    not there."""
    folder = cache / "graphs" / _key(GRAPH_VERSION, _input_key(source))
    done = folder / f"epochs-{epochs}-{epoch_size}-{seed}"
    if not (done / "done").is_file() or not (folder / "graph.json").is_file():
        say(f"preparing {source}: {epochs} epochs of {epoch_size} changes (cached in {folder})")
        tmp = done.with_name(f"{done.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        args = ["prepare", "--input", source, "--out", str(folder), "--epochs-out", str(tmp)]
        args += ["--epochs", str(epochs), "--epoch-size", str(epoch_size), "--seed", str(seed)]
        run_process(probe_command(*args, *(["--master", master] if master else [])))
        (tmp / "done").touch()
        shutil.rmtree(done, ignore_errors=True)
        tmp.rename(done)
    facts = json.loads((folder / "graph.json").read_text())
    return PreparedGraph(folder, facts, done, epoch_size)


# -- built states -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BuiltState:
    """A state holding a prepared graph: its folder, the last epoch the build applied, the
    query's count then, and how the build went (each ``wcoj apply``'s wall seconds)."""

    folder: Path
    last_epoch: int
    count: int
    build_seconds: tuple[float, ...]


def core_digest() -> str:
    """A digest of `wcoj_core`'s source: a state built by other code is built again."""
    import wcoj_core

    h = hashlib.sha256()
    root = Path(wcoj_core.__file__).parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def meaning_flags(relation: str, meaning: str) -> list[str]:
    """The ``wcoj`` flags declaring an undirected relation a set or a bag."""
    return ["--undirected", relation, *(["--bag", relation] if meaning == "bag" else [])]


def base_state(
    graph: PreparedGraph,
    cache: Path,
    *,
    query: str = "triangles",
    relation: str = "edge",
    meaning: str = "set",
    load_rows: int | None = None,
    say: Say = lambda _line: None,
) -> BuiltState:
    """The state of `graph` (its relation an undirected set or bag) from the cache, built by
    ``wcoj apply`` first when it is not there (see the module)."""
    import pyarrow.parquet as pq

    from wcoj_bench.epochs import LOAD_ROWS

    rows = load_rows or LOAD_ROWS
    of = _key(graph.folder.name, query, relation, meaning, rows)
    folder = cache / "states" / _key(of, core_digest())
    record = folder / "built.json"
    if record.is_file():
        found = json.loads(record.read_text())
        return BuiltState(
            folder / "state", found["last_epoch"], found["count"], tuple(found["build_seconds"])
        )
    for other in (cache / "states").glob("*/built.json"):
        # The same state built by other code: stale, and large. Remove it.
        if json.loads(other.read_text()).get("of") == of:
            say(f"removing {other.parent}: the same state built by another wcoj_core")
            shutil.rmtree(other.parent, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "chunks").mkdir(parents=True)
    edges = pq.read_table(graph.edges)
    chunks = max(1, -(-edges.num_rows // rows))
    say(
        f"building the {meaning} state of {graph.facts['input']} ({graph.edge_count:,} edges) "
        f"with wcoj apply in {chunks} epoch(s), cached in {folder}"
    )
    seconds: list[float] = []
    count = 0
    for t in range(chunks):
        part = folder / "chunks" / f"part-{t}.parquet"
        pq.write_table(edges.slice(t * rows, rows), part)
        argv = [*wcoj_command(), "apply", "--query", query, "--state", str(folder / "state")]
        argv += ["--epoch", str(t), "--changes", f"{relation}={part}"]
        run = run_process([*argv, *meaning_flags(relation, meaning), "--json"])
        seconds.append(round(run.seconds, 3))
        count = int(run.result["count"])
        part.unlink()
        say(f"  epoch {t}: {run.seconds:.1f} s, count {count:,}")
    shutil.rmtree(folder / "chunks")
    built = {"of": of, "last_epoch": chunks - 1, "count": count, "build_seconds": seconds}
    record.write_text(json.dumps(built) + "\n")
    return BuiltState(folder / "state", chunks - 1, count, tuple(seconds))


def working_copy(state: BuiltState, dest: Path) -> ProcessRun:
    """A copy of a built state at `dest` for a benchmark to apply epochs to, stamped again by
    ``wcoj verify --repair`` (see the module); the verify run."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(state.folder, dest)
    run = run_process([*wcoj_command(), "verify", str(dest), "--repair", "--json"])
    if not run.result.get("ok"):
        raise BenchError(f"the copy {dest} of {state.folder} does not verify: {run.result}")
    return run


__all__ = [
    "BuiltState",
    "PreparedGraph",
    "base_state",
    "core_digest",
    "epoch_changes",
    "meaning_flags",
    "prepare_graph",
    "probe_command",
    "wcoj_command",
    "working_copy",
]
