"""Picking up new epochs: a sensor on the landing location, and a daily schedule as alternative.

`landing_sensor` lists ``<landing>/<relation>/`` for every relation and, for each well-formed
epoch folder holding files, requests one run of the epoch job for that partition, oldest epoch
first. The run key is the epoch key plus a fingerprint of the files (names, sizes, modification
times): a replaced file — a corrected epoch — gets a new run; an unchanged folder never gets a
second one. The cursor remembers the fingerprints already requested. A folder whose name is not
an epoch key of the code location's epochs (``abc``, ``2020-13-01``, ``..``, a day before the
first epoch) is logged and skipped, never read.

A corrected epoch is re-run alone; the outputs of later epochs are then stale (their partitions
depend on the previous epoch) and the automation sensor of `wcoj_assets.provenance` (or a
backfill from the corrected epoch, by hand) brings them back to what they would have been had
the correct data arrived on time.

Epochs must run in order: an epoch's arrangements build on the previous epoch's. The requests are
made oldest first and every run of the job carries the tag ``wcoj/serial=epochs``; limit that tag
to one run at a time in the instance's ``dagster.yaml``::

    concurrency:
      runs:
        tag_concurrency_limits:
          - key: "wcoj/serial"
            limit: 1

so queued epochs run one by one, in the order they were requested.
"""

import json
from collections.abc import Sequence
from typing import Any

from dagster import (
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    build_schedule_from_partitioned_job,
    sensor,
)

from wcoj_assets.epochs import Epochs
from wcoj_assets.intake import epoch_folders, fingerprint, landed_files
from wcoj_assets.resources import WcojResource

SERIAL_TAG = "wcoj/serial"


def landing_sensor(
    *, job: Any, relations: Sequence[str], epochs: Epochs, interval: int = 30
) -> Any:
    """The sensor ``wcoj_landing_sensor`` requesting `job` runs for new epoch folders."""

    @sensor(
        name="wcoj_landing_sensor",
        job=job,
        minimum_interval_seconds=interval,
        default_status=DefaultSensorStatus.RUNNING,
        description="Requests a run of the epoch job for each new or changed epoch folder under "
        "<landing>/<relation>/, oldest first; malformed folder names are logged and skipped.",
    )
    def wcoj_landing_sensor(
        context: SensorEvaluationContext, wcoj: WcojResource
    ) -> SensorResult | SkipReason:
        landing = wcoj.landing_path()
        keys: set[str] = set()
        for rel in relations:
            good, bad = epoch_folders(landing, rel, epochs)
            keys.update(good)
            for name in bad:
                context.log.warning(
                    f"skipping {landing}/{rel}/{name}: not an epoch key (YYYY-MM-DD, from "
                    f"{epochs.start}); rename the folder to ingest it"
                )
        requested: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
        requests: list[RunRequest] = []
        for key in sorted(keys, key=epochs.number):
            files = [f for rel in relations for f in landed_files(landing, rel, key).files]
            if not files:
                continue
            digest = fingerprint(files)
            if requested.get(key) == digest:
                continue
            requested[key] = digest
            requests.append(
                RunRequest(
                    partition_key=key,
                    run_key=f"{key}:{digest}",
                    tags={"wcoj/files": str(len(files))},
                )
            )
        if not requests:
            return SkipReason(f"no new or changed epoch folders under {landing}")
        return SensorResult(run_requests=requests, cursor=json.dumps(requested, sort_keys=True))

    return wcoj_landing_sensor


def daily_schedule(*, job: Any) -> Any:
    """A stopped-by-default daily schedule running the job for the day that just ended."""
    return build_schedule_from_partitioned_job(
        job,
        name="wcoj_daily_schedule",
        description="Alternative to the landing sensor: run the epoch job once a day for the "
        "partition (epoch) that just ended.",
        hour_of_day=0,
        minute_of_hour=15,
        default_status=DefaultScheduleStatus.STOPPED,
    )
