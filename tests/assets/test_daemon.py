"""`dagster dev` end to end: the sensor runs new epochs, a correction, a backfill from the UI's API.

What `make ui` gives a user, driven the way the UI drives it: a project folder with a
``workspace.yaml`` loading the default code location (state and landing under ``.wcoj/`` of the
folder), an instance limiting ``wcoj/serial`` runs to one at a time, and ``dagster dev``
(webserver and daemon). The test lands four epochs and waits for the daemon's sensor to run each
of them; lands a correction of epoch 1 and waits for the sensor's re-run; checks that this run
reported ``current_history`` failed on exactly the later partitions of every derived asset; then
launches an asset backfill of the later epochs through GraphQL (``launchPartitionBackfill``, as
the UI's backfill dialog does), waits for the daemon to complete it (in several runs, in dependency
order), and compares every output with the oracle over the corrected history.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from dagster_http import (
    DAGSTER,
    JOB,
    Webserver,
    declared,
    failures,
    loaded_location,
    run_events,
    running_webserver,
)
from pyspark.sql import SparkSession
from wcoj_support import Changes, multiset, oracle, updates, write_landing

from wcoj_assets.epochs import epoch_key
from wcoj_assets.provenance import CURRENT
from wcoj_assets.resources import WcojResource
from wcoj_assets.sensors import SERIAL_TAG
from wcoj_assets.specs import DEFAULT_SPECS, Topology

EPOCHS = 4
WAIT_SECONDS = 600

INSTANCE_YAML = """\
telemetry:
  enabled: false
concurrency:
  runs:
    tag_concurrency_limits:
      - key: "wcoj/serial"
        limit: 1
"""

WORKSPACE_YAML = """\
load_from:
  - python_module:
      module_name: wcoj_assets.definitions
      working_directory: {folder}
"""

SENSOR_RUNS = """
query {
  runsOrError(filter: {tags: [{key: "dagster/sensor_name", value: "wcoj_landing_sensor"}]}) {
    __typename
    ... on Runs { results { runId status tags { key value } } }
    ... on PythonError { message }
  }
}
"""

BACKFILL_MUTATION = """
mutation Backfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""

BACKFILL_QUERY = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { status runs(limit: 100) { runId status } error { message } }
    ... on Error { message }
  }
}
"""

FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}


def sensor_runs(server: Webserver) -> list[dict[str, Any]]:
    found = server.graphql(SENSOR_RUNS)["runsOrError"]
    assert found["__typename"] == "Runs", found
    return found["results"]


def partition(run: dict[str, Any]) -> str:
    return next(t["value"] for t in run["tags"] if t["key"] == "dagster/partition")


def wait_for_sensor_runs(server: Webserver, count: int) -> list[dict[str, Any]]:
    """Wait until the sensor has launched `count` runs and all of them ended; return them."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        runs = sensor_runs(server)
        if len(runs) >= count and all(r["status"] in FINISHED for r in runs):
            return runs
        time.sleep(2)
    pytest.fail(f"the sensor's runs did not end within {WAIT_SECONDS}s:\n{server.output()}")


def backfill(server: Webserver, assets: set[str], partitions: list[str]) -> dict[str, Any]:
    """Launch an asset backfill as the UI does and wait for the daemon to finish it."""
    params = {
        "assetSelection": [{"path": a.split("/")} for a in sorted(assets)],
        "partitionNames": partitions,
        "tags": [{"key": SERIAL_TAG, "value": "epochs"}],
        "title": "after a corrected epoch",
    }
    launched = server.graphql(BACKFILL_MUTATION, {"params": params})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        found = server.graphql(BACKFILL_QUERY, {"id": launched["backfillId"]})
        state = found["partitionBackfillOrError"]
        assert state["__typename"] == "PartitionBackfill", state
        if state["status"] not in {"REQUESTED", "CANCELING", "FAILING"}:
            return state
        time.sleep(2)
    pytest.fail(f"the backfill did not finish within {WAIT_SECONDS}s:\n{server.output()}")


def current_history(events: list[dict[str, Any]]) -> dict[tuple[str, str | None], bool]:
    """The run's `current_history` evaluations: (asset, partition) -> passed (last one wins)."""
    return {
        ("/".join(v["assetKey"]["path"]), v["partition"]): v["success"]
        for e in events
        if e["__typename"] == "AssetCheckEvaluationEvent"
        and (v := e["evaluation"])["checkName"] == CURRENT
    }


def test_sensor_correction_and_backfill_through_dagster_dev(
    small: SparkSession, tmp_path: Path
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "workspace.yaml").write_text(WORKSPACE_YAML.format(folder=folder))
    landing = folder / ".wcoj" / "landing"
    history: list[Changes] = updates(seed=23, epochs=EPOCHS)
    for n, changes in enumerate(history):
        write_landing(landing, n, changes, "csv")
    keys = [epoch_key(n) for n in range(EPOCHS)]

    with running_webserver(
        tmp_path / "home",
        folder,
        ["-w", "workspace.yaml"],
        instance_yaml=INSTANCE_YAML,
        program=DAGSTER,
        arguments=("dev",),
    ) as server:
        loaded_location(server, JOB)
        assets, _ = declared(server, JOB)

        # The daemon's sensor finds the four epochs and runs them, one at a time, in order.
        runs = wait_for_sensor_runs(server, EPOCHS)
        assert sorted(partition(r) for r in runs) == keys
        assert all(r["status"] == "SUCCESS" for r in runs), runs
        first = {r["runId"] for r in runs}

        # A corrected epoch 1: the sensor re-runs that epoch alone.
        corrected = list(history)
        extra = [(0, 7), (7, 8), (0, 8), (1, 7), (1, 8)]
        corrected[1] = [*history[1], *[(e, 1) for e in extra], *[((b, a), 1) for a, b in extra]]
        write_landing(landing, 1, corrected[1], "csv")
        runs = wait_for_sensor_runs(server, EPOCHS + 1)
        (rerun,) = [r for r in runs if r["runId"] not in first]
        events = run_events(server, rerun["runId"])
        assert rerun["status"] == "SUCCESS", failures(events)
        assert partition(rerun) == keys[1]
        reported = current_history(events)
        stale = {key for key, passed in reported.items() if not passed}
        derived = {asset for asset, key in reported if key == keys[1]}
        assert {"triangles", "triangles_deltas", "triangles_rule_0", "edge_counts_c0"} <= derived
        assert stale == {(asset, key) for asset in derived for key in keys[2:]}

        # The backfill of the later epochs, launched as the UI does. The daemon runs it in
        # dependency order — a self-dependent asset never shares a run, and it requests whatever
        # partitions are ready, so how many runs it takes varies — and each rebuilt partition
        # reports `current_history` passed.
        done = backfill(server, assets, keys[2:])
        assert done["status"] in {"COMPLETED", "COMPLETED_SUCCESS"}, (done, server.output())
        reported = {}
        for run in done["runs"]:
            events = run_events(server, run["runId"])
            assert run["status"] == "SUCCESS", failures(events)
            reported |= current_history(events)
        assert all(reported[(asset, key)] for asset in derived for key in keys[2:]), reported

    resource = WcojResource(storage=str(folder / ".wcoj" / "state"))
    topo = Topology.of(DEFAULT_SPECS)
    state = resource.history(topo.queries)
    for n in range(EPOCHS):
        expected = oracle(topo, "triangles", corrected, n)
        assert multiset(state.output("triangles", n)) == expected, f"triangles at epoch {n}"
