"""A day of minute epochs (issue 42.8): the same N minute epochs (default 1,440) applied by one
ranged Dagster run of the day's partition (epochs_per_day=1440, a SQLite instance, every check
but the binary join) and by the engine alone (the same landed files read with pyarrow, one
`Engine.apply` each), side by side, in one process; each side's wall seconds per epoch, the ratio,
and the triangles at every 60th minute compared between the two states (exact or the script
fails). Epoch 0000 lands a random graph, each later minute CHANGES edge changes.

Usage: python scripts/minute_epochs.py [N=1440] [CHANGES=20] [EDGES=20000]"""

import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from dagster import DagsterInstance

from wcoj_assets.definitions import JOB_NAME, build_definitions
from wcoj_assets.epochs import Epochs
from wcoj_assets.instance import dagster_settings, prepare_home
from wcoj_assets.landing_read import read_epoch
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import DEFAULT_SPECS, Topology
from wcoj_core.state_read import read_table
from wcoj_core.traces import output_trace_name

N, CHANGES, EDGES = (int(a) for a in (sys.argv[1:] + ["1440", "20", "20000"][len(sys.argv) - 1 :]))
NODES = 2000
EPOCHS = Epochs("2024-03-01", per_day=1440)


def land(landing: Path) -> None:
    rng = random.Random(42)
    present: set[tuple[int, int]] = set()
    for t in range(N):
        rows = []
        for _ in range(EDGES if t == 0 else CHANGES):
            a, b = sorted(rng.sample(range(NODES), 2))
            if (a, b) in present and t:
                present.discard((a, b))
                rows.append(f"{a},{b},-1")
            elif (a, b) not in present:
                present.add((a, b))
                rows.append(f"{a},{b},1")
        folder = landing / "edge" / EPOCHS.folder(t)
        folder.mkdir(parents=True)
        (folder / "part.csv").write_text("src,dst,diff\n" + "\n".join(rows) + "\n")


def triangles(resource: WcojResource, topology: Topology, t: int) -> Counter:
    table = read_table(resource.engine(topology), output_trace_name("triangles"), t).to_pydict()
    return Counter(tuple(r) for r in zip(*table.values(), strict=True))


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="minute-epochs-"))
    try:
        measure(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure(root: Path) -> None:
    landing = root / "landing"
    land(landing)
    topology = Topology.of(DEFAULT_SPECS, ("edge",), (), ())
    # The engine alone: each minute's files read with pyarrow, applied and committed.
    alone = WcojResource(storage=str(root / "alone"), landing=str(landing))
    engine = alone.engine(topology)
    start = time.perf_counter()
    for t in range(N):
        read = read_epoch(str(landing), "edge", 2, EPOCHS.folder(t), alone.starter())
        engine.apply(t, {"edge": read.rows}, replace=True)
    engine_s = time.perf_counter() - start
    # Dagster: one run of the day's partition, which applies the same minutes in order.
    defs = build_definitions(
        storage=str(root / "dagster"),
        landing=str(landing),
        start=EPOCHS.start,
        epochs_per_day=1440,
        undirected=["edge"],
        check_every=10**9,
    )
    with DagsterInstance.from_config(str(prepare_home(root / "home"))) as instance:
        start = time.perf_counter()
        with dagster_settings():
            result = defs.resolve_job_def(JOB_NAME).execute_in_process(
                instance=instance, partition_key=EPOCHS.start, raise_on_error=False
            )
        dagster_s = time.perf_counter() - start
    assert result.success, "the day's run failed"
    piped = WcojResource(storage=str(root / "dagster"), landing=str(landing))
    for t in range(0, N, 60):
        assert triangles(piped, topology, t) == triangles(alone, topology, t), t
    assert piped.engine(topology).store.current().generation == N  # a commit per minute
    print(f"{N} minute epochs ({EDGES:,} edges, then {CHANGES} changes a minute), one day:")
    print(f"  engine alone:        {engine_s:8.2f} s  {engine_s / N * 1000:7.1f} ms an epoch")
    print(f"  Dagster, one run:    {dagster_s:8.2f} s  {dagster_s / N * 1000:7.1f} ms an epoch")
    print(
        f"  Dagster's share:     {(dagster_s - engine_s) / N * 1000:7.1f} ms an epoch; ratio "
        f"{dagster_s / engine_s:.2f}x; outputs equal at every 60th minute"
    )


if __name__ == "__main__":
    main()
