"""What one event write costs on Postgres (dagster-postgres for Dagster 1.13): a check evaluation
and a materialization stored one at a time, and materializations stored in one batch, with a
connection per statement (Dagster's default) and then with connections held open, on one server
in one process. Usage: python scripts/event_write_cost.py [N=200]"""

import logging
import sys
import tempfile
import time
from pathlib import Path

from dagster import AssetCheckEvaluation, AssetKey, AssetMaterialization, DagsterEventType
from dagster._core.events import DagsterEvent, StepMaterializationData
from dagster._core.events.log import EventLogEntry

from wcoj_assets.instance import hold_connections
from wcoj_bench.parts.backfill_sides import InstanceKind, bench_instance


def entry(data, kind, run="r1"):
    return EventLogEntry(
        error_info=None,
        level=logging.DEBUG,
        user_message="",
        run_id=run,
        timestamp=time.time(),
        dagster_event=DagsterEvent(kind.value, job_name="j", event_specific_data=data),
    )


def mat(i):
    return entry(
        StepMaterializationData(
            AssetMaterialization(
                AssetKey("a"), partition=f"p{i}", metadata={"x": i, "y": "abc" * 100}
            )
        ),
        DagsterEventType.ASSET_MATERIALIZATION,
    )


def chk(i):
    return entry(
        AssetCheckEvaluation(
            asset_key=AssetKey("a"),
            check_name="c",
            passed=True,
            partition=f"p{i}",
            metadata={"x": i},
        ),
        DagsterEventType.ASSET_CHECK_EVALUATION,
    )


N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
with (
    tempfile.TemporaryDirectory() as root,
    bench_instance(InstanceKind.POSTGRES, Path(root), print) as inst,
):
    s = inst.event_log_storage
    for label, pooled in (("NullPool", False), ("pooled", True)):
        if pooled:
            hold_connections(inst)  # what a step does
        for name, make in (("check evaluation", chk), ("materialization", mat)):
            t = time.perf_counter()
            c = time.process_time()
            for i in range(N):
                s.store_event(make(i))
            w = (time.perf_counter() - t) / N * 1000
            cp = (time.process_time() - c) / N * 1000
            print(
                f"{label:9} one {name:17} per store_event: {w:6.2f} ms wall, {cp:5.2f} ms cpu",
                flush=True,
            )
        t = time.perf_counter()
        s.store_event_batch([mat(i) for i in range(N)])
        print(
            f"{label:9} {N} materializations in one store_event_batch: {(time.perf_counter() - t) / N * 1000:6.2f} ms each",
            flush=True,
        )
