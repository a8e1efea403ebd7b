"""The real Dagster webserver runs one epoch of the pipeline, launched through its GraphQL API.

The test lands a small graph, starts ``dagster-webserver`` on loopback with the project's
``workspace.yaml`` and a throwaway instance, and then talks to it the way the UI does: it launches
``wcoj_epoch_job`` for the first epoch's partition, polls the run until it ends, and reads the
run's asset-check evaluations from its event log. Every check the job declares must have been
evaluated, for that partition, and passed.

No daemon is needed. The instance's ``dagster.yaml`` names the `DefaultRunCoordinator`, which
hands a submitted run straight to the `DefaultRunLauncher`; that launcher asks the code
location's gRPC server (a child of the webserver) to execute the run in a subprocess. The default
coordinator would be the `QueuedRunCoordinator`, whose runs wait for the daemon forever.

The webserver is started in a session of its own, so its whole process tree (code server, run
worker, Spark JVM) is one process group, and the test always ends that group, even on failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster_http import (
    JOB,
    PARTITION,
    PROJECT,
    WEBSERVER,
    declared,
    epoch_run_config,
    failures,
    launch,
    loaded_location,
    run_events,
    running_webserver,
    wait_for_run,
)
from pyspark.sql import SparkSession

from wcoj_assets.landing_write import generate_landing

pytestmark = pytest.mark.e2e  # the Dagster webserver


@pytest.mark.skipif(not WEBSERVER.exists(), reason=f"dagster-webserver not found at {WEBSERVER}")
def test_webserver_runs_the_first_epoch_and_its_checks_pass(
    small: SparkSession, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    keys = generate_landing(small, str(landing), scale=6, edges=400, seed=3, epochs=3)
    assert keys[0] == PARTITION

    with running_webserver(tmp_path / "home", PROJECT, ["-w", "workspace.yaml"]) as server:
        location, repository = loaded_location(server, JOB)
        assets, checks = declared(server, JOB)
        assert assets and checks, f"{JOB} declares assets {assets} and checks {checks}"
        config = epoch_run_config(tmp_path / "storage", landing)
        run_id = launch(server, location, repository, JOB, PARTITION, config)
        status = wait_for_run(server, run_id)
        events = run_events(server, run_id)
        assert status == "SUCCESS", (
            f"run {run_id} ended {status}; step failures:\n{failures(events)}\n"
            f"webserver output:\n{server.output()}"
        )

    materialized = [
        ("/".join(e["assetKey"]["path"]), e["partition"])
        for e in events
        if e["__typename"] == "MaterializationEvent"
    ]
    assert sorted(materialized) == sorted((a, PARTITION) for a in assets)
    evaluations = [
        e["evaluation"] for e in events if e["__typename"] == "AssetCheckEvaluationEvent"
    ]
    evaluated = [("/".join(v["assetKey"]["path"]), v["checkName"]) for v in evaluations]
    # Every declared check runs once, but the binary join, which runs on one epoch in 30: it
    # reports nothing where it did not run (never a pass).
    due = {c for c in checks if c[1] != "matches_binary_join"}
    assert sorted(evaluated) == sorted(due), "every check due runs once"
    failed = [v for v in evaluations if not v["success"]]
    assert not failed, f"asset checks failed: {failed}"
    assert {v["partition"] for v in evaluations} <= {PARTITION, None}
