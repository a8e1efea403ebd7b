"""Shared arrangements: one ``<rel>_counts_<key>`` asset per counts arrangement the plans read.

Each is materialized once per epoch however many rules of however many queries read it. The
forward, reverse and self views are not assets of their own: they are the relation's trace
(``<rel>_snapshot``) probed by different keys.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetDep,
    AssetExecutionContext,
    BackfillPolicy,
    MaterializeResult,
    TableColumn,
    TableSchema,
    asset,
)

from wcoj_assets.epochs import Epochs
from wcoj_assets.provenance import current_check_result, current_check_spec, rebuild_condition
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import counts_asset_name, deltas_asset_name, snapshot_asset_name
from wcoj_assets.steps import (
    add_standard_metadata,
    batch_schema_check,
    batch_uri,
    each_epoch,
    previous_epoch,
    rows_at,
    schema_check_spec,
    summarize,
)

if TYPE_CHECKING:
    from wcoj_core.query.ir import Query
    from wcoj_core.query.plan import Arrangement
    from wcoj_core.state import Batch


def counts_asset(
    *,
    arrangement: "Arrangement",
    queries: Sequence["Query"],
    epochs: Epochs,
) -> Any:
    """``<rel>_counts_<key>``: one counts arrangement, maintained once for every reader."""
    name = counts_asset_name(arrangement)
    relation = arrangement.view.relation
    key_cols = [f"c{k}" for k in arrangement.key]
    partitions = epochs.partitions()
    schema = TableSchema(
        [
            *[TableColumn(c, "long", f"key column {c} of `{arrangement.view}`") for c in key_cols],
            TableColumn("diff", "long", "change of the number of distinct tuples with this key"),
        ]
    )

    @asset(
        name=name,
        partitions_def=partitions,
        group_name="arrangements",
        kinds={"spark"},
        deps=[
            AssetDep(deltas_asset_name(relation)),
            AssetDep(snapshot_asset_name(relation), partition_mapping=previous_epoch()),
            AssetDep(name, partition_mapping=previous_epoch()),
        ],
        backfill_policy=BackfillPolicy.single_run(),
        check_specs=[schema_check_spec(name, partitions), current_check_spec(name, partitions)],
        description=(
            f"`{arrangement}`: for each value of ({', '.join(key_cols) or 'no key'}) of "
            f"`{arrangement.view}`, the number of distinct tuples with non-zero multiplicity. "
            "Its change at an epoch comes from the tuples whose support changed, so it needs the "
            "previous epoch arranged first. Shared by every rule of every query that counts or "
            "checks support by this key."
        ),
        metadata={"arrangement": str(arrangement), "dagster/column_schema": schema},
        automation_condition=rebuild_condition(name),
    )
    def _counts(context: AssetExecutionContext, wcoj: WcojResource) -> MaterializeResult:
        from wcoj_core.traces import relation_trace_name

        history = wcoj.history(queries)
        batches: list[Batch] = []

        def step(t: int) -> dict[str, Any]:
            batch = history.arrange(t, arrangement)
            batches.append(batch)
            uri = batch_uri(history, batch)
            add_standard_metadata(context, name, epochs.key(t), schema, uri, batch.rows)
            rows_in = rows_at(history, relation_trace_name(relation), t)
            return {"rows_in": rows_in, "rows_out": batch.rows}

        per_epoch = each_epoch(context, epochs, step)
        checks = [
            batch_schema_check(history, batches, key_cols, name),
            current_check_result(context, history, name, [e["epoch"] for e in per_epoch], epochs),
        ]
        return MaterializeResult(metadata=summarize(per_epoch), check_results=checks)

    return _counts
