"""Talking to a real Dagster webserver the way the UI does: start it, query GraphQL, stop it.

Shared by the webserver test (runs go straight to a launcher, no daemon) and the daemon test
(`dagster dev`: webserver plus daemon, so sensors tick and backfills run). Either is started in a
session of its own, so its whole process tree (code server, daemon, run workers, Spark JVMs) is
one process group, which is always ended, even on failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from wcoj_assets.instance import dagster_env

PROJECT = Path(__file__).resolve().parents[2]
WEBSERVER = Path(sys.executable).with_name("dagster-webserver")
DAGSTER = Path(sys.executable).with_name("dagster")
JOB = "wcoj_epoch_job"
PARTITION = "2020-01-01"
STARTUP_SECONDS = 120
RUN_SECONDS = 300

# What the browser test (tests/assets/test_ui_backfill.py) drives the UI with.
UI = Path(__file__).resolve().parent / "ui"
CHROMIUM = Path("/usr/bin/chromium")


def browser_missing() -> list[str]:
    """What the browser test needs and is not installed (``scripts/ui_test_deps.sh`` installs
    it where it can): nothing where the asset graph's backfills are clicked in a real browser."""
    return [
        what
        for what, there in (
            ("Chromium (apt-get install chromium)", CHROMIUM.exists()),
            ("Node.js", shutil.which("node") is not None),
            (
                "playwright-core (npm --prefix tests/assets/ui install)",
                (UI / "node_modules" / "playwright-core").is_dir(),
            ),
        )
        if not there
    ]


# Runs go straight to the launcher (no daemon); nothing is reported home.
INSTANCE_YAML = """\
run_coordinator:
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
run_launcher:
  module: dagster
  class: DefaultRunLauncher
telemetry:
  enabled: false
"""

WORKSPACE_QUERY = """
query {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on RepositoryLocation { name repositories { name jobs { name } } }
          ... on PythonError { message stack }
        }
      }
    }
    ... on PythonError { message stack }
  }
}
"""

ASSETS_QUERY = """
query {
  assetNodes {
    assetKey { path }
    jobNames
    assetChecksOrError {
      __typename
      ... on AssetChecks { checks { name jobNames } }
    }
  }
}
"""

LAUNCH_MUTATION = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on RunConfigValidationInvalid { errors { message path } }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""

STATUS_QUERY = """
query Status($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { status }
    ... on Error { message }
  }
}
"""

EVENTS_QUERY = """
query Events($runId: ID!, $cursor: String) {
  logsForRun(runId: $runId, afterCursor: $cursor) {
    __typename
    ... on EventConnection {
      cursor
      hasMore
      events {
        __typename
        ... on MessageEvent { message }
        ... on MaterializationEvent { assetKey { path } partition }
        ... on AssetCheckEvaluationEvent {
          evaluation { checkName assetKey { path } partition success }
        }
        ... on ExecutionStepFailureEvent { stepKey error { message stack } }
        ... on RunFailureEvent { pipelineName }
      }
    }
    ... on Error { message }
  }
}
"""

CheckKey = tuple[str, str]  # (asset key as "a/b", check name)


