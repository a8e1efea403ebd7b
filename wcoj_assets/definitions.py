"""The wcoj code location: `build_definitions` from query specs, and the default `defs`.

One set of assets per query over shared relations and arrangements (`wcoj_assets.graph`), all made
by ONE step (`wcoj_assets.pipeline`); the resource ``wcoj``, the IO manager ``wcoj_outputs``
(`wcoj_assets.outputs`), the jobs ``wcoj_epoch_job`` and ``wcoj_verify_job``, and the landing,
rebuild and automation sensors; with a `name`, every name derives from it (`Names`). Epoch ``n``
is the day ``n`` days after `start`. Building parses and plans the queries and nothing else. The
default `defs` is loaded lazily and reads ``WCOJ_SPARK_MASTER``, ``WCOJ_EPOCH_START`` (default
``2020-01-01``) and ``WCOJ_SENSOR_SECONDS`` then. Run one epoch::

    dagster job execute -m wcoj_assets.definitions -j wcoj_epoch_job --tags \\
        '{"dagster/partition": "2020-01-03"}'
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from dagster import (
    AssetSelection,
    BackfillPolicy,
    BetaWarning,
    Definitions,
    PreviewWarning,
    define_asset_job,
    definitions,
    in_process_executor,
)

from wcoj_assets.checks import (
    BINARY_JOIN,
    PER_PARTITION_LIMIT,
    UPDATE_TRIPLES,
    CheckReporting,
    check_specs,
)
from wcoj_assets.epochs import EPOCH_START, START_ENV, Epochs
from wcoj_assets.graph import EpochGraph, Role, Translate
from wcoj_assets.outputs import OUTPUTS_IO_MANAGER, outputs_io_manager
from wcoj_assets.pipeline import OP_NAME, VERIFY_TAG, EpochConfig, EpochRun, epochs_asset
from wcoj_assets.provenance import (
    AUTOMATION_SENSOR,
    REBUILD_SENSOR,
    automation_sensor,
    rebuild_sensor,
)
from wcoj_assets.resources import DEFAULT_LANDING, DEFAULT_STORAGE, WcojResource, wcoj_resource
from wcoj_assets.sensors import LANDING_SENSOR, SERIAL_TAG, landing_sensor
from wcoj_assets.specs import DEFAULT_SPECS, QuerySpec, Topology
from wcoj_core.errors import QueryError
from wcoj_core.knobs import knob

JOB_NAME = "wcoj_epoch_job"
VERIFY_JOB = "wcoj_verify_job"
MASTER_ENV = "WCOJ_SPARK_MASTER"
# How often (seconds) the default code location's sensors look for new epochs and stale ones.
SENSOR_ENV = "WCOJ_SENSOR_SECONDS"
SENSOR_SECONDS = 30


@dataclass(frozen=True, slots=True)
class Names:
    """The names of what one pipeline defines, derived from its `name`, so that two pipelines
    (two components) live in one code location side by side; without a name, the default code
    location's (``wcoj_epoch_job``, ``wcoj_landing_sensor``, the resource ``wcoj``...).

    >>> Names().job, Names().resource, Names("tri").job, Names("tri").outputs
    ('wcoj_epoch_job', 'wcoj', 'tri_epoch_job', 'tri_outputs')
    """

    name: str | None = None

    def _of(self, suffix: str, default: str) -> str:
        return f"{self.name}_{suffix}" if self.name else default

    @property
    def op(self) -> str:
        return self._of("epochs", OP_NAME)

    @property
    def job(self) -> str:
        return self._of("epoch_job", JOB_NAME)

    @property
    def verify_job(self) -> str:
        return self._of("verify_job", VERIFY_JOB)

    @property
    def landing_sensor(self) -> str:
        return self._of("landing_sensor", LANDING_SENSOR)

    @property
    def rebuild_sensor(self) -> str:
        return self._of("rebuild_sensor", REBUILD_SENSOR)

    @property
    def automation_sensor(self) -> str:
        return self._of("automation_sensor", AUTOMATION_SENSOR)

    @property
    def resource(self) -> str:
        return self._of("wcoj", "wcoj")

    @property
    def outputs(self) -> str:
        return self._of("outputs", OUTPUTS_IO_MANAGER)


# What the step runs for its context and op config: `EpochRun` over the pipeline's resource and
# graph, unless a component overrides `execute`.
Execute = Callable[[Any, EpochConfig, WcojResource, EpochGraph], Iterator[Any]]


def run_epochs(
    context: Any, config: EpochConfig, wcoj: WcojResource, graph: EpochGraph
) -> Iterator[Any]:
    """The step's body: `EpochRun.run`."""
    return EpochRun(context, config, wcoj, graph).run()


