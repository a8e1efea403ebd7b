"""A folder named for today (UTC) lands beside a correction: the pipeline keeps running.

Under ``dagster dev`` over the default code location, with the landing sensor on (every 5 s) and
the automation sensor stopped (this is about the landing sensor alone), three past epochs and a
folder named for today land at once. Today is not a partition until it ends, so the sensor
must run the three epochs and leave today's folder waiting, naming it in one warning line.
Then epoch 1 is corrected: the sensor must run the correction at once, whatever today's folder
does, and the correction's output must be the oracle's. Where Chromium, Node.js and
playwright-core are installed, ``tests/assets/ui/landing_sensor.mjs`` looks at it as a user
does — the sensor's page and its latest tick's log, the Runs list — and must see the one warning
line and the correction's run succeed; elsewhere the same is read from the webserver's GraphQL.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
from dagster_http import (
    DAGSTER,
    JOB,
    UI,
    Webserver,
    browser_missing,
    loaded_location,
    run_ui_script,
    running_webserver,
    stop_sensor,
)
from test_asset_graph_backfill import INSTANCE_YAML, WORKSPACE_YAML
from wcoj_support import oracle, updates, write_landing

from wcoj_assets.definitions import SENSOR_ENV
from wcoj_assets.epochs import START_ENV, Epochs
from wcoj_assets.provenance import REBUILD_SENSOR
from wcoj_assets.resources import WcojResource
from wcoj_assets.sensors import LANDING_SENSOR
from wcoj_assets.specs import DEFAULT_SPECS, Topology
from wcoj_core.state_read import read_table
from wcoj_core.traces import output_trace_name

pytestmark = pytest.mark.e2e  # `dagster dev`: webserver and daemon

SCRIPT = UI / "landing_sensor.mjs"
WAIT_SECONDS = 600
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}

SENSOR_RUNS = """
query {
  runsOrError(filter: {tags: [{key: "dagster/sensor_name", value: "wcoj_landing_sensor"}]}) {
    __typename
    ... on Runs { results { runId status tags { key value } } }
  }
}
"""

TICKS = """
query Ticks($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor {
      sensorState {
        ticks(limit: 200) {
          status skipReason runIds error { message }
          logEvents { events { level message } }
        }
      }
    }
  }
}
"""


def sensor_runs(server: Webserver) -> dict[str, list[str]]:
    """The landing sensor's runs: each partition's statuses, oldest run first."""
    found = server.graphql(SENSOR_RUNS)["runsOrError"]
    assert found["__typename"] == "Runs", found
    out: dict[str, list[str]] = {}
    for run in reversed(found["results"]):
        key = next(t["value"] for t in run["tags"] if t["key"] == "dagster/partition")
        out.setdefault(key, []).append(run["status"])
    return out


def wait_for_runs(
    server: Webserver, sensor: tuple[str, str], wanted: dict[str, int]
) -> dict[str, list[str]]:
    """Wait until the sensor has run each partition of `wanted` that many times, every run
    ended; return every partition's statuses. A failed tick of the sensor fails at once."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        failed = [t for t in ticks(server, *sensor) if t["status"] == "FAILURE"]
        assert not failed, failed[0]["error"]
        runs = sensor_runs(server)
        ended = all(s in FINISHED for statuses in runs.values() for s in statuses)
        if ended and all(len(runs.get(k, [])) >= n for k, n in wanted.items()):
            return runs
        time.sleep(2)
    pytest.fail(f"the sensor's runs did not end within {WAIT_SECONDS}s:\n{server.output()}")


def ticks(server: Webserver, location: str, repository: str) -> list[dict[str, Any]]:
    """The landing sensor's ticks, newest first."""
    selector = {
        "repositoryLocationName": location,
        "repositoryName": repository,
        "sensorName": LANDING_SENSOR,
    }
    found = server.graphql(TICKS, {"selector": selector})["sensorOrError"]
    assert found["__typename"] == "Sensor", found
    return found["sensorState"]["ticks"]


