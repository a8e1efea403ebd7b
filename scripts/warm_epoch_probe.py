"""Warm 1,000-change triangle epochs on an undirected graph, one `Engine`, for a given checkout.

    python scripts/warm_epoch_probe.py CODE_ROOT OUT.json [--input GRAPH] [--epochs 24]

`CODE_ROOT` is a checkout whose ``wcoj_core`` is imported (the editable install's finder is
taken out of the way, so an exported copy of main runs beside this branch from the same venv;
it needs its compiled kernel: copy ``wcoj_core/kernel/_native*.so`` into it). The graph's
edges are deduplicated (low < high) and split by a seeded shuffle: ``epochs * 500`` held back
and inserted over the epochs, as many deleted; the rest, with the deleted ones, loaded as epoch 0
(untimed, in a state of its own under ``--work``). Then epochs 1.. are applied by one engine
(``deployment="driver"``), each handed 500 insertions and 500 deletions, every edge in a seeded
random direction; epoch 1 is the warm-up. Written to OUT.json and printed: the median wall and
process-CPU milliseconds per epoch, every epoch's wall and CPU, the median of each phase's wall
and CPU (`EpochMetrics.seconds`, `cpu_seconds`), the triangle count after every epoch (two
checkouts must agree) and the load average. ``--profile FILE`` profiles epochs 2.. (cProfile,
the main thread's CPU clock).

``--alternate-kernel SO`` runs two compiled kernels in the one engine: the checkout's and the
module file `SO` (another checkout's ``wcoj_core/kernel/_native*.so``, built from a source with
the same functions and arguments), epochs 1, 2, 5, 6, 9, .. on `SO` and the others on the
checkout's (pairs, so that the epochs merging recent segments fall on both). Every call of the
kernel is timed (the thread's CPU clock): ``kernel_ms`` gives, for each kernel, the median per
epoch of all its calls and of each function. The same Python runs both, against the same state,
interleaved in time: the load and the machine's drift fall on both alike.
"""

import sys

code = sys.argv[1]
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, code)

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import wcoj_core  # noqa: E402

if not wcoj_core.__file__ or not wcoj_core.__file__.startswith(os.path.abspath(code)):
    raise SystemExit(f"imported {wcoj_core.__file__}, not the checkout {code}")

from wcoj_core.engine import Engine  # noqa: E402
from wcoj_core.input_read import read_local  # noqa: E402
from wcoj_core.query.parse import parse_query  # noqa: E402

TRIANGLES = "tri(a,b,c) :- edge(a,b), edge(b,c), edge(a,c), a < b, b < c"


