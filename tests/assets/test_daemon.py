"""`dagster dev` end to end: the sensor runs new epochs; after a correction the rebuild sensor
rebuilds the later epochs by itself; with it stopped, a run from the UI's launchpad does.

What `make ui` gives a user, driven the way the UI drives it: a project folder with a
``workspace.yaml`` loading the default code location (state and landing under ``.wcoj/`` of the
folder, epochs from ``WCOJ_EPOCH_START``), an instance limiting ``wcoj/serial`` runs to one at a
time, and ``dagster dev`` (webserver and daemon). The test lands four epochs and waits until
the daemon's sensor has made each from the files landed (`wait_for_landed`). It lands a
correction of epoch 1 and waits until the sensor's re-run has made it, which reports
``current_history`` failed on exactly the later partitions of the query's change; then, with
nothing launched by anyone, waits until the automation has rebuilt them: every output equal to
the oracle's over the corrected history, nothing stale, nothing running (`wait_for_rebuild`) —
however Dagster launched the rebuild (one ranged run is what the rebuild sensor requests, and
`tests/assets/test_pipeline.py` proves it; here a run per epoch or a backfill would pass too).
Every run of the rebuild is the automation's, succeeded, ran alone, and reports
``current_history`` passed on every partition that had failed. Last, the manual path: it stops
the rebuild sensor (as the UI's toggle does), corrects epoch 1 again, launches ONE run of the
epoch job over the later epochs through GraphQL (``launchRun`` with the range tags, as the UI's
launchpad does), and compares every output with the oracle; the stopped sensor launched nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from itertools import pairwise
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
from wcoj_assets.landing_read import fingerprint, landed_files
from wcoj_assets.provenance import CURRENT, REBUILD_SENSOR
from wcoj_assets.report import FINGERPRINT
from wcoj_assets.resources import WcojResource
from wcoj_assets.sensors import LANDING_SENSOR, SERIAL_TAG
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
    ... on Runs { results { runId status startTime endTime tags { key value } } }
    ... on PythonError { message }
  }
}
"""

LANDED_QUERY = """
query Landed($partitions: [String!]) {
  assetOrError(assetKey: {path: ["edge_deltas"]}) {
    __typename
    ... on Asset {
      assetMaterializations(partitions: $partitions) {
        partition runId timestamp metadataEntries { label ... on TextMetadataEntry { text } }
      }
    }
  }
}
"""

FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}
# The log lines a stalled rebuild's message shows: requests, launches and errors.
NOTABLE = ("Tick produced", "Launching run", "ERROR", "Error", "backfill", "Backfill")
BACKFILL_RUNNING = {"REQUESTED", "CANCELING", "FAILING"}


def all_runs(server: Webserver) -> list[dict[str, Any]]:
    found = server.graphql(RUNS_QUERY)["runsOrError"]
    assert found["__typename"] == "Runs", found
    return found["results"]


def tag(run: dict[str, Any], key: str) -> str | None:
    return next((t["value"] for t in run["tags"] if t["key"] == key), None)


def sensor_runs(server: Webserver) -> list[dict[str, Any]]:
    return [r for r in all_runs(server) if tag(r, "dagster/sensor_name") == LANDING_SENSOR]


def partition(run: dict[str, Any]) -> str | None:
    return tag(run, "dagster/partition")


def made_from(server: Webserver, keys: list[str]) -> dict[str, str]:
    """Each partition of `keys` -> the landed fingerprint its latest ``edge_deltas``
    materialization records (partitions never made are left out)."""
    found = server.graphql(LANDED_QUERY, {"partitions": keys})["assetOrError"]
    assert found["__typename"] == "Asset", found
    latest: dict[str, tuple[float, str]] = {}
    for m in found["assetMaterializations"]:
        text = next((e.get("text") for e in m["metadataEntries"] if e["label"] == FINGERPRINT), "")
        if float(m["timestamp"]) > latest.get(m["partition"], (-1.0, ""))[0]:  # newest first
            latest[m["partition"]] = (float(m["timestamp"]), text or "")
    return {k: v for k, (_, v) in latest.items()}


def wait_for_landed(server: Webserver, landing: Path, keys: list[str]) -> list[dict[str, Any]]:
    """Wait until every epoch of `keys` was last made from the files landed now and none of the
    landing sensor's runs is still to end (however many ticks that took); return its runs."""
    landed = {k: fingerprint(landed_files(str(landing), "edge", k).files) for k in keys}
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        runs = sensor_runs(server)
        if made_from(server, keys) == landed and all(r["status"] in FINISHED for r in runs):
            return runs
        time.sleep(2)
    pytest.fail(
        f"the landed epochs were not made within {WAIT_SECONDS}s: made from "
        f"{made_from(server, keys)}, landed {landed}:\n{server.output()}"
    )