def look(url: str, sensor_path: str, partition: str, shots: Path) -> dict[str, Any]:
    return run_ui_script(SCRIPT, url, sensor_path, partition, shots=shots)


def test_todays_folder_waits_in_one_warning_line_while_a_correction_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = dt.datetime.now(dt.UTC)
    # Today's folder, unless the day ends within the test's time: then tomorrow's (neither is a
    # partition before the test ends).
    late = now.hour == 23 and now.minute >= 30
    today = now.date() + dt.timedelta(days=1 if late else 0)
    start = (now.date() - dt.timedelta(days=3)).isoformat()
    monkeypatch.setenv(START_ENV, start)
    monkeypatch.setenv(SENSOR_ENV, "5")
    epochs = Epochs(start)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "workspace.yaml").write_text(WORKSPACE_YAML.format(folder=folder))
    landing = folder / ".wcoj" / "landing"
    history = updates(seed=43, epochs=3)
    for n, changes in enumerate(history):
        write_landing(landing, n, changes, "csv", start=start)
    early = epochs.number(today.isoformat())
    write_landing(landing, early, updates(seed=44, epochs=1)[0], "csv", start=start)
    keys = [epochs.key(n) for n in range(3)]

    with running_webserver(
        tmp_path / "home",
        folder,
        ["-w", "workspace.yaml"],
        instance_yaml=INSTANCE_YAML,
        program=DAGSTER,
        arguments=("dev",),
    ) as server:
        location, repository = loaded_location(server, JOB)
        stop_sensor(server, location, repository, REBUILD_SENSOR)
        runs = wait_for_runs(server, (location, repository), {k: 1 for k in keys})
        assert runs == {k: ["SUCCESS"] for k in keys}, runs

        history[1] = [*history[1], ((1, 2), 1), ((2, 3), 1), ((1, 3), 1)]  # one more triangle
        write_landing(landing, 1, history[1], "csv", start=start)
        runs = wait_for_runs(server, (location, repository), {keys[1]: 2})
        assert runs == {keys[0]: ["SUCCESS"], keys[1]: ["SUCCESS"] * 2, keys[2]: ["SUCCESS"]}

        # The newest ticks that have ended (one may be under way, its log not yet written).
        seen = [t for t in ticks(server, location, repository) if t["status"] != "STARTED"]
        waiting = f"waiting for edge/{today.isoformat()} under "
        assert seen, "no tick of the landing sensor has ended"
        for tick in seen[:3]:
            warned = [e["message"] for e in tick["logEvents"]["events"] if e["level"] == "WARNING"]
            assert len(warned) == 1 and warned[0].startswith(waiting), tick

        if not browser_missing():
            sensor = f"locations/{repository}@{location}/sensors/{LANDING_SENSOR}"
            seen_ui = look(server.url, sensor, keys[1], tmp_path / "shots")
            log = seen_ui["log"]
            assert log.count("WARNING") == 1, log
            (line,) = [x for x in log if x.startswith("waiting for ")]
            assert line.startswith(waiting), log
            rows = {k: [r for r in seen_ui["runs"] if f"partition: {k} " in r] for k in keys}
            assert [len(rows[k]) for k in keys] == [1, 2, 1], seen_ui["runs"]
            assert all("Success" in r for r in seen_ui["runs"]), seen_ui["runs"]
            assert not [r for r in seen_ui["runs"] if today.isoformat() in r], seen_ui["runs"]

    topo = Topology.of(DEFAULT_SPECS)
    state = WcojResource(storage=str(folder / ".wcoj" / "state")).engine(topo, create=False)
    table = read_table(state, output_trace_name("triangles"), 1)
    got = {tuple(r[c] for c in table.column_names[:-1]): r["diff"] for r in table.to_pylist()}
    assert got == dict(oracle(topo, "triangles", history, 1))