def build_definitions(
    specs: Sequence[QuerySpec] = DEFAULT_SPECS,
    *,
    name: str | None = None,
    storage: Any = None,
    landing: Any = None,
    spark_master: str = "local[*]",
    spark_conf: Mapping[str, str] | None = None,
    start: str = EPOCH_START,
    epochs_per_day: int = 1,
    undirected: Sequence[str] = (),
    sets: Sequence[str] = (),
    bags: Sequence[str] = (),
    sensor_seconds: int = SENSOR_SECONDS,
    check_every: int | None = None,
    check_reporting: str | CheckReporting | None = None,
    empty_epochs: bool | None = None,
    memory: str | None = None,
    pyspark: Any = None,
    translate: Translate | None = None,
    op_name: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    pool: str | None = None,
    backfill_policy: BackfillPolicy | None = None,
    execute: Execute = run_epochs,
) -> Definitions:
    """Definitions maintaining every query of `specs` over shared arrangements (docs/dagster.md).

    `name` prefixes the job, sensors, resource and IO manager (`Names`; None: the default names).
    `storage` and `landing` (default ``.wcoj/state``, ``.wcoj/landing``) may be `dagster.EnvVar`s.
    `start` and `epochs_per_day` set the epochs (`Epochs`); `undirected`, `sets` and `bags` declare
    the relations' meanings (`wcoj_core.meaning`);
    `check_every`, `check_reporting` (`wcoj_assets.checks.CheckReporting`), `empty_epochs`,
    `memory` (the step's budget) and `pyspark` (a `LazyPySparkResource`) configure the step;
    `translate` maps each base spec and `AssetInfo` to the spec used; `op_name`, `op_tags`, `pool`,
    `backfill_policy` and `execute` (its body, `run_epochs`) set the step's. No executor."""
    names = Names(name)
    undirected, sets, bags = (
        (v,) if isinstance(v, str) else tuple(v) for v in (undirected, sets, bags)
    )
    with warnings.catch_warnings():
        # Deliberate: beta/preview features of Dagster 1.13 (backfill policies, checks' partitions)
        warnings.simplefilter("ignore", BetaWarning)
        warnings.simplefilter("ignore", PreviewWarning)
        topology = Topology.of(specs, undirected, sets, bags)
        checks = partial(check_specs, rebuild_sensor=names.rebuild_sensor)
        graph = EpochGraph.build(
            topology, Epochs(start, epochs_per_day), translate, checks, names.outputs
        )
        step = {"name": op_name, "op_tags": op_tags, "pool": pool, "backfill": backfill_policy}
        assets = _step(graph, names, execute, step)
        resource = _resource(
            spark_master,
            spark_conf,
            storage,
            landing,
            {
                "check_every": check_every,
                "check_reporting": None
                if check_reporting is None
                else reporting_of(check_reporting),
                "empty_epochs": empty_epochs,
                "memory": memory,
                "pyspark": pyspark,
            },
        )
        return assemble(graph, assets, resource, sensor_seconds, names)


def _step(graph: EpochGraph, names: Names, execute: Execute, step: Mapping[str, Any]) -> Any:
    """The one step of the pipeline: every asset, made by `execute` with the pipeline's resource;
    `step` holds the op's name, tags, pool and backfill policy (None: the defaults)."""
    key = names.resource

    def body(context: Any, config: EpochConfig) -> Iterator[Any]:
        return execute(context, config, getattr(context.resources, key), graph)

    return epochs_asset(
        graph,
        body,
        name=step["name"] or names.op,
        op_tags=dict(step["op_tags"] or {}),
        pool=step["pool"],
        backfill_policy=step["backfill"],
        resource_key=key,
    )


