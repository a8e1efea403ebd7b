"""`dagster dev` end to end: the sensor runs new epochs; after a correction the automation
sensor rebuilds the later epochs by itself; with it stopped, a backfill from the UI's API does.

What `make ui` gives a user, driven the way the UI drives it: a project folder with a
``workspace.yaml`` loading the default code location (state and landing under ``.wcoj/`` of the
folder, epochs from ``WCOJ_EPOCH_START``), an instance limiting ``wcoj/serial`` runs to one at a
time, and ``dagster dev`` (webserver and daemon). The test lands four epochs and waits for the
daemon's sensor to run each of them. It lands a correction of epoch 1 and waits for the sensor's
re-run, which reports ``current_history`` failed on exactly the later partitions of the query's
change;
then, with no backfill launched by anyone, waits for the automation sensor's backfill to
bring every output back to the oracle over the corrected history, each rebuilt partition
reporting ``current_history`` passed. Last, the manual path: it stops the automation sensor (as
the UI's toggle does), corrects epoch 1 again, launches ONE run of the epoch job over the later
epochs through GraphQL (``launchRun`` with the range tags, as the UI's launchpad does), and
compares every output with the oracle.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from dagster_http import (
    DAGSTER,
    JOB,
    Webserver,
    failures,
    launch,
    loaded_location,
    run_events,
    running_webserver,
    stop_sensor,
    wait_for_run,
)
from pyspark.sql import SparkSession
from wcoj_support import Changes, multiset, oracle, updates, write_landing

from wcoj_assets.definitions import SENSOR_ENV
from wcoj_assets.epochs import START_ENV, Epochs
from wcoj_assets.provenance import CURRENT, REBUILD_SENSOR
from wcoj_assets.resources import WcojResource
from wcoj_assets.sensors import SERIAL_TAG
from wcoj_assets.specs import DEFAULT_SPECS, Topology
from wcoj_core.engine import Engine

EPOCHS = 4
START = "2024-03-01"
WAIT_SECONDS = 600

pytestmark = pytest.mark.e2e  # dagster dev: the webserver and the daemon

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

BACKFILLS_QUERY = """
query {
  partitionBackfillsOrError(limit: 100) {
    __typename
    ... on PartitionBackfills {
      results { id status tags { key value } runs(limit: 100) { runId status } }
    }
    ... on PythonError { message }
  }
}
"""

RUNS_QUERY = """
query {
  runsOrError {
    __typename
    ... on Runs { results { runId status tags { key value } } }
    ... on PythonError { message }
  }
}
"""

FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}
BACKFILL_RUNNING = {"REQUESTED", "CANCELING", "FAILING"}


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


def automation_backfills(server: Webserver) -> list[dict[str, Any]]:
    """The asset backfills the automation sensor launched."""
    found = server.graphql(BACKFILLS_QUERY)["partitionBackfillsOrError"]
    assert found["__typename"] == "PartitionBackfills", found
    return [
        b
        for b in found["results"]
        if {"key": "dagster/sensor_name", "value": REBUILD_SENSOR} in b["tags"]
    ]


def wait_for_rebuild(
    server: Webserver, state: Engine, expected: dict[int, Counter]
) -> list[dict[str, Any]]:
    """Wait until the automation's backfills ended, no partition is stale and every output is
    the expected one; return those backfills."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        launched = automation_backfills(server)
        if (
            launched
            and all(b["status"] not in BACKFILL_RUNNING for b in launched)
            and not state.stale()
            and all(multiset(state.output("triangles", n)) == e for n, e in expected.items())
        ):
            return launched
        time.sleep(5)
    pytest.fail(
        f"the automation did not rebuild within {WAIT_SECONDS}s: {rebuild_state(server, state, expected)}"
    )


def rebuild_state(server: Webserver, state: Engine, expected: dict[int, Counter]) -> str:
    """What a stalled rebuild left: the automation's backfills and their runs, the stale epochs,
    the outputs that differ from the oracle's, every run's status, and the log's lines about
    requests and failures (the tail alone is the daemon's idle ticks)."""
    wrong = [n for n, e in expected.items() if multiset(state.output("triangles", n)) != e]
    found = server.graphql(RUNS_QUERY)["runsOrError"]
    runs = [
        (r["runId"][:8], r["status"], {t["key"]: t["value"] for t in r["tags"]})
        for r in found.get("results", [])
    ]
    log = server.log.read_text(errors="replace").splitlines() if server.log.exists() else []
    notable = [
        line
        for line in log
        if any(w in line for w in ("Tick produced", "ERROR", "Error", "backfill", "Backfill"))
        and "produced 0 runs" not in line
    ]
    return (
        f"\nbackfills: {automation_backfills(server)}\nstale: {state.stale()}"
        f"\noutputs unlike the oracle's at epochs {wrong}\nruns: {runs}\nlog:\n"
        + "\n".join(notable[-80:])
        + f"\n...\n{server.output(20)}"
    )


def current_history(events: list[dict[str, Any]]) -> dict[tuple[str, str | None], bool]:
    """The run's `current_history` evaluations: (asset, partition) -> passed (last one wins)."""
    return {
        ("/".join(v["assetKey"]["path"]), v["partition"]): v["success"]
        for e in events
        if e["__typename"] == "AssetCheckEvaluationEvent"
        and (v := e["evaluation"])["checkName"] == CURRENT
    }


