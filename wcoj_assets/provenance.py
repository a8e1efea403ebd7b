"""The `current_history` check, and the automation that rebuilds what a correction left stale.

Dagster marks a partition stale only when one of its *direct* parents is re-materialized (and,
for assets with 100 or more partitions, not through a self-dependency), so after an old epoch's
changes are corrected it flags the corrected epoch's readers and nothing later. The state knows
more: every derived batch records a digest of the batches it was computed from
(`wcoj_core.history.History.stale`). This module turns that into a partitioned asset check on
every derived asset — counts arrangements, rules, a query's change and its output:

* each materialization reports the check for its epochs, passing when the batch it wrote (and
  everything that batch read) is current;
* it also reports the check *failed* on each of its own later partitions that is stale: when the corrected epoch is re-run (the sensor does it), every derived asset
  rebuilt at that epoch flags its later partitions, so the UI shows exactly those red. Each
  failed evaluation targets the partition's latest materialization, which is what makes Dagster
  hold it as the partition's current status (a new materialization clears it).

`rebuild_condition` is the declarative automation of each derived asset: a partition whose
`current_history` check failed is requested again once nothing it reads is being rebuilt, and the
automation sensor (`rebuild_sensor`) submits what one tick requests as ONE asset backfill, which
Dagster runs in dependency order. An asset reports its later partitions only after its own
rebuild at the corrected epoch, so whatever a tick finds failed has its inputs in place or
requested in the same backfill. A tick that falls in the middle of the re-run sees part of the
stale partitions; the rest follow in a later backfill, once the first has rebuilt what they read.
Launching the backfill by hand (the metadata of the corrected changes names its first epoch)
works as before.

One Dagster 1.13 quirk: when a requested asset must run with its checks (any asset with checks
that cannot be subset), the daemon maps the requested partitions onto the asset *through its
dependency on itself*, so for an asset reading its own previous epoch (a counts arrangement, a
query's output) it also requests the partition before each one: the corrected epoch, already
rebuilt. Rebuilding it again costs one epoch's step and changes nothing, since a derived batch is
identified by what it was computed from.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSpec,
    AssetKey,
    AssetRecordsFilter,
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    DagsterEventType,
    DefaultSensorStatus,
    PartitionsDefinition,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from wcoj_assets.epochs import Epochs
from wcoj_assets.specs import counts_asset_name, query_deltas_asset_name, rule_asset_name

if TYPE_CHECKING:
    from wcoj_core.history import History

CURRENT = "current_history"
REBUILD_SENSOR = "wcoj_rebuild_sensor"


def current_check_spec(name: str, partitions: PartitionsDefinition) -> AssetCheckSpec:
    return AssetCheckSpec(
        CURRENT,
        asset=name,
        partitions_def=partitions,
        description="The partition was computed from the relations' history as it is now: no "
        "epoch it reads was corrected since. When an old epoch is re-run after a correction, "
        "every later partition it invalidated is reported failed; the automation sensor "
        f"`{REBUILD_SENSOR}` (or a backfill from that epoch) rebuilds them and they pass again.",
    )


def rebuild_condition(asset: str) -> AutomationCondition:
    """Request a partition of `asset` whose `current_history` check failed, once none of its
    inputs is being rebuilt and it is not in a run or backfill already."""
    stale = AutomationCondition.any_checks_match(AutomationCondition.check_failed()).allow(
        AssetSelection.checks(AssetCheckKey(AssetKey(asset), CURRENT))
    )
    return (
        stale.with_label("current_history failed")
        & ~AutomationCondition.in_progress()
        & ~AutomationCondition.any_deps_in_progress()
    ).with_label("rebuild what a correction left stale")


def rebuild_sensor(assets: Sequence[str], run_tags: dict[str, str], interval: int = 30) -> Any:
    """The automation sensor evaluating `rebuild_condition` on `assets` at most every `interval`
    seconds: running by default, each tick's requests as one asset backfill whose runs carry
    `run_tags`."""
    return AutomationConditionSensorDefinition(
        REBUILD_SENSOR,
        target=AssetSelection.assets(*assets),
        default_status=DefaultSensorStatus.RUNNING,
        emit_backfills=True,
        run_tags=run_tags,
        minimum_interval_seconds=interval,
        description="Rebuilds the partitions a corrected epoch left stale (their "
        f"`{CURRENT}` check failed), in one asset backfill run in dependency order.",
    )


def trace_assets(history: "History") -> dict[str, list[str]]:
    """Each derived trace of the state and the assets that show it."""
    from wcoj_core.traces import counts_trace_name, output_trace_name, rule_trace_name

    out = {counts_trace_name(a): [counts_asset_name(a)] for a in history.counts()}
    for name, plan in history.engine.plans.items():
        for rule in plan.rules:
            out[rule_trace_name(name, rule.delta)] = [rule_asset_name(name, rule.delta)]
        out[output_trace_name(name)] = [query_deltas_asset_name(name), name]
    return out


def stale_partitions(history: "History") -> dict[str, list[int]]:
    """Every derived asset's epochs that are not computed from the current history.

    A query's output as of ``t`` sums its changes up to ``t``, so it is stale from the first
    stale change on, at every epoch it holds.
    """
    manifest = history.store.current()
    stale = history.stale(manifest)
    out: dict[str, list[int]] = {}
    for trace, assets in trace_assets(history).items():
        times = stale.get(trace)
        if not times:
            continue
        out[assets[0]] = times
        if len(assets) > 1:  # the query's output, accumulated from its changes
            held = manifest.trace(trace)
            later = sorted(b.time for b in held.batches if b.time >= times[0]) if held else []
            out[assets[1]] = later
    return out


def current_check_result(
    context: Any, history: "History", asset: str, times: Sequence[int], epochs: Epochs
) -> AssetCheckResult:
    """`current_history` for the epochs `times` a step just wrote; and failed evaluations of the
    asset's later partitions that are stale (see the module's docstring).

    Dagster records a check result of a run over a range of partitions (even a range of one, as
    a backfill launches) without a partition. For a range, an epoch's evaluation is therefore
    also logged on its own partition wherever that partition's status is news: its latest
    evaluation failed (a correction reported it stale; this clears it) or it is stale now.
    Every other epoch of the range was current before and is after, and the step's own result
    covers it: logging it again per partition would cost an event each, about as much as the
    epoch's work.
    """
    stale_all = stale_partitions(history).get(asset, [])
    stale = set(stale_all) & set(times)
    if not context.has_partition_key:
        keys = {epochs.key(t): t for t in times}
        failed = {keys[k] for k in reported_failed(context.instance, asset, list(keys))}
        for t in sorted(failed | stale):
            context.log_event(
                AssetCheckEvaluation(
                    asset_key=AssetKey(asset),
                    check_name=CURRENT,
                    passed=t not in stale,
                    partition=epochs.key(t),
                    metadata={"epoch": t},
                )
            )
    later = [t for t in stale_all if t > max(times)]
    if later:
        _report_later(context, asset, later, epochs, min(times))
    return AssetCheckResult(
        asset_key=asset,
        check_name=CURRENT,
        passed=not stale,
        metadata={"stale_epochs": sorted(stale)[:20]},
        description=(
            f"read batches replaced since (or themselves stale) at epochs {sorted(stale)[:5]}"
            if stale
            else None
        ),
    )


def _report_later(
    context: Any, asset: str, later: Sequence[int], epochs: Epochs, rebuilt: int
) -> None:
    """Fail `current_history` on the stale partitions `later`.

    Each evaluation targets the partition's latest materialization, so that Dagster (its UI,
    and the automation's `check_failed`) takes it as the partition's status. A partition
    reported failed before is reported again: the earlier evaluation may target an earlier
    materialization, and then no longer counts.
    """
    keys = [epochs.key(t) for t in later]
    targets = _latest_materializations(context.instance, asset, keys)
    since = epochs.key(rebuilt)
    context.log.warning(
        f"{asset}: {len(keys)} later partition(s) ({keys[0]}..{keys[-1]}) were derived before "
        f"{since} changed; they fail `{CURRENT}` until rebuilt (the sensor {REBUILD_SENSOR} "
        f"does it, or a backfill from {keys[0]})"
    )
    for key in keys:
        context.log_event(
            AssetCheckEvaluation(
                asset_key=AssetKey(asset),
                check_name=CURRENT,
                passed=False,
                partition=key,
                target_materialization_data=targets.get(key),
                metadata={"stale since": since, "backfill_from": keys[0]},
                description=f"computed before {since} was rebuilt from corrected changes",
            )
        )


def _latest_materializations(
    instance: Any, asset: str, keys: Sequence[str]
) -> dict[str, AssetCheckEvaluationTargetMaterializationData]:
    """Each partition's latest materialization (storage id, run, time), for those that have one."""
    key = AssetKey(asset)
    ids = instance.event_log_storage.get_latest_storage_id_by_partition(
        key, DagsterEventType.ASSET_MATERIALIZATION, set(keys)
    )
    if not ids:
        return {}
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, storage_ids=list(ids.values())), limit=len(ids)
    ).records
    by_id = {r.storage_id: r for r in records}
    return {
        partition: AssetCheckEvaluationTargetMaterializationData(
            storage_id=i, run_id=by_id[i].run_id, timestamp=by_id[i].timestamp
        )
        for partition, i in ids.items()
        if i in by_id
    }