def _resource(
    master: str,
    spark_conf: Mapping[str, str] | None,
    storage: Any,
    landing: Any,
    given: Mapping[str, Any],
) -> Any:
    """The pipeline's resource: Spark, storage and landing (defaults under ``.wcoj/``) and the
    other settings `given` holds; a bad memory budget is refused when the definitions load."""
    if given.get("memory") is not None:
        from wcoj_core.budget import MemoryBudget

        MemoryBudget.of(given["memory"])
    return wcoj_resource(
        master=master,
        spark_conf=dict(spark_conf or {}),
        storage=storage if storage is not None else DEFAULT_STORAGE,
        landing=landing if landing is not None else DEFAULT_LANDING,
        **{k: v for k, v in given.items() if v is not None},
    )


def reporting_of(value: str | CheckReporting) -> CheckReporting:
    """A `CheckReporting` from its name; `QueryError` for another.

    >>> reporting_of("every")
    <CheckReporting.EVERY: 'every'>
    >>> reporting_of("all")
    Traceback (most recent call last):
      ...
    wcoj_core.errors.QueryError: check_reporting 'all': give auto (each partition its own status up to 100 epochs), every or news (failures and recoveries)
    """
    try:
        return CheckReporting(value)
    except ValueError:
        raise QueryError(
            f"check_reporting {value!r}: give auto (each partition its own status up to "
            f"{PER_PARTITION_LIMIT} epochs), every or news (failures and recoveries)"
        ) from None


def assemble(
    graph: EpochGraph, assets: Any, resource: Any, sensor_seconds: int, names: Names
) -> Definitions:
    """The definitions around the step `assets` of `graph`: jobs, sensors, resources."""
    checks = {spec.name: [] for spec in graph.check_specs}
    for spec in graph.check_specs:
        checks[spec.name].append(spec.key)
    everything = AssetSelection.assets(assets)
    job = define_asset_job(
        names.job,
        selection=everything - AssetSelection.checks(*checks[BINARY_JOIN]),
        tags={SERIAL_TAG: "epochs"},
        executor_def=in_process_executor,
        description="Every asset and check of the epochs of the run (one epoch, or a range), "
        "in one step: one engine pass and one commit per epoch; the binary-join recomputation "
        "on its cadence only.",
    )
    verify = define_asset_job(
        names.verify_job,
        selection=everything - AssetSelection.checks(*checks[UPDATE_TRIPLES]),
        tags={VERIFY_TAG: "true"},
        executor_def=in_process_executor,
        description="Verifies the epochs of the run as the state holds them: every check but "
        "the landed files' (the binary-join recomputation on the run's last epoch), nothing "
        "applied or materialized.",
    )
    outputs = list(graph.of_role(Role.OUTPUT))
    keys = [graph.key(i.name) for i in graph.infos]
    return Definitions(
        assets=[assets],
        jobs=[job, verify],
        sensors=[
            landing_sensor(
                name=names.landing_sensor,
                job=job,
                graph=graph,
                resource_key=names.resource,
                interval=sensor_seconds,
            ),
            rebuild_sensor(
                job=job, graph=graph, name=names.rebuild_sensor, interval=sensor_seconds
            ),
            automation_sensor(
                keys,
                name=names.automation_sensor,
                run_tags={SERIAL_TAG: "epochs"},
                interval=sensor_seconds,
            ),
        ],
        resources={
            names.resource: resource,
            names.outputs: outputs_io_manager(
                graph=graph, outputs=outputs, resource_key=names.resource
            ),
        },
    )


@definitions
def defs() -> Definitions:
    """The default code location (what ``dagster dev`` and ``dagster job execute`` load): the
    default pipeline, every step in process."""
    pipeline = build_definitions(
        spark_master=knob(MASTER_ENV) or "local[*]",
        start=knob(START_ENV) or EPOCH_START,
        sensor_seconds=int(knob(SENSOR_ENV) or SENSOR_SECONDS),
    )
    return Definitions.merge(pipeline, Definitions(executor=in_process_executor))
