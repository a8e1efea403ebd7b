"""The wcoj code location: `build_definitions` from query specs, and the default `defs`.

One set of assets per query spec over one shared set of relations and arrangements (see
`wcoj_assets.relations`, `.arrangements` and `.queries` for what each asset reads), the resource
``wcoj`` (`WcojResource`), the IO manager ``wcoj_outputs`` through which assets of your own read
a query's output (`wcoj_assets.outputs`), the job ``wcoj_epoch_job`` materializing every asset and
check of one epoch in dependency order in a single run — one Spark session, since the in-process
executor runs every step in the run's process — the landing sensor, the automation sensor that
rebuilds what a corrected epoch left stale (`wcoj_assets.provenance`) and a stopped daily
schedule. `wcoj_assets.component.WcojComponent` builds the same from a ``defs.yaml``.

Epoch ``n`` is the day ``n`` days after `start` (`wcoj_assets.epochs`). Building the definitions
parses and plans the queries and nothing else: no file, environment variable or Spark session is
touched until a run, sensor tick or schedule asks for one. The default `defs` is loaded lazily
(`dagster.definitions`): when Dagster loads the code location, not when the module is imported,
it reads ``WCOJ_SPARK_MASTER`` (a cluster's master URL) and ``WCOJ_EPOCH_START`` (the first
epoch's day, ``2020-01-01`` when unset; ``make ui`` sets it to the demo's first landed epoch).

Run one epoch::

    dagster job execute -m wcoj_assets.definitions -j wcoj_epoch_job --tags \
        '{"dagster/partition": "2020-01-03"}'

or, from Python, ``build_definitions().resolve_job_def("wcoj_epoch_job")
.execute_in_process(partition_key=...)``.
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
    definitions,
    in_process_executor,
)

from wcoj_assets.arrangements import counts_asset
from wcoj_assets.checks import correctness_check
from wcoj_assets.epochs import EPOCH_START, START_ENV, Epochs
from wcoj_assets.outputs import OUTPUTS_IO_MANAGER, outputs_io_manager
from wcoj_assets.provenance import rebuild_sensor
from wcoj_assets.queries import query_asset, query_deltas_asset, rule_asset
from wcoj_assets.relations import deltas_assets, snapshot_asset
from wcoj_assets.resources import DEFAULT_LANDING, DEFAULT_STORAGE, wcoj_resource
from wcoj_assets.sensors import SERIAL_TAG, daily_schedule, landing_sensor
from wcoj_assets.specs import (
    DEFAULT_SPECS,
    QuerySpec,
    Topology,
    counts_asset_name,
    query_deltas_asset_name,
    rule_asset_name,
)

JOB_NAME = "wcoj_epoch_job"
MASTER_ENV = "WCOJ_SPARK_MASTER"
# How often (seconds) the default code location's sensors look for new epochs and stale ones.
SENSOR_ENV = "WCOJ_SENSOR_SECONDS"
SENSOR_SECONDS = 30


def build_definitions(
    specs: Sequence[QuerySpec] = DEFAULT_SPECS,
    *,
    storage: str | None = None,
    landing: str | None = None,
    spark_master: str = "local[*]",
    spark_conf: Mapping[str, str] | None = None,
    start: str = EPOCH_START,
    undirected: Sequence[str] = (),
    sensor_seconds: int = SENSOR_SECONDS,
) -> Definitions:
    """Definitions maintaining every query of `specs` over shared arrangements.

    `storage` and `landing` default to ``.wcoj/state`` and ``.wcoj/landing`` under the working
    directory of the process running a step; either may be a `dagster.EnvVar`. Epoch ``n`` is
    the day ``n`` days after `start` (``YYYY-MM-DD``). The binary relations named in
    `undirected` land as edge lists in no particular direction: their changes are read in both
    directions, self-loops dropped (`wcoj_assets.intake`). The landing and automation sensors
    tick at most every `sensor_seconds`.
    """
    if isinstance(undirected, str):
        undirected = (undirected,)
    with warnings.catch_warnings():
        # Deliberate: backfill policies, partition mappings that allow epoch 0 to have no
        # predecessor, partitioned asset checks and automation conditions on them are
        # beta/preview features of Dagster 1.13.
        warnings.simplefilter("ignore", BetaWarning)
        warnings.simplefilter("ignore", PreviewWarning)
        return _build(
            Topology.of(specs, undirected),
            Epochs(start),
            storage,
            landing,
            spark_master,
            spark_conf,
            sensor_seconds,
        )


def _build(
    topo: Topology,
    epochs: Epochs,
    storage: str | None,
    landing: str | None,
    spark_master: str,
    spark_conf: Mapping[str, str] | None,
    sensor_seconds: int,
) -> Definitions:
    queries = topo.queries
    assets = [
        deltas_assets(
            relations=topo.relations, undirected=topo.undirected, queries=queries, epochs=epochs
        ),
        *[
            snapshot_asset(relation=rel, arity=arity, queries=queries, epochs=epochs)
            for rel, arity in topo.relations.items()
        ],
        *[counts_asset(arrangement=a, queries=queries, epochs=epochs) for a in topo.counts],
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
                epochs=epochs,
            )
            for i in range(len(query.atoms))
        ]
        assets.append(query_deltas_asset(query=query, queries=queries, epochs=epochs))
        assets.append(query_asset(query=query, queries=queries, epochs=epochs))
        checks.append(correctness_check(query=query, queries=queries, epochs=epochs))
    derived = [counts_asset_name(a) for a in topo.counts]
    for query in queries:
        derived += [rule_asset_name(query.name, i) for i in range(len(query.atoms))]
        derived += [query_deltas_asset_name(query.name), query.name]
    job = define_asset_job(
        JOB_NAME,
        selection=AssetSelection.assets(*assets),
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
        sensors=[
            landing_sensor(
                job=job, relations=list(topo.relations), epochs=epochs, interval=sensor_seconds
            ),
            rebuild_sensor(derived, run_tags={SERIAL_TAG: "epochs"}, interval=sensor_seconds),
        ],
        schedules=[daily_schedule(job=job)],
        resources={
            "wcoj": resource,
            OUTPUTS_IO_MANAGER: outputs_io_manager(queries=queries, epochs=epochs),
        },
        executor=in_process_executor,
    )


@definitions
def defs() -> Definitions:
    """The default code location (what ``dagster dev`` and ``dagster job execute`` load)."""
    return build_definitions(
        spark_master=os.environ.get(MASTER_ENV) or "local[*]",
        start=os.environ.get(START_ENV) or EPOCH_START,
        sensor_seconds=int(os.environ.get(SENSOR_ENV) or SENSOR_SECONDS),
    )
