"""The `current_history` check, and the automation that rebuilds what a correction left stale.

Dagster marks a partition stale only when one of its *direct* parents is re-materialized (and,
for assets with 100 or more partitions, not through a self-dependency), so after an old epoch's
changes are corrected it flags the corrected epoch's readers and nothing later. The state knows
more: every derived batch records a digest of the landed changes it was derived from, and
`Engine.stale()` lists the epochs derived from changes corrected since (`wcoj_core.lineage`).
This module turns that into the partitioned check ``current_history`` of each query's change
(``<q>_deltas``: the epoch's change is what a correction invalidates, and, having no dependency on
its own previous epoch, the asset lets the automation request exactly the stale epochs):

* every run reports it for its own epochs, passing (an epoch just applied is current), and for
  stale epochs the engine derived again before them (`EpochResult.rebuilt`), passing;
* a run that leaves later epochs stale — the re-run of a corrected epoch — reports it *failed*
  on each of them, aimed at the partition's latest materialization, which is what makes Dagster
  hold it as the partition's current status (a new materialization clears it); the changes'
  materialization records ``stale_later_epochs`` and ``backfill_from``.

`rebuild_condition` is the declarative automation of each query's change: a partition whose
`current_history` check failed is requested once it is not being rebuilt already. Every asset
of the code location is made by one step that cannot be subset, so Dagster requests the whole
step for exactly those partitions, and the automation sensor (`rebuild_sensor`) submits what one
tick requests as ONE asset backfill: one run over the stale range. (On an asset that reads its
own previous epoch — a snapshot, a counts arrangement, an output — Dagster 1.13 would also
request the partition before each stale one, for that asset alone: a target the one step cannot
run, which fails the backfill. Hence the check and the condition sit on the query's change.)
Launching the backfill by hand (the changes' metadata names its first epoch) works as well.
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
)

from wcoj_assets.checks import CURRENT, Outcome, latest_failed

REBUILD_SENSOR = "wcoj_rebuild_sensor"


def rebuild_condition(asset: AssetKey) -> AutomationCondition:
    """Request a partition of `asset` whose `current_history` check failed, once it is not in a
    run or backfill already."""
    stale = AutomationCondition.any_checks_match(AutomationCondition.check_failed()).allow(
        AssetSelection.checks(AssetCheckKey(asset, CURRENT))
    )
    return (
        stale.with_label("current_history failed") & ~AutomationCondition.in_progress()
    ).with_label("rebuild what a correction left stale")


def rebuild_sensor(
    assets: Sequence[AssetKey],
    run_tags: dict[str, str],
    interval: int = 30,
    name: str = REBUILD_SENSOR,
) -> Any:
    """The automation sensor evaluating the automation conditions of `assets` and of the assets
    downstream of them (yours: `follows_epochs`) at most every `interval` seconds: running by
    default, each tick's requests as one asset backfill whose runs carry `run_tags`."""
    return AutomationConditionSensorDefinition(
        name,
        target=AssetSelection.assets(*assets).downstream(),
        default_status=DefaultSensorStatus.RUNNING,
        emit_backfills=True,
        run_tags=run_tags,
        minimum_interval_seconds=interval,
        description="Rebuilds the partitions a corrected epoch left stale (their "
        f"`{CURRENT}` check failed), in one asset backfill, and runs the automation of the "
        "assets downstream of the pipeline's (each epoch of yours once its input is made).",
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


def reported_failed(instance: Any, asset: AssetKey | str, keys: Sequence[str]) -> set[str]:
    """The partitions among `keys` whose latest `current_history` evaluation failed
    (`wcoj_assets.checks.latest_failed`)."""
    check = AssetCheckKey(AssetKey(asset) if isinstance(asset, str) else asset, CURRENT)
    return latest_failed(instance, check, keys)
