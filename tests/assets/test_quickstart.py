"""The README's quick start, exactly as it shows it, in a fresh process: sets, and no JVM.

The test makes the quick start's project (every file block of README.md's quick start, read from
the README itself: ``pyproject.toml``, ``src/edges/definitions.py``, the ``defs.yaml``, the
user's ``reports.py``) and lands, as a user with a SNAP
graph does: epoch 0 the graph as a SNAP edge list listing every edge in BOTH directions, then CSV
epochs that delete present edges named in either direction, re-insert present ones, delete absent
ones and insert new ones. A fresh Python process loads the project as ``dagster dev`` would
(``edges.definitions``) and runs ``wcoj_epoch_job`` for each epoch's partition. Each epoch's
``triangles`` count must equal a from-scratch count of the graph *as a set*, so must the
``per_vertex`` aggregate (each vertex's triangles: three times as many in all) and the user's
``in_triangles``, which reads that table as a pyarrow Table; the changes' metadata counts the
inserts and deletes that changed nothing. No JVM starts for these local epochs; then a
run asking for the binary-join recomputation starts Spark, says why on one line, and the resource
stops the session it started when the run ends.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
START = "2024-03-01"

pytestmark = pytest.mark.e2e  # the README's quick start, as a project

# Run in the project folder by a fresh interpreter: every epoch's partition, as `dagster job
# execute` would, then the last epoch again with the binary join asked for.
RUNNER = """
import json, sys
sys.path.insert(0, "src")
import dagster as dg
from dagster import DagsterEventType, DagsterInstance
from pyspark import SparkContext
from edges.definitions import defs

loaded = defs()
job = loaded.resolve_job_def("triangles_epoch_job")
mine = loaded.resolve_implicit_global_asset_job_def()
users = [dg.AssetKey("busiest_vertices"), dg.AssetKey("in_triangles")]
out = {"epochs": [], "jvm": []}
with DagsterInstance.ephemeral() as instance:
    for key in sys.argv[1:]:
        result = job.execute_in_process(partition_key=key, instance=instance, raise_on_error=False)
        reports = mine.execute_in_process(
            partition_key=key, instance=instance, asset_selection=users, raise_on_error=False
        )
        found = {"success": result.success and reports.success, "metadata": {}, "checks": {}}
        for event in [*result.all_events, *reports.all_events]:
            if event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
                m = event.event_specific_data.materialization
                found["metadata"][m.asset_key.to_user_string()] = {
                    k: v.value for k, v in m.metadata.items() if isinstance(v.value, (int, str))
                }
            elif event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
                c = event.event_specific_data
                found["checks"][c.check_name] = c.passed
        out["epochs"].append(found)
        out["jvm"].append([SparkContext._gateway is not None, SparkContext._active_spark_context is not None])
    config = {"ops": {"triangles_epochs": {"config": {"binary_join": True}}}}
    result = job.execute_in_process(
        partition_key=sys.argv[-1], instance=instance, run_config=config, raise_on_error=False
    )
    lines = [
        e.user_message
        for e in instance.all_logs(result.run_id)
        if "starting Spark" in (e.user_message or "")
    ]
    checks = {
        e.event_specific_data.check_name: e.event_specific_data.passed
        for e in result.all_events
        if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
    }
    out["on_demand"] = {
        "success": result.success,
        "spark_lines": lines,
        "binary_join": checks.get("matches_binary_join"),
        "stopped": SparkContext._active_spark_context is None,
    }
print(json.dumps(out))
"""


def readme_files() -> dict[str, str]:
    """The quick start's files, as README.md shows them: each block whose first line is
    ``# file: <path>``."""
    text = README.read_text()
    blocks = re.findall(r"```[a-z]*\n# file: (\S+)\n(.*?)```", text, flags=re.S)
    return dict(blocks)


def readme_definitions_py() -> str:
    return readme_files()["src/edges/definitions.py"]


def readme_defs_yaml() -> str:
    """The quick start's ``defs.yaml``, as README.md shows it (its ``# file:`` line kept)."""
    path = "src/edges/defs/triangles/defs.yaml"
    return f"# file: {path}\n" + readme_files()[path]


def project(root: Path) -> Path:
    """The quick start's project: the README's files, and the two empty ``__init__.py``."""
    root.mkdir()
    for path, text in readme_files().items():
        if path.endswith(".sh"):
            continue  # commands, run by the dg test
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "src" / "edges" / "__init__.py").write_text("")
    (root / "src" / "edges" / "defs" / "__init__.py").write_text("")
    return root


