"""The asset graph's backfill clicked through in a real browser: Chromium driven by Playwright.

Where Chromium (Debian's ``chromium``: ``/usr/bin/chromium``), Node.js and playwright-core
(``npm --prefix tests/assets/ui install``) are installed, ``tests/assets/ui/asset_graph_backfill.mjs``
clicks what a user clicks under ``dagster dev``: Lineage → *Materialize all…* → the range typed
in the partition box → *Launch backfill*; then an asset's page → *Materialize…* → a range. The
UI must say the backfill was created, the backfill must end in one successful run, and the
outputs must equal the oracle's. Screenshots of each step go to the test's folder (``shots``).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from dagster_http import (
    DAGSTER,
    JOB,
    UI,
    browser_missing,
    failures,
    loaded_location,
    run_events,
    run_ui_script,
    running_webserver,
    stop_sensor,
    wait_for_backfill,
)
from pyspark.sql import SparkSession
from test_asset_graph_backfill import ASSETS, INSTANCE_YAML, WORKSPACE_YAML, materialized
from wcoj_support import multiset, oracle, updates, write_landing

from wcoj_assets.definitions import SENSOR_ENV
from wcoj_assets.epochs import START_ENV, Epochs
from wcoj_assets.provenance import REBUILD_SENSOR
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import DEFAULT_SPECS, Topology

SCRIPT = UI / "asset_graph_backfill.mjs"
EPOCHS = 4

missing = browser_missing()


def click_backfill(url: str, first: str, last: str, asset: str, shots: Path) -> dict:
    return run_ui_script(SCRIPT, url, first, last, asset, shots=shots)


@pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)}")
def test_a_backfill_clicked_in_the_asset_graph_materializes_the_range_exactly(
    small: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Epochs from a few days back, as a user's landing would be: a handful of partitions.
    start = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=EPOCHS + 1)).isoformat()
    monkeypatch.setenv(START_ENV, start)
    monkeypatch.setenv(SENSOR_ENV, "5")
    epochs = Epochs(start)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "workspace.yaml").write_text(WORKSPACE_YAML.format(folder=folder))
    history = updates(seed=37, epochs=EPOCHS)
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
            write_landing(folder / ".wcoj" / "landing", n, changes, "csv", start=start)

        for asset, span, expected_title in (
            ("", keys, "Launch runs to materialize 11 assets"),
            ("triangles", keys[1:3], "Launch runs to materialize triangles"),
        ):
            out = click_backfill(
                server.url, span[0], span[-1], asset, tmp_path / "shots" / (asset or "all")
            )
            assert out["title"] == expected_title, out
            assert out["partitions"] == f"{len(span)} partitions", out
            assert out["said"].startswith("Created backfill"), out
            assert out["dialogOpen"] is False
            backfill = wait_for_backfill(server, out["said"].split()[-1])
            assert backfill["status"] in {"COMPLETED", "COMPLETED_SUCCESS"}, backfill
            (run,) = backfill["runs"]
            events = run_events(server, run["runId"])
            assert run["status"] == "SUCCESS", failures(events)
            assert materialized(events) == {(a, k) for a in ASSETS for k in span}

    state = WcojResource(storage=str(folder / ".wcoj" / "state")).engine(topo)
    for n in range(EPOCHS):
        assert multiset(state.output("triangles", n)) == oracle(topo, "triangles", history, n), n
