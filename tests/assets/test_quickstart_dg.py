"""The README's quick start followed as written, to ``dg dev``: the project runs its epochs.

A fresh virtual environment (which sees this one's packages, as a user's would after ``pip
install -e <this clone>``) gets the README's project files; the README's ``land.sh`` lands a
small graph as epoch 0 and a CSV of changes as epoch 1 on the two days before today; the
README's ``run.sh`` runs as written: ``pip install -e .``, ``python -m wcoj_assets.instance
init``, ``dg check defs``, and ``dg dev`` (started here on a free port). With nothing launched
by hand:

* the landing sensor runs both epochs, one at a time, oldest first, and each run succeeds;
* the history is kept in the project's ``.dagster`` (the instance ``.env`` names);
* the epochs start on the first landed day (two partitions, not years of them);
* ``triangles`` counts the graph's triangles as a set, at each epoch;
* the user's ``busiest_vertices`` (``reports.py``: each epoch's ``triangles_deltas`` as a polars
  ``LazyFrame``, ``follows_epochs()``) is run by the automation sensor for both epochs, and no
  run starts Spark;
* the UI says "Auto-materialize on", as it is.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from dagster_http import Webserver, failures, run_events, running_webserver
from test_quickstart import readme_files

pytestmark = pytest.mark.e2e  # `dg dev`: the Dagster webserver and daemon, in a fresh venv

SITE = Path(sys.executable).parents[1] / "lib" / "python3.11" / "site-packages"
WAIT_SECONDS = 600
GRAPH = [(1, 2), (2, 3), (1, 3), (3, 4), (2, 4), (4, 5), (5, 6), (4, 6), (6, 7), (7, 9), (9, 6)]

RUNS_QUERY = """
query {
  runsOrError {
    __typename
    ... on Runs {
      results { runId status startTime endTime tags { key value } assetSelection { path } }
    }
  }
}
"""

MATERIALIZATIONS_QUERY = """
query Mats($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) {
    __typename
    ... on Asset {
      assetMaterializations(limit: 100) {
        partition
        metadataEntries { label ... on IntMetadataEntry { intValue } }
      }
    }
  }
}
"""


def triangles(edges: set[tuple[int, int]]) -> int:
    nodes = sorted({v for e in edges for v in e})
    index = {v: i for i, v in enumerate(nodes)}
    adj = np.zeros((len(nodes), len(nodes)), dtype=np.int64)
    for a, b in edges:
        adj[index[a], index[b]] = adj[index[b], index[a]] = 1
    return int(np.trace(adj @ adj @ adj)) // 6


def environment(venv: Path) -> Path:
    """A virtual environment that sees this one's packages (wcoj, Dagster, dg): what a user has
    after installing wcoj; ``pip`` and ``dg`` on its PATH."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "parent.pth").write_text(f"import site; site.addsitedir({str(SITE)!r})\n")
    python = venv / "bin" / "python"
    for name, module in (("pip", "pip._internal.cli.main"), ("dg", "dagster_dg_cli.cli")):
        script = venv / "bin" / name
        script.write_text(f"#!{python}\nimport sys\nfrom {module} import main\nsys.exit(main())\n")
        script.chmod(0o755)
    return venv


def graphql_runs(server: Webserver) -> list[dict]:
    found = server.graphql(RUNS_QUERY)["runsOrError"]
    assert found["__typename"] == "Runs", found
    return found["results"]


def counts(server: Webserver, asset: str) -> dict[str, dict[str, int]]:
    found = server.graphql(MATERIALIZATIONS_QUERY, {"path": [asset]})["assetOrError"]
    if found["__typename"] != "Asset":
        return {}
    return {
        m["partition"]: {e["label"]: e.get("intValue") for e in m["metadataEntries"]}
        for m in found["assetMaterializations"]
    }


def test_the_quick_start_as_written_runs_under_dg_dev(tmp_path: Path) -> None:
    venv = environment(tmp_path / "venv")
    root = tmp_path / "edges"
    files = readme_files()
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "src" / "edges" / "__init__.py").write_text("")
    (root / "src" / "edges" / "defs" / "__init__.py").write_text("")
    (root / "my-graph.txt").write_text("".join(f"{a}\t{b}\n" for a, b in GRAPH))
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "NO_COLOR": "1",
        "PIP_NO_DEPS": "1",  # wcoj is there already (the project's build takes setuptools)
    }
    shell = {**env, "PATH": env["PATH"]}
    landed = subprocess.run(
        ["bash", "-e", str(root / "land.sh")], cwd=root, env=shell, capture_output=True, text=True
    )
    assert landed.returncode == 0, landed.stderr
    commands = [line for line in files["run.sh"].splitlines() if line.strip()]
    assert commands[-1].startswith("dg dev")
    for line in commands[:-1]:
        done = subprocess.run(
            ["bash", "-e", "-c", line.split("#")[0]],
            cwd=root,
            env=shell,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (line, done.stdout[-3000:], done.stderr[-3000:])
    today = dt.datetime.now(dt.UTC).date()
    keys = [(today - dt.timedelta(days=d)).isoformat() for d in (2, 1)]
    graph = {(min(a, b), max(a, b)) for a, b in GRAPH}
    expected = {keys[0]: triangles(graph), keys[1]: triangles((graph - {(1, 2)}) | {(7, 9)})}

    os.environ.pop("DAGSTER_HOME", None)
    with running_webserver(
        tmp_path / "logs",
        root,
        [],
        instance_yaml=None,
        program=venv / "bin" / "dg",
        arguments=("dev",),
    ) as server:
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            runs = graphql_runs(server)
            done = [r for r in runs if r["status"] in {"SUCCESS", "FAILURE", "CANCELED"}]
            mine = counts(server, "busiest_vertices")
            if len(done) == len(runs) and set(mine) >= set(keys):
                break
            time.sleep(3)
        else:
            pytest.fail(f"the epochs and the user's asset did not run:\n{server.output()}")
        runs = graphql_runs(server)
        for run in runs:
            assert run["status"] == "SUCCESS", failures(run_events(server, run["runId"]))
        epochs = sorted(
            (
                r
                for r in runs
                if any(t["key"] == "dagster/sensor_name" for t in r["tags"])
                and any(t["value"] == "triangles_landing_sensor" for t in r["tags"])
            ),
            key=lambda r: r["startTime"],
        )
        partitions = [
            next(t["value"] for t in r["tags"] if t["key"] == "dagster/partition") for r in epochs
        ]
        assert partitions == keys  # each epoch once, oldest first
        assert epochs[0]["endTime"] <= epochs[1]["startTime"]  # one at a time
        found = counts(server, "triangles")
        assert {k: found[k]["count"] for k in keys} == expected
        spark = [
            e["message"]
            for r in runs
            for e in run_events(server, r["runId"])
            if "starting Spark" in (e.get("message") or "")
        ]
        assert spark == []
        # The UI says automation is on, as it is (the pipeline's automation sensor runs).
        assert server.graphql("{ instance { autoMaterializePaused } }")["instance"] == {
            "autoMaterializePaused": False
        }
    assert (root / ".dagster" / "history" / "runs.db").exists()  # the history is kept
