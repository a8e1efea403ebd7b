"""The `current_history` check: is a derived partition computed from the history as it is now?

Dagster marks a partition stale only when one of its *direct* parents is re-materialized (and,
for assets with 100 or more partitions, not through a self-dependency), so after an old epoch's
changes are corrected it flags the corrected epoch's readers and nothing later. The state knows
more: every derived batch records a digest of the batches it was computed from
(`wcoj_core.history.History.stale`). This module turns that into a partitioned asset check on
every derived asset — counts arrangements, rules, a query's change and its output:

* each materialization reports the check for its epochs, passing when the batch it wrote (and
  everything that batch read) is current;
* ingesting a correction reports the check *failed* on every later partition it invalidates,
  naming the epoch to backfill from — so the UI shows them red until a backfill brings them back.
"""

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSpec,
    AssetKey,
    PartitionsDefinition,
)

from wcoj_assets.epochs import epoch_key
from wcoj_assets.specs import counts_asset_name, query_deltas_asset_name, rule_asset_name

if TYPE_CHECKING:
    from wcoj_core.history import History

CURRENT = "current_history"


def current_check_spec(name: str, partitions: PartitionsDefinition) -> AssetCheckSpec:
    return AssetCheckSpec(
        CURRENT,
        asset=name,
        partitions_def=partitions,
        description="The partition was computed from the relations' history as it is now: no "
        "epoch it reads was corrected since. Reported failed on every later partition when an "
        "old epoch is corrected; a backfill from that epoch makes it pass again.",
    )


def trace_assets(history: "History") -> dict[str, list[str]]:
    """Each derived trace of the state and the assets that show it."""
    from wcoj_core.arrangement import counts_trace_name
    from wcoj_core.engine import output_trace_name
    from wcoj_core.history import rule_trace_name

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


def stale_evaluations(
    stale: dict[str, list[int]], corrected: str
) -> Iterable[AssetCheckEvaluation]:
    """The failed `current_history` evaluations for partitions a correction left stale."""
    first = min(t for times in stale.values() for t in times)
    for asset, times in sorted(stale.items()):
        for t in times:
            yield AssetCheckEvaluation(
                asset_key=AssetKey(asset),
                check_name=CURRENT,
                passed=False,
                partition=epoch_key(t),
                metadata={"corrected": corrected, "backfill_from": epoch_key(first)},
                description=f"computed before {corrected} was corrected: backfill from "
                f"{epoch_key(first)}",
            )


def current_check_result(
    context: Any, history: "History", asset: str, epochs: Sequence[int]
) -> AssetCheckResult:
    """`current_history` for the epochs a step just wrote.

    Dagster records a check result of a run over a range of partitions without a partition. For
    a range, an epoch's evaluation is therefore also logged on its own partition wherever that
    partition's status is news: its latest evaluation failed (a correction reported it stale;
    this clears it) or it is stale now. Every other epoch of the range was current before and
    is after, and the step's own result covers it: logging it again per partition would cost an
    event each, about as much as the epoch's work.
    """
    stale = set(stale_partitions(history).get(asset, ())) & set(epochs)
    if len(epochs) > 1:
        keys = {epoch_key(t): t for t in epochs}
        failed = {keys[k] for k in reported_failed(context.instance, asset, list(keys))}
        for t in sorted(failed | stale):
            context.log_event(
                AssetCheckEvaluation(
                    asset_key=AssetKey(asset),
                    check_name=CURRENT,
                    passed=t not in stale,
                    partition=epoch_key(t),
                    metadata={"epoch": t},
                )
            )
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