def land(root: Path, day: int, name: str, text: str) -> None:
    folder = root / "data" / "landing" / "edge" / f"2024-03-{day + 1:02d}"
    folder.mkdir(parents=True)
    (folder / name).write_text(text)


def triangles(edges: set[tuple[int, int]]) -> int:
    """Triangles of an undirected simple graph (each counted once), from scratch with numpy."""
    nodes = sorted({v for e in edges for v in e})
    index = {v: i for i, v in enumerate(nodes)}
    adj = np.zeros((len(nodes), len(nodes)), dtype=np.int64)
    for a, b in edges:
        adj[index[a], index[b]] = adj[index[b], index[a]] = 1
    return int(np.trace(adj @ adj @ adj)) // 6


@pytest.mark.spark  # the last run starts a JVM, in the subprocess
def test_the_quick_start_keeps_the_triangles_of_the_graph_as_a_set(tmp_path: Path) -> None:
    rng = random.Random(20)
    nodes = range(30)
    graph: set[tuple[int, int]] = set()
    while len(graph) < 140:
        a, b = rng.sample(nodes, 2)
        graph.add((min(a, b), max(a, b)))
    root = project(tmp_path / "edges")
    # Epoch 0: a SNAP edge list with every edge in both directions, as SNAP lists them.
    snap = "".join(f"{a}\t{b}\n{b}\t{a}\n" for a, b in sorted(graph))
    land(root, 0, "edges.txt", "# Undirected graph: each edge in both directions\n" + snap)
    expected = [triangles(graph)]
    ignored = [(0, 0)]
    for day in (1, 2, 3):
        present = sorted(graph)
        deleted = rng.sample(present, 12)
        again = rng.sample([e for e in present if e not in deleted], 5)
        absent: list[tuple[int, int]] = []
        while len(absent) < 3:
            a, b = rng.sample(nodes, 2)
            if (min(a, b), max(a, b)) not in graph and (a, b) not in absent:
                absent.append((min(a, b), max(a, b)))
        new: list[tuple[int, int]] = []
        while len(new) < 8:
            a, b = rng.sample(nodes, 2)
            e = (min(a, b), max(a, b))
            if e not in graph and e not in absent and e not in new:
                new.append(e)

        def either(e: tuple[int, int]) -> tuple[int, int]:
            return e if rng.random() < 0.5 else (e[1], e[0])

        rows = [(*either(e), -1) for e in deleted] + [(*either(e), 1) for e in again]
        rows += [(*either(e), -1) for e in absent] + [(*either(e), 1) for e in new]
        rng.shuffle(rows)
        land(
            root,
            day,
            "changes.csv",
            "src,dst,diff\n" + "".join(f"{a},{b},{d}\n" for a, b, d in rows),
        )
        graph = (graph - set(deleted)) | set(new)
        expected.append(triangles(graph))
        ignored.append((len(again), len(absent)))
    assert len(set(expected)) > 1  # the deletions change the answer

    keys = [f"2024-03-{d + 1:02d}" for d in range(4)]
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "HOME": str(tmp_path)}
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
    for t, epoch in enumerate(out["epochs"]):
        assert epoch["success"], (t, ran.stderr[-3000:])
        assert all(epoch["checks"].values()), (t, epoch["checks"])
        assert epoch["metadata"]["triangles"]["count"] == expected[t], t
        per_vertex = epoch["metadata"]["per_vertex"]
        assert (per_vertex["total"], per_vertex["count"]) == (3 * expected[t],) * 2, t
        assert epoch["metadata"]["in_triangles"]["triangles"] == expected[t], t
        deltas = epoch["metadata"]["edge_deltas"]
        found = (deltas["ignored (already present)"], deltas["ignored (not present)"])
        assert found == ignored[t], t  # in edges, as the user landed them
    # Local landing, local state: not one epoch started a JVM.
    assert out["jvm"] == [[False, False]] * len(keys)
    on_demand = out["on_demand"]
    assert on_demand["success"] and on_demand["binary_join"] is True
    (line,) = on_demand["spark_lines"]
    assert "the binary-join check of triangles at epoch 3" in line, line
    assert on_demand["stopped"]  # the resource stopped the session it started
