"""The `current_history` check, and the automation that rebuilds what a correction left stale.

Dagster marks a partition stale only when one of its *direct* parents is re-materialized (and,
for assets with 100 or more partitions, not through a self-dependency), so after an old epoch's
changes are corrected it flags the corrected epoch's readers and nothing later. The state knows
more: every derived batch records a digest of the landed changes it was derived from, and
`Engine.stale()` lists the epochs derived from changes corrected since (`wcoj_core.lineage`).
This module turns that into the partitioned check ``current_history`` of each query's change
(``<q>_deltas``: the epoch's change is what a correction invalidates):

* every run reports it for its own epochs, passing (an epoch just applied is current), and for
  stale epochs the engine derived again before them (`EpochResult.rebuilt`), passing;
* a run that leaves later epochs stale — the re-run of a corrected epoch — reports it *failed*
  on each of them, aimed at the partition's latest materialization, which is what makes Dagster
  hold it as the partition's current status (a new materialization clears it); the changes'
  materialization records ``stale_later_epochs`` and ``backfill_from``.

`rebuild_sensor` rebuilds them: once no run or backfill of the step is in flight (so the run
that reported them has ended and every report is in), it requests ONE run of the epoch job over
the range from the first partition whose ``current_history`` failed to the last, with the
range tags and ``wcoj/serial=epochs``; the run applies each epoch of the range, oldest first,
and reports each rebuilt partition passed. The run key names the range and the latest report,
so a report is acted on once: a rebuild that fails is not retried every tick (a new report
after a later run, or the run by hand, does). Dagster's declarative automation cannot do this
deterministically: its sensor submits what one tick finds, as a backfill for more than one
partition and a run for one, a tick may fall between the reports of one run, splitting a
rebuild into several runs, and ``in_progress()`` does not see runs under the planned-events
setting of `wcoj_assets.instance`. `automation_sensor` runs the declarative automation of
assets of yours downstream of the pipeline's (`follows_epochs`). Launching the range by hand
(the changes' metadata names its first epoch) works as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)
from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.dagster_run import NOT_FINISHED_STATUSES

from wcoj_assets.checks import CURRENT, Outcome
from wcoj_assets.graph import EpochGraph, Role

REBUILD_SENSOR = "wcoj_rebuild_sensor"
AUTOMATION_SENSOR = "wcoj_automation_sensor"
RANGE_TAGS = ("dagster/asset_partition_range_start", "dagster/asset_partition_range_end")
BACKFILLING = [BulkActionStatus.REQUESTED, BulkActionStatus.CANCELING, BulkActionStatus.FAILING]


def rebuild_sensor(
    *, job: Any, graph: EpochGraph, name: str = REBUILD_SENSOR, interval: int = 30
) -> Any:
    """The sensor `name` requesting ONE run of `job` over the partitions of `graph` a
    correction left stale, once nothing of the step is in flight (see the module)."""
    checks = [AssetCheckKey(graph.key(i.name), CURRENT) for i in graph.of_role(Role.QUERY_CHANGES)]
    assets, epochs = {graph.key(i.name) for i in graph.infos}, graph.epochs

    @sensor(
        name=name,
        job=job,
        minimum_interval_seconds=interval,
        default_status=DefaultSensorStatus.RUNNING,
        description="Rebuilds the partitions a corrected epoch left stale (their "
        f"`{CURRENT}` check failed) in ONE run over their range, once no run of the epochs "
        "is in flight.",
    )
    def _rebuild(context: SensorEvaluationContext) -> RunRequest | SkipReason:
        busy = in_flight(context.instance, job.name, assets)
        if busy is not None:
            return SkipReason(f"{busy} is in flight: stale epochs are read once it has ended")
        failed = [
            i for i in stale_reports(context.instance, checks) if epochs.is_key(i.partition_key)
        ]
        keys = sorted({i.partition_key for i in failed}, key=epochs.number)
        if not keys:
            return SkipReason(f"no partition's `{CURRENT}` check failed")
        latest = max(i.latest_check_event_storage_id for i in failed)
        return RunRequest(
            run_key=f"rebuild {keys[0]}..{keys[-1]} after report {latest}",
            tags=dict(zip(RANGE_TAGS, (keys[0], keys[-1]), strict=True)),
        )

    return _rebuild


def in_flight(instance: Any, job_name: str, assets: set[AssetKey]) -> str | None:
    """A run or backfill of `job_name` or of any of `assets` that has not ended, or None."""
    for run in instance.get_runs(RunsFilter(statuses=NOT_FINISHED_STATUSES)):
        if run.job_name == job_name or assets & set(run.asset_selection or ()):
            return f"run {run.run_id}"
    for backfill in instance.get_backfills(filters=BulkActionsFilter(statuses=BACKFILLING)):
        if backfill.job_name == job_name or assets & set(backfill.asset_selection or ()):
            return f"backfill {backfill.backfill_id}"
    return None


def stale_reports(instance: Any, checks: Sequence[AssetCheckKey]) -> list[Any]:
    """The partitions of `checks` whose latest evaluation failed and is about the partition's
    latest materialization (Dagster's `AssetCheckPartitionInfo`: what the UI shows red)."""
    infos = instance.event_log_storage.get_asset_check_partition_info(list(checks))
    return [
        i
        for i in infos
        if i.latest_execution_status is AssetCheckExecutionRecordStatus.FAILED
        and i.is_current
        and i.partition_key is not None
    ]


def automation_sensor(
    assets: Sequence[AssetKey],
    run_tags: dict[str, str],
    interval: int = 30,
    name: str = AUTOMATION_SENSOR,
) -> Any:
    """The sensor evaluating the automation conditions of the assets downstream of `assets`
    (yours: `follows_epochs`) at most every `interval` seconds: running by default, its runs
    carrying `run_tags`."""
    return AutomationConditionSensorDefinition(
        name,
        target=AssetSelection.assets(*assets).downstream(),
        default_status=DefaultSensorStatus.RUNNING,
        emit_backfills=True,
        run_tags=run_tags,
        minimum_interval_seconds=interval,
        description="Runs the automation of the assets downstream of the pipeline's (each epoch "
        "of yours once its input is made).",
    )


def follows_epochs() -> AutomationCondition:
    """The automation condition for an asset of yours reading a query's output per epoch: each
    partition is requested once the partitions it reads are materialized (again), whatever its
    age — Dagster's `eager` without its restriction to the latest day — and, when the condition
    is first evaluated (the asset is new), every past epoch it lacks; never while it or what it
    reads is being made. The pipeline's automation sensor evaluates it and submits a tick's
    requests as one backfill: with ``backfill_policy=BackfillPolicy.single_run()`` one run fills
    the range (its parameter annotated ``dict[str, pa.Table]`` gets each epoch's)."""
    past = AutomationCondition.missing() & AutomationCondition.initial_evaluation()
    handled = AutomationCondition.newly_requested() | AutomationCondition.newly_updated()
    return (
        (past | AutomationCondition.newly_missing() | AutomationCondition.any_deps_updated())
        .since(handled.with_label("handled"))
        .with_label("an epoch it reads was made, or it lacks one")
        & ~AutomationCondition.any_deps_missing()
        & ~AutomationCondition.any_deps_in_progress()
        & ~AutomationCondition.in_progress()
    ).with_label("follows the wcoj epochs")


def current(epoch: int, rebuilt: bool = False) -> Outcome:
    """`current_history` of an epoch the run just derived."""
    return Outcome(True, {"epoch": str(epoch), "rebuilt": rebuilt})


def stale(epoch: int, since: str, backfill_from: str) -> Outcome:
    """`current_history` of a later epoch derived before `since` was corrected."""
    return Outcome(
        False,
        {"epoch": str(epoch), "stale since": since, "backfill_from": backfill_from},
        f"derived before {since} was re-run from corrected changes",
    )
