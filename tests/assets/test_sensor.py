"""The landing sensor: one run request per new or changed epoch folder, oldest first."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
from dagster import DagsterInstance, build_sensor_context
from dagster._core.test_utils import freeze_time

from wcoj_assets.definitions import JOB_NAME, build_definitions
from wcoj_assets.epochs import Epochs, epoch_key
from wcoj_assets.landing_read import epoch_folders, landed_files
from wcoj_assets.resources import WcojResource
from wcoj_core.errors import InputError


def land(root: Path, key: str, name: str = "part.csv", text: str = "a,b\n1,2\n") -> Path:
    folder = root / "edge" / key
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def tick(landing: Path, cursor: str | None = None, start: str = "2020-01-01"):
    defs = build_definitions(landing=str(landing), start=start)
    sensor = defs.resolve_sensor_def("wcoj_landing_sensor")
    with (
        DagsterInstance.ephemeral() as instance,
        build_sensor_context(
            cursor=cursor,
            definitions=defs,
            instance=instance,
            resources={"wcoj": WcojResource(landing=str(landing))},
        ) as context,  # the resource has a teardown (it stops a Spark session it started)
    ):
        return sensor.evaluate_tick(context)


def test_requests_good_folders_in_epoch_order_and_skips_malformed_ones(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    landing = tmp_path / "landing"
    for n in (10, 2, 0):  # created out of order
        land(landing, epoch_key(n))
    for bad in ("abc", "2020-13-01", "2019-12-31", "2020-1-3"):
        land(landing, bad)
    (landing / "edge" / epoch_key(5)).mkdir()  # an empty epoch folder: nothing to run yet
    land(landing, epoch_key(7), name="_SUCCESS")  # only ignored files: nothing to run either
    land(landing, epoch_key(3), name=".part.csv.tmp")

    first = tick(landing)
    logged = capfd.readouterr().err
    for bad in ("abc", "2020-13-01", "2019-12-31", "2020-1-3"):
        assert f"edge/{bad}: not an epoch key" in logged
    requests = first.run_requests
    assert [r.partition_key for r in requests] == [epoch_key(n) for n in (0, 2, 10)]
    assert all(r.job_name in (None, JOB_NAME) for r in requests)
    assert all(r.run_key and r.run_key.startswith(r.partition_key + ":") for r in requests)
    assert len({r.run_key for r in requests}) == 3

    # Nothing new: no request. A replaced file (a corrected epoch): a request for it alone.
    again = tick(landing, first.cursor)
    assert not again.run_requests
    path = land(landing, epoch_key(2), text="a,b\n1,2\n2,3\n")
    os.utime(path, (1_700_000_000, 1_700_000_000))
    corrected = tick(landing, again.cursor or first.cursor)
    assert [r.partition_key for r in corrected.run_requests] == [epoch_key(2)]
    old_key = next(r.run_key for r in requests if r.partition_key == epoch_key(2))
    assert corrected.run_requests[0].run_key != old_key


def test_epochs_count_from_the_code_locations_first_day(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    landing = tmp_path / "landing"
    for key in ("2024-03-03", "2024-03-01", "2024-02-29"):
        land(landing, key)
    requests = tick(landing, start="2024-03-01").run_requests
    assert [r.partition_key for r in requests] == ["2024-03-01", "2024-03-03"]
    assert (
        "edge/2024-02-29: not an epoch key (YYYY-MM-DD, from 2024-03-01)" in capfd.readouterr().err
    )
    # Reading a folder needs a date only; which dates are epochs is the code location's business.
    assert [f.name for f in landed_files(str(landing), "edge", "2024-02-29").files] == ["part.csv"]


def test_a_folder_of_a_day_not_yet_ended_waits_while_the_others_run(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Producers name folders by their own day, land early or live east of UTC: a folder of
    today (UTC) or later is not a partition yet. It is named in one warning line and requested
    once its day has ended; a correction landed meanwhile runs at once."""
    landing = tmp_path / "landing"
    days = ["2026-11-26", "2026-11-27", "2026-11-28", "2026-11-29", "2026-11-30"]
    for key in days:
        land(landing, key)
    morning = dt.datetime(2026, 11, 29, 9, 30, tzinfo=dt.UTC)  # the day of days[3], UTC
    with freeze_time(morning):
        first = tick(landing, start=days[0])
    assert [r.partition_key for r in first.run_requests] == days[:3]
    warned = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]
    assert len(warned) == 1, warned
    assert "waiting for edge/2026-11-29, edge/2026-11-30 under " in warned[0]
    assert "(UTC; the latest is 2026-11-28)" in warned[0]

    path = land(landing, days[1], text="a,b\n1,2\n2,3\n")  # a correction, beside today's
    os.utime(path, (1_700_000_000, 1_700_000_000))
    with freeze_time(morning + dt.timedelta(hours=2)):
        corrected = tick(landing, first.cursor, start=days[0])
    assert [r.partition_key for r in corrected.run_requests] == [days[1]]
    with freeze_time(morning + dt.timedelta(hours=3)):
        idle = tick(landing, corrected.cursor, start=days[0])
    assert not idle.run_requests
    assert "waiting for edge/2026-11-29, edge/2026-11-30" in (idle.skip_message or "")

    with freeze_time(morning + dt.timedelta(days=1)):  # the 29th has ended; the 30th has not
        next_day = tick(landing, idle.cursor, start=days[0])
    assert [r.partition_key for r in next_day.run_requests] == [days[3]]