def automation_backfills(server: Webserver) -> list[dict[str, Any]]:
    """The asset backfills the automation sensor launched."""
    found = server.graphql(BACKFILLS_QUERY)["partitionBackfillsOrError"]
    assert found["__typename"] == "PartitionBackfills", found
    return [
        b
        for b in found["results"]
        if {"key": "dagster/sensor_name", "value": REBUILD_SENSOR} in b["tags"]
    ]


def automation_runs(server: Webserver) -> list[dict[str, Any]]:
    """The runs the rebuild sensor launched, itself or through its backfills."""
    backfills = {b["id"] for b in automation_backfills(server)}
    return [
        r
        for r in all_runs(server)
        if tag(r, "dagster/sensor_name") == REBUILD_SENSOR
        or tag(r, "dagster/backfill") in backfills
    ]


def wait_for_rebuild(server: Webserver, state: Engine, expected: dict[int, Counter]) -> None:
    """Wait until no epoch is stale, every output is the expected one and no run or backfill
    is still to end — whether the automation rebuilt with one run, a run per epoch or
    backfills, in however many ticks."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if (
            not state.stale()
            and all(multiset(state.output("triangles", n)) == e for n, e in expected.items())
            and all(r["status"] in FINISHED for r in all_runs(server))
            and all(b["status"] not in BACKFILL_RUNNING for b in automation_backfills(server))
        ):
            return
        time.sleep(5)
    pytest.fail(
        f"the automation did not rebuild within {WAIT_SECONDS}s: {rebuild_state(server, state, expected)}"
    )


def rebuild_state(server: Webserver, state: Engine, expected: dict[int, Counter]) -> str:
    """What a stalled rebuild left: the automation's backfills and their runs, the stale epochs,
    the outputs that differ from the oracle's, every run's status and tags, and the log's lines
    about requests and failures (the tail alone is the daemon's idle ticks)."""
    wrong = [n for n, e in expected.items() if multiset(state.output("triangles", n)) != e]
    runs = [
        (r["runId"][:8], r["status"], {t["key"]: t["value"] for t in r["tags"]})
        for r in all_runs(server)
    ]
    log = server.log.read_text(errors="replace").splitlines() if server.log.exists() else []
    notable = [
        line for line in log if any(w in line for w in NOTABLE) and "produced 0 runs" not in line
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

        # The daemon's sensor finds the four epochs and runs each of them once, one at a time.
        runs = wait_for_landed(server, landing, keys)
        assert sorted(partition(r) or "" for r in runs) == keys
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
        runs = wait_for_landed(server, landing, keys[1:2])
        (rerun,) = [r for r in runs if r["runId"] not in first]
        events = run_events(server, rerun["runId"])
        assert rerun["status"] == "SUCCESS", failures(events)
        assert partition(rerun) == keys[1]
        reported = current_history(events)
        stale = {key for key, passed in reported.items() if not passed}
        derived = {asset for asset, key in reported if key == keys[1]}
        assert derived == {"triangles_deltas"}
        assert stale == {(asset, key) for asset in derived for key in keys[2:]}

        # Nobody launches anything: the automation rebuilds the failed partitions, one run at a
        # time (each epoch after the one it reads: the outputs prove the order), until the
        # outputs are the oracle's and nothing is stale.
        expected = {n: oracle(topo, "triangles", corrected, n) for n in range(EPOCHS)}
        wait_for_rebuild(server, state, expected)
        rebuilt = automation_runs(server)
        assert rebuilt, f"no run of the automation: {rebuild_state(server, state, expected)}"
        for done in automation_backfills(server):
            assert done["status"] in {"COMPLETED", "COMPLETED_SUCCESS"}, (done, server.output())
        others = [r for r in all_runs(server) if r["runId"] not in first | {rerun["runId"]}]
        assert {r["runId"] for r in others} == {r["runId"] for r in rebuilt}, others
        passed: set[tuple[str, str | None]] = set()
        for run in rebuilt:
            events = run_events(server, run["runId"])
            assert run["status"] == "SUCCESS", failures(events)
            passed |= {key for key, ok in current_history(events).items() if ok}
        assert stale <= passed, stale - passed
        spans = sorted((r["startTime"], r["endTime"]) for r in [rerun, *rebuilt])
        assert all(a[1] <= b[0] for a, b in pairwise(spans)), spans

        # The manual path, with the automation stopped: a correction of epoch 1 again, re-run by
        # the landing sensor, then ONE run over the later epochs launched from the launchpad
        # (its range tags; the asset graph's backfill: tests/assets/test_asset_graph_backfill.py).
        stop_sensor(server, location, repository, REBUILD_SENSOR)
        automated = {r["runId"] for r in rebuilt}
        again = correct(corrected, 1, [(2, 7), (2, 8)])
        write_landing(landing, 1, again[1], "csv", start=START)
        runs = wait_for_landed(server, landing, keys[1:2])
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
        assert {r["runId"] for r in automation_runs(server)} == automated

    assert not state.stale()
    for n in range(EPOCHS):
        expected_n = oracle(topo, "triangles", again, n)
        assert multiset(state.output("triangles", n)) == expected_n, f"triangles at epoch {n}"