def correct(history: list[Changes], epoch: int, extra: list[tuple[int, int]]) -> list[Changes]:
    """`history` with undirected edges `extra` inserted at `epoch` (both directions)."""
    corrected = list(history)
    corrected[epoch] = [*history[epoch], *[(e, 1) for e in extra], *[((b, a), 1) for a, b in extra]]
    return corrected


def test_sensor_correction_automation_and_backfill_through_dagster_dev(
    small: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(START_ENV, START)  # read by the code location `dagster dev` loads
    monkeypatch.setenv(SENSOR_ENV, "5")  # its sensors tick every 5 s instead of 30
    epochs = Epochs(START)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "workspace.yaml").write_text(WORKSPACE_YAML.format(folder=folder))
    landing = folder / ".wcoj" / "landing"
    history: list[Changes] = updates(seed=23, epochs=EPOCHS)
    for n, changes in enumerate(history):
        write_landing(landing, n, changes, "csv", start=START)
    keys = [epochs.key(n) for n in range(EPOCHS)]
    topo = Topology.of(DEFAULT_SPECS)

    with running_webserver(
        tmp_path / "home",
        folder,
        ["-w", "workspace.yaml"],
        instance_yaml=INSTANCE_YAML,
        program=DAGSTER,
        arguments=("dev",),
    ) as server:
        location, repository = loaded_location(server, JOB)

        # The daemon's sensor finds the four epochs and runs them, one at a time, in order.
        runs = wait_for_sensor_runs(server, EPOCHS)
        assert sorted(partition(r) for r in runs) == keys
        assert all(r["status"] == "SUCCESS" for r in runs), runs
        first = {r["runId"] for r in runs}
        resource = WcojResource(
            master=small.sparkContext.master, storage=str(folder / ".wcoj" / "state")
        )
        state = resource.engine(topo)

        # A corrected epoch 1: the sensor re-runs that epoch alone, which reports the later
        # partitions of the query's change stale.
        corrected = correct(history, 1, [(0, 7), (7, 8), (0, 8), (1, 7), (1, 8)])
        write_landing(landing, 1, corrected[1], "csv", start=START)
        runs = wait_for_sensor_runs(server, EPOCHS + 1)
        (rerun,) = [r for r in runs if r["runId"] not in first]
        events = run_events(server, rerun["runId"])
        assert rerun["status"] == "SUCCESS", failures(events)
        assert partition(rerun) == keys[1]
        reported = current_history(events)
        stale = {key for key, passed in reported.items() if not passed}
        derived = {asset for asset, key in reported if key == keys[1]}
        assert derived == {"triangles_deltas"}
        assert stale == {(asset, key) for asset in derived for key in keys[2:]}

        # Nobody launches a backfill: the automation sensor requests the failed partitions and
        # the daemon rebuilds them, in dependency order, until the outputs are the oracle's.
        expected = {n: oracle(topo, "triangles", corrected, n) for n in range(EPOCHS)}
        launched = wait_for_rebuild(server, state, expected)
        passed: set[tuple[str, str | None]] = set()
        for done in launched:
            assert done["status"] in {"COMPLETED", "COMPLETED_SUCCESS"}, (done, server.output())
            for run in done["runs"]:
                events = run_events(server, run["runId"])
                assert run["status"] == "SUCCESS", failures(events)
                passed |= {key for key, ok in current_history(events).items() if ok}
        assert stale <= passed, stale - passed

        # The manual path, with the automation stopped: a correction of epoch 1 again, re-run by
        # the landing sensor, then ONE run over the later epochs launched from the launchpad
        # (its range tags; the asset graph's backfill: tests/assets/test_asset_graph_backfill.py).
        stop_sensor(server, location, repository, REBUILD_SENSOR)
        automated = {b["id"] for b in automation_backfills(server)}
        again = correct(corrected, 1, [(2, 7), (2, 8)])
        write_landing(landing, 1, again[1], "csv", start=START)
        runs = wait_for_sensor_runs(server, EPOCHS + 2)
        earlier = first | {rerun["runId"]}
        (rerun,) = [r for r in runs if r["runId"] not in earlier]
        assert partition(rerun) == keys[1]
        events = run_events(server, rerun["runId"])
        assert rerun["status"] == "SUCCESS", failures(events)
        stale = {key for key, passed in current_history(events).items() if not passed}
        assert stale == {(asset, key) for asset in derived for key in keys[2:]}
        run_id = launch(
            server, location, repository, JOB, (keys[2], keys[3]), {}, {SERIAL_TAG: "epochs"}
        )
        status = wait_for_run(server, run_id)
        events = run_events(server, run_id)
        assert status == "SUCCESS", failures(events)
        reported = current_history(events)
        assert all(reported[key] for key in stale), reported
        assert {b["id"] for b in automation_backfills(server)} == automated

    assert not state.stale()
    for n in range(EPOCHS):
        expected_n = oracle(topo, "triangles", again, n)
        assert multiset(state.output("triangles", n)) == expected_n, f"triangles at epoch {n}"