def edges_of(path: str, cache: Path) -> np.ndarray:
    """The graph's distinct undirected edges (low, high), cached as ``.npy`` under `cache`."""
    saved = cache / (Path(path).name + ".edges.npy")
    if saved.exists():
        return np.load(saved)
    table = read_local(path, 2, "edge")
    a, b = table.column("c0").to_numpy(), table.column("c1").to_numpy()
    low, high = np.minimum(a, b), np.maximum(a, b)
    keep = low != high
    edges = np.unique(np.stack([low[keep], high[keep]], 1), axis=0)
    np.save(saved, edges)
    return edges


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("code")
    p.add_argument("out")
    p.add_argument("--input", default="../shared/data/web-NotreDame.txt.gz")
    p.add_argument("--epochs", type=int, default=24)
    p.add_argument("--work", default="/tmp/warm-epoch-probe")
    p.add_argument("--profile", default="")
    p.add_argument("--alternate-kernel", default="")
    a = p.parse_args()
    spent: dict[str, float] = collections.defaultdict(float)
    use = {"kernel": "checkout"}
    if a.alternate_kernel:
        from wcoj_core.kernel import native as loader

        ours, theirs = loader.native, loader._load_file(Path(a.alternate_kernel))
        if getattr(theirs, "SOURCE_HASH", None) == getattr(ours, "SOURCE_HASH", None):
            raise SystemExit(f"{a.alternate_kernel} is this checkout's kernel")

        def routed(name: str):
            mine, other = getattr(ours, name), getattr(theirs, name)

            def call(*args):
                f = other if use["kernel"] == "alternate" else mine
                start = time.thread_time()
                try:
                    return f(*args)
                finally:
                    spent[name] += time.thread_time() - start

            return call

        for name in [n for n in dir(ours) if callable(getattr(ours, n)) and hasattr(theirs, n)]:
            if not name.startswith("_"):
                setattr(ours, name, routed(name))
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    edges = edges_of(a.input, work)
    rng = np.random.default_rng(7)
    n = a.epochs
    order = rng.permutation(len(edges))
    held, deleted = edges[order[: n * 500]], edges[order[n * 500 : n * 1000]]
    initial = edges[order[n * 500 :]]

    def table(rows: np.ndarray, diff: np.ndarray) -> pa.Table:
        flip = rng.random(len(rows)) < 0.5
        rows = rows.copy()
        rows[flip] = rows[flip][:, ::-1]
        return pa.table({"c0": rows[:, 0], "c1": rows[:, 1], "diff": diff.astype(np.int64)})

    state = work / f"state-{os.getpid()}"
    shutil.rmtree(state, ignore_errors=True)
    query = parse_query(TRIANGLES)
    Engine(None, str(state), query, undirected=["edge"], deployment="driver").apply(
        0, {"edge": table(initial, np.ones(len(initial)))}
    )
    engine = Engine(None, str(state), query, undirected=["edge"], deployment="driver")
    signs = np.concatenate([np.ones(500), -np.ones(500)])
    tables = [
        table(
            np.concatenate([held[t * 500 : (t + 1) * 500], deleted[t * 500 : (t + 1) * 500]]), signs
        )
        for t in range(n)
    ]
    profile = None
    if a.profile:
        import cProfile

        profile = cProfile.Profile(time.thread_time)
    walls, cpus, phases, cpu_phases, counts = [], [], [], [], []
    kernels: dict[str, list[dict[str, float]]] = {"checkout": [], "alternate": []}
    whole: dict[str, list[tuple[float, float]]] = {"checkout": [], "alternate": []}
    for t in range(1, n + 1):
        use["kernel"] = "alternate" if a.alternate_kernel and t % 4 in (1, 2) else "checkout"
        spent.clear()
        if profile is not None and t > 1:
            profile.enable()
        wall, cpu = time.perf_counter(), time.process_time()
        result = engine.apply(t, {"edge": tables[t - 1]})
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if profile is not None:
            profile.disable()
        if t > 1 and a.alternate_kernel:
            kernels[use["kernel"]].append(dict(spent))
            whole[use["kernel"]].append((wall, cpu))
        if t > 1:
            walls.append(wall)
            cpus.append(cpu)
            phases.append(result.metrics.seconds)
            cpu_phases.append(result.metrics.cpu_seconds)
        counts.append(engine.count())

    def ms(xs: list[float]) -> float:
        return round(statistics.median(xs) * 1000, 2)

    out = {
        "code": code,
        "wall_ms": ms(walls),
        "cpu_ms": ms(cpus),
        "walls_ms": [round(w * 1000, 2) for w in walls],
        "cpus_ms": [round(c * 1000, 2) for c in cpus],
        "phases_ms": {k: ms([ph.get(k, 0.0) for ph in phases]) for k in phases[0]},
        "cpu_phases_ms": {k: ms([ph.get(k, 0.0) for ph in cpu_phases]) for k in cpu_phases[0]},
        "counts": counts,
        "load": os.getloadavg(),
    }
    if a.alternate_kernel:
        out["kernel_ms"] = {
            name: {
                "epoch_wall": ms([w for w, _ in whole[which]]),
                "epoch_cpu": ms([c for _, c in whole[which]]),
                "all": ms([sum(e.values()) for e in kernels[which]]),
                **{
                    f: ms([e.get(f, 0.0) for e in kernels[which]])
                    for f in sorted(set().union(*kernels[which]))
                },
            }
            for which, name in (("checkout", code), ("alternate", a.alternate_kernel))
        }
    Path(a.out).write_text(json.dumps(out) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k not in ("walls_ms", "cpus_ms", "counts")}))
    if profile is not None:
        profile.dump_stats(a.profile)
    shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
