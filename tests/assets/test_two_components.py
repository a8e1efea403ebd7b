"""Two `WcojComponent`s live in one ``dg`` project, and each materializes exactly.

The project (as the quick start lays one out) holds triangles over an undirected ``edge`` and
3-cycles over a directed ``follows``, each with its own landing folder and state. ``dg check
defs`` must load both (no clash of resources, jobs, sensors or executors: each names what it owns
after its folder). Then a fresh interpreter loads the project as ``dg dev`` would and runs each
component's epoch job over its epochs; every output equals the oracle's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from oracle import naive_eval
from wcoj_support import set_oracle, updates, write_landing

from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import QuerySpec, Topology
from wcoj_core.query.builtins import BUILTINS
from wcoj_core.state_read import read_table
from wcoj_core.traces import output_trace_name

DG = Path(sys.executable).with_name("dg")
START = "2024-03-01"
CYCLES = "cycles(a, b, c) :- follows(a, b), follows(b, c), follows(c, a), a < b, a < c"
EPOCHS = 3

PYPROJECT = """\
[project]
name = "graphs"
version = "0.1.0"

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "graphs"
"""

DEFINITIONS_PY = """\
from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
"""

TRIANGLES_YAML = """\
type: wcoj_assets.component.WcojComponent
attributes:
  relations: [{name: edge, arity: 2}]
  queries: [{name: triangles, query: triangles}]
  undirected: [edge]
  landing: data/edges
  storage: data/triangles_state
  start: "2024-03-01"
"""

CYCLES_YAML = f"""\
type: wcoj_assets.component.WcojComponent
attributes:
  relations: [{{name: follows, arity: 2}}]
  queries: [{{name: cycles, query: "{CYCLES}"}}]
  landing: data/follows
  storage: data/cycles_state
  start: "2024-03-01"
"""

RUNNER = """
import json, sys
sys.path.insert(0, "src")
from dagster import DagsterInstance
from graphs.definitions import defs

loaded = defs()
out = {}
with DagsterInstance.ephemeral() as instance:
    for job_name in ("triangles_epoch_job", "cycles_epoch_job"):
        job = loaded.resolve_job_def(job_name)
        out[job_name] = [
            job.execute_in_process(partition_key=key, instance=instance, raise_on_error=False).success
            for key in sys.argv[1:]
        ]
out["resources"] = sorted(loaded.resources)
out["sensors"] = sorted(s.name for s in loaded.sensors)
print(json.dumps(out))
"""


def project(root: Path) -> Path:
    package = root / "src" / "graphs"
    for folder, yaml in (("triangles", TRIANGLES_YAML), ("cycles", CYCLES_YAML)):
        (package / "defs" / folder).mkdir(parents=True)
        (package / "defs" / folder / "defs.yaml").write_text(yaml)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "definitions.py").write_text(DEFINITIONS_PY)
    return root


def test_two_components_load_together_and_each_materializes_exactly(tmp_path: Path) -> None:
    root = project(tmp_path / "graphs")
    edges, follows = updates(seed=51, epochs=EPOCHS), updates(seed=52, epochs=EPOCHS)
    for n in range(EPOCHS):
        write_landing(root / "data" / "edges", n, edges[n], "csv", start=START)
        write_landing(root / "data" / "follows", n, follows[n], "csv", start=START)
    # write_landing lands under <landing>/edge/: the follows relation's folder is its name.
    (root / "data" / "follows" / "edge").rename(root / "data" / "follows" / "follows")

    env = {"PATH": f"{DG.parent}:/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1"}
    checked = subprocess.run(
        [str(DG), "check", "defs"], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    keys = [f"2024-03-0{n + 1}" for n in range(EPOCHS)]
    ran = subprocess.run(
        [sys.executable, "-c", RUNNER, *keys],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert ran.returncode == 0, ran.stderr[-5000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["triangles_epoch_job"] == [True] * EPOCHS
    assert out["cycles_epoch_job"] == [True] * EPOCHS
    assert out["resources"] == [
        "cycles_outputs",
        "cycles_wcoj",
        "triangles_outputs",
        "triangles_wcoj",
    ]
    assert (
        "triangles_landing_sensor" in out["sensors"] and "cycles_landing_sensor" in out["sensors"]
    )

    triangles = Topology.of([QuerySpec("triangles", BUILTINS["triangles"], ("edge",))], ["edge"])
    cycles = Topology.of([QuerySpec("cycles", CYCLES, ("follows",))])
    tri_state = WcojResource(storage=str(root / "data" / "triangles_state")).engine(triangles)
    cyc_state = WcojResource(storage=str(root / "data" / "cycles_state")).engine(cycles)
    for n in range(EPOCHS):
        expected = set_oracle(triangles, "triangles", edges, n)
        assert _multiset(tri_state, "triangles", n) == expected, n
        held: Counter = Counter()
        for ups in follows[: n + 1]:
            for t, d in ups:
                held[t] += d
        want = naive_eval(cycles.query("cycles"), {"follows": {t: m for t, m in held.items() if m}})
        assert _multiset(cyc_state, "cycles", n) == Counter({k: v for k, v in want.items() if v}), n


def _multiset(engine, query: str, epoch: int) -> Counter:
    """A query's output as of an epoch, read with pyarrow (no JVM)."""
    table = read_table(engine, output_trace_name(query), epoch)
    rows = table.to_pylist()
    return Counter({tuple(r[c] for c in table.column_names[:-1]): r["diff"] for r in rows})
