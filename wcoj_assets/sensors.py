"""Picking up new epochs: the landing sensor, the one way epochs run daily.

`landing_sensor` lists ``<landing>/<relation>/`` for every relation and, for each well-formed
epoch folder holding files, requests one run of the epoch job for that partition, oldest epoch
first (several epochs a day: one run of the day's partition, which applies each epoch the day's
``<day>/<HHMM>/`` folders hold). The run key is the epoch key plus a fingerprint of the files (names, sizes, modification
times): a replaced file — a corrected epoch — gets a new run; an unchanged folder never gets a
second one. The cursor remembers the fingerprints already requested, and an epoch whose latest
materialization was made from the same files (its changes record their fingerprint: a
backfill's, a run launched by hand) is not requested either: turning the sensor on over a
landing folder that was already run requests nothing again. A folder whose name is not an epoch
key of the code location's epochs (``abc``, ``2020-13-01``, ``..``, a day before the first
epoch) is logged and skipped, never read.

A sensor rather than a schedule: an epoch runs when its files have landed, not at a time they
might have (a schedule firing before the data would run an epoch with nothing landed, which
fails its ``update_triples`` check). There is no schedule to choose between.

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
from typing import Any

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from wcoj_assets.epochs import Epochs
from wcoj_assets.graph import EpochGraph, Role
from wcoj_assets.landing_read import epoch_folders, fingerprint, partition_files, partition_folders
from wcoj_assets.report import FINGERPRINT

SERIAL_TAG = "wcoj/serial"
LANDING_SENSOR = "wcoj_landing_sensor"


def landing_sensor(
    *,
    job: Any,
    graph: EpochGraph,
    name: str = LANDING_SENSOR,
    resource_key: str = "wcoj",
    interval: int = 30,
) -> Any:
    """The sensor `name` requesting `job` runs for new epoch folders (see the module)."""
    epochs = graph.epochs
    partitions = epochs.partitions()
    relations = {info.relation or "": graph.key(info.name) for info in graph.of_role(Role.CHANGES)}

    @sensor(
        name=name,
        job=job,
        minimum_interval_seconds=interval,
        default_status=DefaultSensorStatus.RUNNING,
        required_resource_keys={resource_key},
        description="Requests a run of the epoch job per new or changed epoch folder under "
        "<landing>/<relation>/, oldest first, unless last materialized from the same files; "
        "malformed folder names are logged and skipped; a day's folder waits for its end (UTC).",
    )
    def _landing(context: SensorEvaluationContext) -> SensorResult | SkipReason:
        landing = getattr(context.resources, resource_key).landing_path()
        last = partitions.get_last_partition_key() or ""
        keys: set[str] = set()
        early: list[str] = []
        for rel in relations:
            good, bad = epoch_folders(landing, rel, epochs)
            keys.update(k for k in good if k <= last)
            early += [f"{rel}/{k}" for k in good if k > last]
            for folder in bad:
                context.log.warning(
                    f"skipping {landing}/{rel}/{folder}: not an epoch key (YYYY-MM-DD, from "
                    f"{epochs.start}); rename the folder to ingest it"
                )
        waiting = (
            f"{', '.join(early)} under {landing}: a day is an epoch once it has ended (UTC; "
            f"the latest is {last or 'none yet'}), and its folder runs then"
            if early
            else ""
        )
        if waiting:
            context.log.warning(f"waiting for {waiting}")
        requested: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
        requests: list[RunRequest] = []
        for key in sorted(keys, key=epochs.number):
            by_relation = {rel: partition_files(landing, rel, key, epochs) for rel in relations}
            for rel in relations if epochs.per_day > 1 else ():
                _misnamed(context, landing, rel, key, epochs)
            files = [f for found in by_relation.values() for f in found]
            if not files:
                continue
            digest = fingerprint(files)
            if requested.get(key) == digest:
                continue
            requested[key] = digest
            if _materialized_from(context.instance, relations, by_relation, key):
                continue
            requests.append(
                RunRequest(
                    partition_key=key,
                    run_key=f"{key}:{digest}",
                    tags={"wcoj/files": str(len(files))},
                )
            )
        cursor = json.dumps(requested, sort_keys=True)
        if not requests:
            return SensorResult(
                skip_reason=SkipReason(
                    f"no new or changed epoch folders under {landing}"
                    + (f"; waiting for {waiting}" if waiting else "")
                ),
                cursor=cursor,
            )
        return SensorResult(run_requests=requests, cursor=cursor)

    return _landing


def _misnamed(context: Any, landing: str, rel: str, key: str, epochs: Epochs) -> None:
    """Log each name in day `key`'s folder of `rel` that is not an epoch's ``HHMM`` folder."""
    for name in partition_folders(landing, rel, key, epochs)[1]:
        context.log.warning(
            f"skipping {landing}/{rel}/{key}/{name}: not an epoch's folder (HHMM, "
            f"{epochs.per_day} epochs a day); rename it to ingest it"
        )


def _materialized_from(
    instance: Any, assets: dict[str, AssetKey], files: dict[str, Any], key: str
) -> bool:
    """Whether every relation's changes at partition `key` were last materialized from the files
    landed now (the fingerprint their metadata records)."""
    for rel, asset in assets.items():
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=asset, asset_partitions=[key]), limit=1
        ).records
        if not records:
            return False
        metadata = records[0].asset_materialization.metadata
        recorded = metadata.get(FINGERPRINT)
        landed = fingerprint(files[rel]) if files[rel] else ""
        if (recorded.value if recorded is not None else "") != landed:
            return False
    return True
