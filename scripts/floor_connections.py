"""Dagster's floor for a range run (the hollow twin, wcoj_bench.infra.hollow) with every
partition's check evaluation written, with a database connection per statement (Dagster's
default, main before issue 42.7) beside connections held open (hold_connections), alternating in
one process on one Postgres server. Usage: python scripts/floor_connections.py EPOCHS REPEATS"""

import statistics
import sys
import tempfile
from pathlib import Path

from dagster import DagsterInstance

import wcoj_bench.infra.hollow as hollow
from wcoj_assets.definitions import build_definitions
from wcoj_assets.specs import DEFAULT_SPECS
from wcoj_bench.parts.backfill_sides import InstanceKind, bench_instance, event_counts, hollow_range

K, reps = int(sys.argv[1]), int(sys.argv[2])
real = build_definitions(DEFAULT_SPECS, undirected=["edge"])
held = hollow.hold_connections
out: dict[str, list[float]] = {"main": [], "branch": []}
with (
    tempfile.TemporaryDirectory() as root,
    bench_instance(InstanceKind.POSTGRES, Path(root), print) as base,
):
    for rep in range(reps):
        for side in ("main", "branch"):
            # "main": Dagster's default, a connection per statement (hold_connections does nothing)
            hollow.hold_connections = held if side == "branch" else (lambda instance: None)
            job = hollow.hollow_definitions(real).resolve_job_def(hollow.HOLLOW_JOB)
            with DagsterInstance.from_ref(base.get_ref()) as instance:  # fresh engines: NullPool
                instance.wipe()
                r, seconds, cpu = hollow_range(job, instance, K)
            out[side].append(seconds / K)
            print(side, rep, f"{seconds / K:.4f} s/epoch, cpu {cpu / K:.4f}", event_counts(r))
for side, v in out.items():
    print(side, "median", round(statistics.median(v), 4))
print(
    "ratio branch/main", round(statistics.median(out["branch"]) / statistics.median(out["main"]), 3)
)
