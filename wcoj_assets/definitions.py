"""The wcoj code location: `build_definitions` from query specs, and the default `defs`.

One set of assets per query spec over one shared set of relations and arrangements (see
`wcoj_assets.relations`, `.arrangements` and `.queries` for what each asset reads), one resource (``wcoj``, `WcojResource`), the job
``wcoj_epoch_job`` materializing every asset and check of one epoch in dependency order in a
single run — one Spark session, since the in-process executor runs every step in the run's
process — the landing sensor and a stopped daily schedule.

Building the definitions parses and plans the queries and nothing else: no file, environment
variable or Spark session is touched until a run, sensor tick or schedule asks for one.

Run one epoch::

    dagster job execute -m wcoj_assets.definitions -j wcoj_epoch_job --tags \
        '{"dagster/partition": "2020-01-03"}'

or, from Python, ``defs.get_job_def("wcoj_epoch_job").execute_in_process(partition_key=...)``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence

from dagster import (
    AssetSelection,
    BetaWarning,
    Definitions,
    PreviewWarning,
    define_asset_job,
    in_process_executor,
)

from wcoj_assets.arrangements import counts_asset
from wcoj_assets.checks import correctness_check
from wcoj_assets.epochs import epoch_partitions
from wcoj_assets.queries import query_asset, query_deltas_asset, rule_asset
from wcoj_assets.relations import deltas_assets, snapshot_asset
from wcoj_assets.resources import DEFAULT_LANDING, DEFAULT_STORAGE, wcoj_resource
from wcoj_assets.sensors import SERIAL_TAG, daily_schedule, landing_sensor
from wcoj_assets.specs import DEFAULT_SPECS, QuerySpec, Topology

JOB_NAME = "wcoj_epoch_job"


def build_definitions(
    specs: Sequence[QuerySpec] = DEFAULT_SPECS,
    *,
    storage: str | None = None,
    landing: str | None = None,
    spark_master: str = "local[*]",
    spark_conf: Mapping[str, str] | None = None,
) -> Definitions:
    """Definitions maintaining every query of `specs` over shared arrangements.

    `storage` and `landing` default to ``.wcoj/state`` and ``.wcoj/landing`` under the working
    directory of the process running a step; either may be a `dagster.EnvVar`.
    """
    with warnings.catch_warnings():
        # Deliberate: backfill policies, partition mappings that allow epoch 0 to have no
        # predecessor and partitioned asset checks are beta/preview features of Dagster 1.13.
        warnings.simplefilter("ignore", BetaWarning)
        warnings.simplefilter("ignore", PreviewWarning)
        return _build(Topology.of(specs), storage, landing, spark_master, spark_conf)


def _build(
    topo: Topology,
    storage: str | None,
    landing: str | None,
    spark_master: str,
    spark_conf: Mapping[str, str] | None,
) -> Definitions:
    partitions = epoch_partitions()
    queries = topo.queries
    assets = [
        deltas_assets(relations=topo.relations, queries=queries, partitions=partitions),
        *[
            snapshot_asset(relation=rel, arity=arity, queries=queries, partitions=partitions)
            for rel, arity in topo.relations.items()
        ],
        *[counts_asset(arrangement=a, queries=queries, partitions=partitions) for a in topo.counts],
    ]
    checks = []
    for query in queries:
        plan = topo.plans[query.name]
        assets += [
            rule_asset(
                query=query,
                plan=plan,
                atom=i,
                reads=topo.rule_reads(query.name, i),
                queries=queries,
                partitions=partitions,
            )
            for i in range(len(query.atoms))
        ]
        assets.append(query_deltas_asset(query=query, queries=queries, partitions=partitions))
        assets.append(query_asset(query=query, queries=queries, partitions=partitions))
        checks.append(correctness_check(query=query, queries=queries, partitions=partitions))
    job = define_asset_job(
        JOB_NAME,
        selection=AssetSelection.all(),
        tags={SERIAL_TAG: "epochs"},
        description="Every asset and check of one epoch, in dependency order, in one run.",
    )
    resource = wcoj_resource(
        master=spark_master,
        spark_conf=dict(spark_conf or {}),
        storage=storage if storage is not None else DEFAULT_STORAGE,
        landing=landing if landing is not None else DEFAULT_LANDING,
    )
    return Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=[job],
        sensors=[landing_sensor(job=job, relations=list(topo.relations))],
        schedules=[daily_schedule(job=job)],
        resources={"wcoj": resource},
        executor=in_process_executor,
    )


# `dagster dev` / `dagster job execute` load this: WCOJ_SPARK_MASTER points it at a cluster
# (run config can still set `resources.wcoj.config.master` per run).
defs = build_definitions(spark_master=os.environ.get("WCOJ_SPARK_MASTER") or "local[*]")