def reported_failed(instance: Any, asset: str, keys: Sequence[str]) -> set[str]:
    """The partitions among `keys` whose latest `current_history` evaluation failed.

    Reads the check's failed evaluations (a correction's, so few), newest first, then for each
    partition of `keys` among them whether a passing evaluation came later. Planned evaluations
    (a running run's) are skipped: they hide nothing.
    """
    from dagster import AssetCheckKey
    from dagster._core.event_api import PartitionKeyFilter
    from dagster._core.storage.asset_check_execution_record import (
        AssetCheckExecutionRecordStatus as Status,
    )

    storage = instance.event_log_storage
    check = AssetCheckKey(AssetKey(asset), CURRENT)
    wanted, failed = set(keys), {}
    cursor = None
    while True:
        page = storage.get_asset_check_execution_history(
            check, limit=_PAGE, cursor=cursor, status={Status.FAILED}
        )
        for record in page:
            if record.partition in wanted:
                failed.setdefault(record.partition, record.id)
        if len(page) < _PAGE:
            break
        cursor = page[-1].id
    out = set()
    for key, failed_id in failed.items():
        passed = storage.get_asset_check_execution_history(
            check, limit=1, status={Status.SUCCEEDED}, partition_filter=PartitionKeyFilter(key=key)
        )
        if not passed or passed[0].id < failed_id:
            out.add(key)
    return out


_PAGE = 1000
