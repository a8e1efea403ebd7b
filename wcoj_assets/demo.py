"""The demo: land a generated graph's epochs, let the sensor find them, run them through Dagster.

``python -m wcoj_assets.demo`` (what ``make demo`` runs) does everything on a fresh machine:

1. generates the built-in skewed (R-MAT) graph and splits it into epochs of inserts and
   deletions, written as one folder per epoch under ``<root>/landing/edge/``; the first epoch
   is `demo_start`, so that the last one is yesterday (UTC) and every epoch is a partition the
   UI already shows, and none else (``make ui`` passes the first folder's day on as
   ``WCOJ_EPOCH_START``);
2. asks the landing sensor which epochs are new — the same code the daemon runs — and runs
   ``wcoj_epoch_job`` for each, in order, on a real Dagster instance (``<root>/dagster``: SQLite,
   with the settings of `wcoj_assets.instance.dagster_env`), so runs, materializations and check
   results are stored where ``make ui`` shows them;
3. prints a line per epoch and ends with ``demo: <E> epochs, <C> checks passed, <F> failed``;
   the exit status is non-zero when a check failed or a run did not succeed.

The demo's root (default ``.wcoj``) is cleared first, so every demo starts from nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from wcoj_assets.instance import automation_on, dagster_env, prepare_home

if TYPE_CHECKING:
    import dagster as dg

SENSOR = "wcoj_landing_sensor"

# The run's console logger prints warnings and errors only; every event is still stored.
QUIET_RUN = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def demo_start(epochs: int, today: dt.date | None = None) -> str:
    """The first epoch's day: `epochs` days before `today` (UTC's), so the last is yesterday.

    >>> demo_start(5, dt.date(2024, 3, 6))
    '2024-03-01'
    """
    today = today or dt.datetime.now(dt.UTC).date()
    return (today - dt.timedelta(days=epochs)).isoformat()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wcoj_assets.demo", description=__doc__)
    parser.add_argument("--root", default=".wcoj", help="folder for landing, state and Dagster")
    parser.add_argument("--scale", type=int, default=11, help="R-MAT scale: 2**scale vertices")
    parser.add_argument("--edges", type=int, default=20000, help="R-MAT edges before cleaning")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--delete-fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)

    root = Path(args.root).absolute()
    shutil.rmtree(root, ignore_errors=True)
    landing, storage = root / "landing", root / "state"
    home = prepare_home(root)
    automation_on(home)
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ.update(dagster_env())  # this process creates and executes the runs

    # Imported here: the instance reads DAGSTER_HOME, and Spark starts only when asked.
    from dagster import DagsterInstance, build_sensor_context

    from wcoj_assets.definitions import JOB_NAME, build_definitions
    from wcoj_assets.landing_write import generate_landing
    from wcoj_core.spark import session

    spark = session(args.master, quiet=True)
    started = time.perf_counter()
    start = demo_start(args.epochs)
    keys = generate_landing(
        spark,
        str(landing),
        scale=args.scale,
        edges=args.edges,
        seed=args.seed,
        epochs=args.epochs,
        delete_fraction=args.delete_fraction,
        start=start,
    )
    print(f"landed {len(keys)} epochs from {start} under {landing / 'edge'}", flush=True)

    defs = build_definitions(
        storage=str(storage), landing=str(landing), spark_master=args.master, start=start
    )
    instance = DagsterInstance.get()
    sensor = defs.resolve_sensor_def(SENSOR)
    # The sensor as the daemon evaluates it: its definitions (to resolve the partitioned job its
    # requests name) and their resources.
    with build_sensor_context(
        instance=instance, definitions=defs, resources=defs.resources
    ) as context:
        requests = sensor.evaluate_tick(context).run_requests
    job = defs.resolve_job_def(JOB_NAME)

    passed = failed = runs_failed = 0
    for request in requests or []:
        ok, checked, success = _run_epoch(job, instance, request)
        passed, failed, runs_failed = (
            passed + ok,
            failed + checked - ok,
            runs_failed + (not success),
        )
    print(
        f"total seconds {time.perf_counter() - started:.1f}; Dagster home {instance.root_directory}"
    )
    print(f"demo: {len(requests or [])} epochs, {passed} checks passed, {failed} failed")
    return 0 if failed == 0 and runs_failed == 0 and requests else 1


def _run_epoch(
    job: dg.JobDefinition, instance: dg.DagsterInstance, request: dg.RunRequest
) -> tuple[int, int, bool]:
    """Run one requested epoch in process as the sensor would have launched it; print its line.
    Returns the checks passed, the checks evaluated and whether the run succeeded."""
    from dagster import DagsterEventType

    key = request.partition_key
    t0 = time.perf_counter()
    result = job.execute_in_process(
        run_config=QUIET_RUN,
        partition_key=key,
        instance=instance,
        # The tags a sensor-launched run carries: the daemon then knows these run keys.
        tags={
            **request.tags,
            "dagster/sensor_name": SENSOR,
            "dagster/run_key": request.run_key or key or "",
        },
        raise_on_error=False,
    )
    checks = [
        e.event_specific_data
        for e in result.all_events
        if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
    ]
    ok = sum(1 for c in checks if c.passed)  # type: ignore[union-attr]
    count = _metadata(result, "triangles", "count")
    changes = _metadata(result, "edge_deltas", "rows landed")
    print(
        f"epoch {key}: run {'succeeded' if result.success else 'FAILED'}, changes {changes}, "
        f"triangles {count}, checks {ok}/{len(checks)} passed, "
        f"seconds {time.perf_counter() - t0:.1f}",
        flush=True,
    )
    return ok, len(checks), bool(result.success)


def _metadata(result: object, asset: str, key: str) -> object:
    """A metadata value of an asset's materialization in a run, or '?' when absent."""
    from dagster import AssetKey, DagsterEventType

    for event in result.all_events:  # type: ignore[attr-defined]
        if event.event_type != DagsterEventType.ASSET_MATERIALIZATION:
            continue
        materialization = event.event_specific_data.materialization
        if materialization.asset_key == AssetKey(asset) and key in materialization.metadata:
            return materialization.metadata[key].value
    return "?"


if __name__ == "__main__":
    sys.exit(main())
