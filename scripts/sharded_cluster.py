"""Issue 31's cluster target: a graph's triangles kept sharded on a standalone cluster of small
executors, every epoch exact against the driver deployment.

Usage: ``python scripts/sharded_cluster.py GRAPH_DIR CLUSTER_DIR SCRATCH [--epochs N] [--gaps G]
[--gap-seconds S] [--executor-rows R] [--build-on-cluster] [--cap SIZE]``. ``GRAPH_DIR`` is a
prepared graph (`wcoj_bench.infra.prepared`: ``edges.parquet``, each undirected edge once);
``CLUSTER_DIR`` a cluster started by ``wcoj-bench cluster up --dir CLUSTER_DIR --workers 2
--cores 1 --memory 1g``. Two states in ``SCRATCH``:

* **driver** — ``Engine(..., deployment="driver")`` in this process, no Spark: the reference;
* **cluster** — ``Engine(SparkStarter(master, {"spark.executor.memory": "1g"}),
  deployment="executors", executor_max_rows=R)``: every arrangement cut into
  ``ceil(rows / R)`` shards (`wcoj_core.deploy.sharded`). Its epoch 0 is built on the cluster
  (``--build-on-cluster``: the whole graph as one sharded epoch) or copied from the driver's
  state. Every epoch (the load included) runs in tasks searching the mapped arrangement files
  (`wcoj_core.deploy.spark_job.OVER_FILES`); ``--routed`` runs them as routed stages instead.

With ``--state DIR`` (a working copy of a state holding the graph, e.g. the bench's cached
18.6 M-edge one, stamped again by ``wcoj verify --repair``) nothing is built: the cluster's
engine maintains that state, and before each epoch the driver's engine evaluates it on the same
state (`Engine.evaluate`: written nowhere) for the reference change.

Then `--epochs` 1,000-change epochs (deletions and insertions, `prepared.epoch_changes`) are
applied to both, the cluster's timed (wall of `Engine.apply`, the driver process warm, as the
``cluster-epochs`` part times them): the first `--epochs` minus `--gaps` back to back, then
`--gaps` more each after `--gap-seconds` idle (Spark ends a Python worker idle for about a
minute, so each of those meets fresh workers). Every epoch's output change (``out/tri``'s batch)
must equal the driver's exactly (as multisets), and epoch 0's by rows, count and an
order-free fingerprint.

Memory is sampled every 0.1 s from ``/proc`` (`wcoj_core.budget.process_memory`): this process's
tree (the driver's JVM included) and each cluster worker's descendants — the executor JVM and
its Python daemon and workers (`RssAnon`, `VmHWM`); the run stops past `--cap` of anonymous
memory over all of them. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import threading
import time as clock
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wcoj_bench.infra.cluster import Cluster
from wcoj_bench.infra.measure import tree_pids
from wcoj_bench.infra.prepared import epoch_changes
from wcoj_core.budget import parse_size, process_memory
from wcoj_core.engine import Engine
from wcoj_core.query.builtins import builtin
from wcoj_core.session import SparkStarter

OUT = "out/triangles"


class Sampler:
    """Peak anonymous memory of this process's tree and of each cluster worker's executors."""

    def __init__(self, workers: list[int], cap: int, interval: float = 0.1) -> None:
        self.workers = workers
        self.cap = cap
        self.interval = interval
        self.label = "start"
        self.peaks: dict[str, dict[str, int]] = {}
        self.over: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        driver = sum(process_memory(p).get("RssAnon", 0) for p in tree_pids(os.getpid()))
        executors = 0
        largest_jvm = largest_python = hwm = 0
        for w in self.workers:
            for p in tree_pids(w)[1:]:  # the worker JVM itself is not an executor
                got = process_memory(p)
                if not got:
                    continue
                anon = got.get("RssAnon", 0)
                executors += anon
                hwm = max(hwm, got.get("VmHWM", 0))
                try:
                    exe = os.readlink(f"/proc/{p}/exe")
                except OSError:
                    exe = ""
                if "java" in exe:
                    largest_jvm = max(largest_jvm, anon)
                else:
                    largest_python = max(largest_python, anon)
        now = {
            "driver_tree_anon": driver,
            "executors_anon": executors,
            "largest_executor_jvm_anon": largest_jvm,
            "largest_python_worker_anon": largest_python,
            "executors_vmhwm": hwm,
            "all_anon": driver + executors,
        }
        peak = self.peaks.setdefault(self.label, {})
        for k, v in now.items():
            peak[k] = max(peak.get(k, 0), v)
        if driver + executors > self.cap and self.over is None:
            self.over = (
                f"{(driver + executors) / 1e9:.2f} GB of anonymous memory during {self.label}"
            )
            os.kill(os.getpid(), signal.SIGINT)  # stops the run where it is (its report kept)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def table(rows: np.ndarray) -> pa.Table:
    return pa.table({"c0": rows[:, 0], "c1": rows[:, 1], "diff": rows[:, 2]})


def output_change(engine: Engine, epoch: int) -> dict[tuple[int, ...], int]:
    """The output's batch of `epoch`, as a multiset (read whole: an epoch's change is small)."""
    trace = engine.store.current().traces[OUT]
    files = engine.batches
    batches = [b for b in trace.batches if b.time == epoch]
    layer = files.read_layer(trace.columns, batches)
    rows = np.asarray(layer.rows).tolist()
    return {tuple(r): int(d) for r, d in zip(rows, np.asarray(layer.diff).tolist(), strict=True)}


def fingerprint(engine: Engine, epoch: int) -> tuple[int, int, int]:
    """Rows, summed multiplicity and an order-free hash of the output's batch of `epoch`, read a
    record batch at a time (epoch 0's output is tens of millions of rows)."""
    trace = engine.store.current().traces[OUT]
    files = engine.batches
    rows = count = mixed = 0
    for b in trace.batches:
        if b.time != epoch:
            continue
        for data, diff in files.verified_pieces(b, trace.columns):
            h = np.full(len(diff), 0x9E3779B97F4A7C15, dtype=np.uint64)
            for j in range(data.shape[1]):
                h ^= data[:, j].astype(np.int64).view(np.uint64)
                h *= np.uint64(0xBF58476D1CE4E5B9)
                h ^= h >> np.uint64(31)
            rows += len(diff)
            count += int(diff.sum())
            mixed = (mixed + int((h * diff.astype(np.int64).view(np.uint64)).sum())) % (1 << 64)
    return rows, count, mixed


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("graph", type=Path)
    p.add_argument("cluster", type=Path)
    p.add_argument("scratch", type=Path)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--gaps", type=int, default=2)
    p.add_argument("--gap-seconds", type=float, default=120.0)
    p.add_argument("--executor-rows", type=int, default=2_000_000)
    p.add_argument("--executor-memory", default="1g")
    p.add_argument("--build-on-cluster", action="store_true")
    p.add_argument(
        "--routed",
        action="store_true",
        help="run every epoch as routed stages, not as tasks over the mapped arrangement files",
    )
    p.add_argument(
        "--state",
        type=Path,
        help="maintain this existing state (a working copy: it is changed) instead of building two",
    )
    p.add_argument("--cap", default="8g")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)

    found = Cluster.load(args.cluster)
    if found is None:
        raise SystemExit(f"no cluster recorded in {args.cluster}")
    edges = pq.read_table(args.graph / "edges.parquet")
    src = edges.column("c0").to_numpy()
    dst = edges.column("c1").to_numpy()
    epochs = epoch_changes(src, dst, args.epochs, 1000, args.seed)
    query = builtin("triangles")
    args.scratch.mkdir(parents=True, exist_ok=True)
    driver_state, cluster_state = args.scratch / "driver", args.scratch / "cluster"
    for s in (driver_state, cluster_state):
        shutil.rmtree(s, ignore_errors=True)
    sampler = Sampler([w.pid for w in found.workers], parse_size(args.cap))
    report: dict[str, Any] = {
        "graph": json.loads((args.graph / "graph.json").read_text()),
        "master": found.master,
        "executor_memory": args.executor_memory,
        "executor_rows": args.executor_rows,
        "load_start": load(),
    }
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        if args.state is not None:
            # One state: the driver evaluates each epoch on it (written nowhere) before the
            # cluster applies it.
            cluster_state = args.state
            driver = Engine(
                None, str(cluster_state), query, undirected=["edge"], deployment="driver"
            )
        else:
            sampler.label = "driver load"
            driver = Engine(
                None, str(driver_state), query, undirected=["edge"], deployment="driver"
            )
            start = clock.perf_counter()
            result = driver.apply(0, {"edge": edges})
            report["driver_load_seconds"] = round(clock.perf_counter() - start, 3)
            report["driver_count"] = result.totals.get("triangles")
            say(f"driver load: {report['driver_load_seconds']} s")
            if not args.build_on_cluster:
                shutil.copytree(driver_state, cluster_state)
        starter = SparkStarter(
            found.master,
            {"spark.executor.memory": args.executor_memory, "spark.executor.cores": "1"},
        )
        cluster = Engine(
            starter,
            str(cluster_state),
            query,
            undirected=["edge"],
            deployment="executors",
            executor_max_rows=args.executor_rows,
        )
        if args.routed:
            cluster.access.one_task_rows = 0
            cluster.access.routed = True
        report["routed"] = args.routed
        sampler.label = "spark start"
        start = clock.perf_counter()
        spark = starter("the cluster's executors, started before the first timed epoch")
        spark.sparkContext.parallelize(range(2), 2).count()
        report["spark_start_seconds"] = round(clock.perf_counter() - start, 3)
        if args.build_on_cluster:
            sampler.label = "cluster load"
            start = clock.perf_counter()
            got = cluster.apply(0, {"edge": edges})
            report["cluster_load_seconds"] = round(clock.perf_counter() - start, 3)
            report["cluster_load_reason"] = got.metrics.reason
            a, b = fingerprint(cluster, 0), fingerprint(driver, 0)
            report["load_fingerprints"] = {"cluster": a[:2], "driver": b[:2], "equal": a == b}
            say(f"cluster load: {report['cluster_load_seconds']} s, equal: {a == b}")
            if a != b:
                raise SystemExit(f"epoch 0 differs: cluster {a}, driver {b}")
        first = cluster.store.current().epoch
        first = 1 if first is None else first + 1
        runs = []
        for i, rows in enumerate(epochs):
            t = first + i
            gap = i >= args.epochs - args.gaps
            if gap:
                sampler.label = "idle"
                clock.sleep(args.gap_seconds)
            expected = None
            if args.state is not None:
                sampler.label = "driver"
                dry = driver.evaluate({"edge": table(rows)})
                arrays = dry.changes["triangles"]
                assert arrays is not None
                expected = {
                    tuple(r): int(d)
                    for r, d in zip(arrays[0].tolist(), arrays[1].tolist(), strict=True)
                }
            sampler.label = "gap epochs" if gap else "back-to-back epochs"
            start = clock.perf_counter()
            got = cluster.apply(t, {"edge": table(rows)})
            seconds = clock.perf_counter() - start
            if expected is None:
                driver.apply(t, {"edge": table(rows)})
                expected = output_change(driver, t)
            mine = output_change(cluster, t)
            if mine != expected:
                raise SystemExit(
                    f"epoch {t}: the cluster's output change differs from the driver's"
                )
            runs.append(
                {
                    "epoch": t,
                    "after_gap": gap,
                    "seconds": round(seconds, 3),
                    "output_rows": len(mine),
                    "deployment": got.metrics.deployment,
                    "reason": got.metrics.reason,
                    "load": load(),
                }
            )
            say(
                f"epoch {t}: {seconds:.2f} s, {len(mine)} rows, exact{' (after a gap)' if gap else ''}"
            )
            if sampler.over:
                raise SystemExit(f"stopped: {sampler.over}")
        report["epochs"] = runs
        b2b = [r["seconds"] for r in runs if not r["after_gap"]]
        gaps = [r["seconds"] for r in runs if r["after_gap"]]
        report["back_to_back_median"] = statistics.median(b2b[1:] or b2b) if b2b else None
        report["back_to_back_first"] = b2b[0] if b2b else None
        report["gap_median"] = statistics.median(gaps) if gaps else None
        report["exact"] = True
    except KeyboardInterrupt:
        report["stopped"] = sampler.over or "interrupted"
    finally:
        sampler.close()
        report["memory"] = sampler.peaks
        report["load_end"] = load()
        print(json.dumps(report, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