@dataclass(frozen=True, slots=True)
class Webserver:
    """A running ``dagster-webserver`` and where its output goes."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as e:  # GraphQL errors come back with a 500
            answer = json.loads(e.read() or b"{}")
        assert not answer.get("errors"), f"GraphQL errors: {answer['errors']}"
        return answer["data"]

    def output(self, lines: int = 60) -> str:
        """The end of the webserver's (and its children's) output, for failure messages."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def run_ui_script(script: Path, *args: str, shots: Path) -> dict[str, Any]:
    """Run a browser script of ``tests/assets/ui`` (``node SCRIPT ARGS... SHOTS``): it drives
    the UI in Chromium, saves screenshots in `shots` and prints what it saw as its last line,
    a JSON object, returned here (a failed script or an ``error`` in it fails the test)."""
    shots.mkdir(parents=True, exist_ok=True)
    ran = subprocess.run(
        ["node", str(script), *args, str(shots)],
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert "error" not in out, out
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop(process: subprocess.Popen[bytes]) -> None:
    """End the webserver's whole process group: politely first, then for certain."""
    with suppress(ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    # Whatever is left (a hung webserver, an orphaned code server or run worker) ends now.
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


@contextmanager
def running_webserver(
    home: Path,
    cwd: Path,
    load: list[str],
    instance_yaml: str | None = INSTANCE_YAML,
    program: Path = WEBSERVER,
    arguments: tuple[str, ...] = (),
) -> Iterator[Webserver]:
    """Start the webserver with the instance in `home`; yield once the server answers.

    `program` ``dagster`` with `arguments` ``("dev",)`` starts the webserver and the daemon. They
    and every process they start (code server, run workers) have `dagster_env`'s settings, as
    under ``make ui``. With `instance_yaml` None, `home` holds the log only and neither
    ``DAGSTER_HOME`` nor those settings are set: the project's ``.env`` gives them.
    """
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = home / "webserver.log"
    env = {**os.environ, **dagster_env(), "DAGSTER_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    if instance_yaml is None:  # the instance is the project's own (its .env names it)
        for key in ("DAGSTER_HOME", *dagster_env()):
            env.pop(key, None)
    else:
        (home / "dagster.yaml").write_text(instance_yaml)
    command = [str(program), *arguments, "-h", "127.0.0.1", "-p", str(port), *load]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = Webserver(process, f"http://127.0.0.1:{port}", log)
    try:
        wait_until_serving(server)
        yield server
    finally:
        stop(process)


def wait_until_serving(server: Webserver) -> None:
    """Poll ``/server_info`` until the webserver answers (and fail early if it died)."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(
                f"dagster-webserver exited with {server.process.returncode}:\n{server.output()}"
            )
        try:
            with urllib.request.urlopen(f"{server.url}/server_info", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"dagster-webserver did not answer within {STARTUP_SECONDS}s:\n{server.output()}")


def loaded_location(server: Webserver, job: str) -> tuple[str, str]:
    """Wait for the code location to load; return the (location, repository) holding `job`."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        workspace = server.graphql(WORKSPACE_QUERY)["workspaceOrError"]
        assert workspace["__typename"] == "Workspace", workspace
        entries = workspace["locationEntries"]
        if entries and all(e["loadStatus"] == "LOADED" for e in entries):
            found = []
            for entry in entries:
                location = entry["locationOrLoadError"]
                assert location["__typename"] == "RepositoryLocation", (
                    f"code location {entry['name']} failed to load: {location}"
                )
                found += [
                    (location["name"], repo["name"])
                    for repo in location["repositories"]
                    if job in {j["name"] for j in repo["jobs"]}
                ]
            assert len(found) == 1, f"job {job} found in {found}; locations {entries}"
            return found[0]
        time.sleep(0.5)
    pytest.fail(f"the code location did not load within {STARTUP_SECONDS}s:\n{server.output()}")


def declared(server: Webserver, job: str) -> tuple[set[str], set[CheckKey]]:
    """The assets and the asset checks that `job` executes, as the webserver reports them."""
    assets: set[str] = set()
    checks: set[CheckKey] = set()
    for node in server.graphql(ASSETS_QUERY)["assetNodes"]:
        asset = "/".join(node["assetKey"]["path"])
        if job in node["jobNames"]:
            assets.add(asset)
        found = node["assetChecksOrError"]
        assert found["__typename"] == "AssetChecks", found
        checks |= {(asset, c["name"]) for c in found["checks"] if job in c["jobNames"]}
    return assets, checks


def launch(
    server: Webserver,
    location: str,
    repository: str,
    job: str,
    partition: str | tuple[str, str],
    run_config: dict[str, Any],
    tags: dict[str, str] | None = None,
) -> str:
    """Launch `job` for one partition, or ``(first, last)`` a range in one run (the launchpad's
    ``dagster/asset_partition_range_start`` and ``_end`` tags), as the UI's launchpad does;
    return the run id."""
    if isinstance(partition, tuple):
        scope = {
            "dagster/asset_partition_range_start": partition[0],
            "dagster/asset_partition_range_end": partition[1],
        }
    else:
        scope = {"dagster/partition": partition}
    params = {
        "selector": {
            "repositoryLocationName": location,
            "repositoryName": repository,
            "jobName": job,
        },
        "runConfigData": run_config,
        "executionMetadata": {
            "tags": [{"key": k, "value": v} for k, v in {**scope, **(tags or {})}.items()]
        },
    }
    result = server.graphql(LAUNCH_MUTATION, {"params": params})["launchRun"]
    assert result["__typename"] == "LaunchRunSuccess", f"launchRun failed: {result}"
    return result["run"]["runId"]


def wait_for_run(server: Webserver, run_id: str) -> str:
    """Poll the run until it reaches a final status; return that status."""
    deadline = time.monotonic() + RUN_SECONDS
    while time.monotonic() < deadline:
        run = server.graphql(STATUS_QUERY, {"runId": run_id})["runOrError"]
        assert run["__typename"] == "Run", run
        if run["status"] in {"SUCCESS", "FAILURE", "CANCELED"}:
            return run["status"]
        time.sleep(1)
    pytest.fail(f"run {run_id} did not finish within {RUN_SECONDS}s:\n{server.output()}")


def run_events(server: Webserver, run_id: str) -> list[dict[str, Any]]:
    """The run's whole event log, page by page."""
    events: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = server.graphql(EVENTS_QUERY, {"runId": run_id, "cursor": cursor})["logsForRun"]
        assert page["__typename"] == "EventConnection", page
        events += page["events"]
        cursor = page["cursor"]
        if not page["hasMore"]:
            return events


def failures(events: list[dict[str, Any]]) -> str:
    """The step failures of a run, for the assertion message."""
    failed = [e for e in events if e["__typename"] == "ExecutionStepFailureEvent"]
    return "\n".join(f"{e['stepKey']}: {e['error']['message']}" for e in failed) or "none"


def epoch_run_config(storage: Path, landing: Path) -> dict[str, Any]:
    """Point the ``wcoj`` resource at the test's folders, with a small Spark for the run."""
    spark = {"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"}
    config = {"storage": str(storage), "landing": str(landing), "master": "local[2]"}
    return {"resources": {"wcoj": {"config": {**config, "spark_conf": spark}}}}


# -- asset backfills, as the asset graph's "Materialize" dialog launches them ----------------------

REQUIRED_KEYS_QUERY = """
query Required($assetKeys: [AssetKeyInput!]!) {
  assetNodeAdditionalRequiredKeys(assetKeys: $assetKeys) { path }
}
"""

LAUNCH_BACKFILL_MUTATION = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
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
    ... on PartitionBackfill { id status runs(limit: 1000) { runId status } }
    ... on Error { message }
  }
}
"""

SENSOR_STATE_QUERY = """
query Sensor($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { id status } }
    ... on Error { message }
  }
}
"""

STOP_SENSOR_MUTATION = """
mutation Stop($id: String!) {
  stopSensor(id: $id) {
    __typename
    ... on StopSensorMutationResult { instigationState { status } }
    ... on PythonError { message }
  }
}
"""

BACKFILL_DONE = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


def with_required(server: Webserver, assets: list[str]) -> list[str]:
    """`assets` and the keys the UI adds to them before launching (a multi-asset that cannot be
    subset brings its other assets), as the UI's launch button asks the server for them."""
    keys = [{"path": a.split("/")} for a in assets]
    found = server.graphql(REQUIRED_KEYS_QUERY, {"assetKeys": keys})
    added = ["/".join(k["path"]) for k in found["assetNodeAdditionalRequiredKeys"]]
    return [*assets, *(a for a in added if a not in assets)]


