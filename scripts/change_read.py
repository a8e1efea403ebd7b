"""What a downstream asset annotated ``pa.Table`` pays to read a big epoch's change (issue 28's
target: web-NotreDame's epoch-0 ``triangles_deltas``, 8.9 M rows, in at most 2 s, no JVM).

Usage: ``python scripts/change_read.py EDGE_FILE SCRATCH [--rounds N] [--baseline PYTHON]
[--form ARROW|PANDAS|POLARS] [--output]``,
e.g. with ``../shared/data/web-NotreDame.txt.gz``. Builds the quick start's state from the file
as epoch 0 once (``SCRATCH/state``, kept: a second call reuses it), then each round runs, for
this install and, with ``--baseline``, another checkout's venv (e.g. main's
``.venv/bin/python``), in alternating order, a fresh process that opens the state and reads the
change exactly as the IO manager does for such an asset (`wcoj_assets.outputs.read_output`,
``Form.ARROW``, or ``--form``; with ``--output`` the output as of epoch 0 instead of its
change), timing the read (wall and CPU, all threads) and the whole process, and sampling the
process's peak anonymous memory (`wcoj_bench.infra.measure.run_process`). Prints one JSON
object with the load average before and after and the medians.

A script, not a benchmark part: figures go to docs/benchmarks.md with the load average.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

from wcoj_bench.infra.measure import run_process

READ = """
import json, sys, time
started = time.perf_counter()
from wcoj_assets.outputs import Form, read_output
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import DEFAULT_SPECS, Topology

topology = Topology.of(DEFAULT_SPECS, undirected=["edge"])
engine = WcojResource(storage=sys.argv[1]).engine(topology, create=False)
wall, cpu = time.perf_counter(), time.process_time()
form, change = Form[sys.argv[2]], sys.argv[3] == "change"
table = read_output(engine, topology.query("triangles"), 0, change=change, form=form)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
jvm = "pyspark" in sys.modules and sys.modules["pyspark"].SparkContext._gateway is not None
print(json.dumps({
    "rows": len(table), "read_seconds": round(wall, 3), "read_cpu_seconds": round(cpu, 3),
    "process_seconds": round(time.perf_counter() - started, 3), "jvm": jvm,
}))
"""


def build(state: Path, edges: Path) -> int:
    from wcoj_assets.resources import WcojResource
    from wcoj_assets.specs import DEFAULT_SPECS, Topology
    from wcoj_core.input_read import read_local_batches

    topology = Topology.of(DEFAULT_SPECS, undirected=["edge"])
    engine = WcojResource(storage=str(state)).engine(topology)
    result = engine.apply(0, {"edge": read_local_batches(str(edges), 2, "edge")}, replace=True)
    return result.count("triangles")


def main() -> None:
    edges, scratch = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    form = sys.argv[sys.argv.index("--form") + 1] if "--form" in sys.argv else "ARROW"
    what = "output" if "--output" in sys.argv else "change"
    sides = {"this": sys.executable}
    if "--baseline" in sys.argv:
        sides["baseline"] = sys.argv[sys.argv.index("--baseline") + 1]
    state = scratch / "state"
    if not state.exists():
        print(f"epoch 0 built: {build(state, edges):,} triangles", file=sys.stderr)
    load = {"start": [round(x, 2) for x in os.getloadavg()]}
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    order = list(sides)
    for r in range(rounds):
        for side in order if r % 2 == 0 else order[::-1]:
            # Run from the scratch folder: `python -c` puts the working directory first on
            # sys.path, and a checkout's there would be imported instead of the venv's own.
            argv = [sides[side], "-c", READ, str(state), form, what]
            done = run_process(argv, interval=0.01, cwd=scratch)
            runs[side].append({**done.result, "peak_anon_mib": done.tree_anon_bytes >> 20})
            print(side, r, json.dumps(runs[side][-1]), file=sys.stderr, flush=True)
    load["end"] = [round(x, 2) for x in os.getloadavg()]
    medians = {
        side: {
            k: statistics.median(run[k] for run in rs)
            for k in ("read_seconds", "read_cpu_seconds", "process_seconds", "peak_anon_mib")
        }
        for side, rs in runs.items()
    }
    print(json.dumps({"load_average": load, "median": medians, "runs": runs}))


if __name__ == "__main__":
    main()