def test_no_landing_folder_is_a_skip(tmp_path: Path) -> None:
    result = tick(tmp_path / "nowhere")
    assert not result.run_requests
    assert result.skip_message


@pytest.mark.parametrize("key", ["..", "../edge", "/etc", "2020-13-01", "abc", "", "2020-01-01/.."])
def test_malformed_keys_never_become_paths(tmp_path: Path, key: str) -> None:
    with pytest.raises(InputError):
        Epochs().number(key)
    with pytest.raises(InputError):
        landed_files(str(tmp_path), "edge", key)


def test_folder_listing_separates_good_and_malformed(tmp_path: Path) -> None:
    for key in (epoch_key(1), epoch_key(0), "abc", "2020-02-30"):
        land(tmp_path, key)
    good, bad = epoch_folders(str(tmp_path), "edge")
    assert good == [epoch_key(0), epoch_key(1)]
    assert bad == ["2020-02-30", "abc"]
    files = landed_files(str(tmp_path), "edge", epoch_key(0))
    assert [f.name for f in files.files] == ["part.csv"]
    land(tmp_path, epoch_key(0), name="notes.md")
    assert landed_files(str(tmp_path), "edge", epoch_key(0)).ignored == ("notes.md",)


def test_an_epoch_materialized_from_the_same_files_is_not_requested_again(tmp_path: Path) -> None:
    """Turning the sensor on over epochs already run (a backfill, runs by hand) requests none of
    them again; a file replaced since is requested."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from wcoj_support import Pipeline, updates

    p = Pipeline(None, tmp_path)
    history = updates(seed=3, epochs=3)
    for n, changes in enumerate(history):
        p.land(n, changes, "csv")
    assert p.run((0, 1)).success  # a backfill of the first two epochs
    sensor = p.defs.resolve_sensor_def("wcoj_landing_sensor")
    with build_sensor_context(
        instance=p.instance, definitions=p.defs, resources={"wcoj": p.resource}
    ) as context:
        first = sensor.evaluate_tick(context)
    assert [r.partition_key for r in first.run_requests] == [epoch_key(2)]
    p.land(0, history[0][:-2], "csv")  # epoch 0's file replaced: a correction
    with build_sensor_context(
        cursor=first.cursor, instance=p.instance, definitions=p.defs, resources={"wcoj": p.resource}
    ) as context:
        again = sensor.evaluate_tick(context)
    assert [r.partition_key for r in again.run_requests] == [epoch_key(0)]