def launch_asset_backfill(server: Webserver, assets: list[str], partitions: list[str]) -> str:
    """Launch a backfill of `partitions` of `assets` exactly as the asset graph's materialize
    dialog does (``assetSelection`` and ``partitionNames``, the UI's tags); return its id."""
    params = {
        "tags": [{"key": "dagster/from_ui", "value": "true"}],
        "assetSelection": [{"path": a.split("/")} for a in assets],
        "partitionNames": partitions,
        "fromFailure": False,
    }
    found = server.graphql(LAUNCH_BACKFILL_MUTATION, {"backfillParams": params})
    result = found["launchPartitionBackfill"]
    assert result["__typename"] == "LaunchBackfillSuccess", f"the backfill was refused: {result}"
    return result["backfillId"]


def wait_for_backfill(server: Webserver, backfill_id: str) -> dict[str, Any]:
    """Poll the backfill until it ends; return it (status and runs)."""
    deadline = time.monotonic() + RUN_SECONDS * 2
    while time.monotonic() < deadline:
        found = server.graphql(BACKFILL_QUERY, {"id": backfill_id})["partitionBackfillOrError"]
        assert found["__typename"] == "PartitionBackfill", found
        if found["status"] in BACKFILL_DONE and all(
            r["status"] in {"SUCCESS", "FAILURE", "CANCELED"} for r in found["runs"]
        ):
            return found
        time.sleep(2)
    pytest.fail(f"backfill {backfill_id} did not end in time:\n{server.output()}")


def stop_sensor(server: Webserver, location: str, repository: str, name: str) -> None:
    """Stop a sensor as the UI's toggle does (it must be running)."""
    selector = {
        "repositoryLocationName": location,
        "repositoryName": repository,
        "sensorName": name,
    }
    found = server.graphql(SENSOR_STATE_QUERY, {"selector": selector})["sensorOrError"]
    assert found["__typename"] == "Sensor", found
    assert found["sensorState"]["status"] == "RUNNING", found  # running by default
    stopped = server.graphql(STOP_SENSOR_MUTATION, {"id": found["sensorState"]["id"]})
    result = stopped["stopSensor"]
    assert result["__typename"] == "StopSensorMutationResult", result
    assert result["instigationState"]["status"] == "STOPPED", result
