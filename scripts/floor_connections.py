"""Dagster's floor for a range run (the hollow twin, wcoj_bench.infra.hollow) with every
partition's check evaluation written, with a database connection per statement (Dagster's
default, main before issue 42.7) beside connections held open (hold_connections), alternating in
one process on one Postgres server. Usage: python scripts/floor_connections.py EPOCHS REPEATS"""

import statistics
import sys
import time
from pathlib import Path

from dagster import DagsterInstance

import wcoj_bench.infra.hollow as hollow
from wcoj_assets.definitions import build_definitions
from wcoj_assets.demo import QUIET_RUN
from wcoj_assets.epochs import epoch_key
from wcoj_assets.specs import DEFAULT_SPECS
from wcoj_bench.parts.backfill_sides import (
    RANGE_END,
    RANGE_START,
    InstanceKind,
    bench_instance,
    event_counts,
    verify_run,
)

K, reps = int(sys.argv[1]), int(sys.argv[2])
real = build_definitions(DEFAULT_SPECS, undirected=["edge"])
held = hollow.hold_connections
out = {"main": [], "branch": []}
with bench_instance(InstanceKind.POSTGRES, Path("/tmp/dagster2/side"), print) as base:
    for rep in range(reps):
        for side in ("main", "branch"):
            hollow.hold_connections = held if side == "branch" else (lambda instance: None)
            job = hollow.hollow_definitions(real).resolve_job_def(hollow.HOLLOW_JOB)
            with DagsterInstance.from_ref(
                base.get_ref()
            ) as instance:  # fresh engines: NullPool again
                instance.wipe()
                verify_run(
                    job.execute_in_process(
                        run_config=QUIET_RUN,
                        instance=instance,
                        partition_key=epoch_key(0),
                        raise_on_error=False,
                    ),
                    "e0",
                )
                t = time.perf_counter()
                c = time.process_time()
                r = job.execute_in_process(
                    run_config=QUIET_RUN,
                    instance=instance,
                    tags={RANGE_START: epoch_key(1), RANGE_END: epoch_key(K)},
                    raise_on_error=False,
                )
                s, cpu = (time.perf_counter() - t) / K, (time.process_time() - c) / K
            verify_run(r, "range")
            out[side].append(s)
            print(side, rep, f"{s:.4f} s/epoch, cpu {cpu:.4f}", event_counts(r), flush=True)
for side, v in out.items():
    print(side, "median", round(statistics.median(v), 4))
print(
    "ratio branch/main", round(statistics.median(out["branch"]) / statistics.median(out["main"]), 3)
)
