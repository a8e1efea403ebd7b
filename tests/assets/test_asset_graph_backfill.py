"""A backfill launched from the asset graph, as the UI launches it, materializes the range exactly.

Under ``dagster dev`` (webserver and daemon) over the default code location, with its sensors
stopped as a user's toggles stop them, four epochs are landed and backfilled through the
webserver's GraphQL ``launchPartitionBackfill`` with an asset selection and partition names —
the request the asset graph's *Materialize* dialog sends. First every asset of the pipeline
over all four epochs, then one asset alone over two of them, with the keys the UI adds to a
selection before launching (``assetNodeAdditionalRequiredKeys``). Each backfill must be
accepted, end in ONE successful run, and leave every epoch's output equal to the oracle's, with
every asset materialized for every partition of the range.

It runs where the browser test cannot (`dagster_http.browser_missing`): where Chromium, Node.js
and playwright-core are installed, `test_ui_backfill.py` clicks the same two backfills in the
asset graph, so the UI sends these requests itself (the keys it adds included), and checks the
same runs, materializations and outputs; ``dagster dev`` and its backfills once, not twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster_http import (
    DAGSTER,
    JOB,
    browser_missing,
    failures,
    launch_asset_backfill,
    loaded_location,
    run_events,
    running_webserver,
    stop_sensor,
    wait_for_backfill,
    with_required,
)
from pyspark.sql import SparkSession
from wcoj_support import multiset, oracle, updates, write_landing

from wcoj_assets.definitions import SENSOR_ENV
from wcoj_assets.epochs import START_ENV, Epochs
from wcoj_assets.provenance import REBUILD_SENSOR
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import DEFAULT_SPECS, Topology

EPOCHS = 4
START = "2024-03-01"

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

ASSETS = {
    "edge_deltas",
    "edge_snapshot",
    "edge_forward",
    "edge_reverse",
    "edge_counts_c0",
    "edge_counts_c1",
    "triangles_rule_0",
    "triangles_rule_1",
    "triangles_rule_2",
    "triangles_deltas",
    "triangles",
}


def materialized(events: list[dict]) -> set[tuple[str, str]]:
    return {
        ("/".join(e["assetKey"]["path"]), e["partition"])
        for e in events
        if e["__typename"] == "MaterializationEvent"
    }


@pytest.mark.skipif(
    not browser_missing(), reason="the browser test clicks these backfills (test_ui_backfill.py)"
)
def test_a_backfill_launched_from_the_asset_graph_materializes_the_range_exactly(
    small: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(START_ENV, START)
    monkeypatch.setenv(SENSOR_ENV, "5")
    epochs = Epochs(START)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "workspace.yaml").write_text(WORKSPACE_YAML.format(folder=folder))
    landing = folder / ".wcoj" / "landing"
    history = updates(seed=31, epochs=EPOCHS)
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
        for sensor in ("wcoj_landing_sensor", REBUILD_SENSOR):
            stop_sensor(server, location, repository, sensor)
        for n, changes in enumerate(history):
            write_landing(landing, n, changes, "csv", start=START)

        # "Materialize all" over the whole range.
        everything = with_required(server, sorted(ASSETS))
        assert set(everything) == ASSETS
        backfill = wait_for_backfill(server, launch_asset_backfill(server, everything, keys))
        assert backfill["status"] in {"COMPLETED", "COMPLETED_SUCCESS"}, (backfill, server.output())
        (run,) = backfill["runs"]
        events = run_events(server, run["runId"])
        assert run["status"] == "SUCCESS", failures(events)
        assert materialized(events) == {(a, k) for a in ASSETS for k in keys}

        # One asset, with what the UI adds to it, over two epochs.
        selection = with_required(server, ["triangles"])
        backfill = wait_for_backfill(server, launch_asset_backfill(server, selection, keys[1:3]))
        assert backfill["status"] in {"COMPLETED", "COMPLETED_SUCCESS"}, (backfill, server.output())
        (run,) = backfill["runs"]
        events = run_events(server, run["runId"])
        assert run["status"] == "SUCCESS", failures(events)
        assert materialized(events) == {(a, k) for a in ASSETS for k in keys[1:3]}

    state = WcojResource(storage=str(folder / ".wcoj" / "state")).engine(topo)
    for n in range(EPOCHS):
        assert multiset(state.output("triangles", n)) == oracle(topo, "triangles", history, n), n
