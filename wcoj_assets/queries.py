"""Query assets: one ``<q>_rule_<i>`` per delta rule, ``<q>_deltas`` and the output ``<q>``.

``<q>_deltas`` and ``<q>`` are read by downstream assets through the IO manager of
`wcoj_assets.outputs` (a Spark DataFrame whose columns are the query's head variables and
``diff``); every query asset is rebuilt by the automation of `wcoj_assets.provenance` when a
correction leaves it stale.

Rule ``i`` at epoch ``t`` reads the delta atom's changes at ``t``, the atoms before ``i`` as of
``t`` (new) and the atoms after ``i`` as of ``t - 1`` (old) — never an earlier output. So once
the arrangements are in place, rules may run for any epochs in any order, in one run or many,
and give exactly what processing the epochs one by one gives.
"""

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetDep,
    AssetExecutionContext,
    BackfillPolicy,
    MaterializeResult,
    asset,
)

from wcoj_assets.epochs import Epochs
from wcoj_assets.outputs import OUTPUTS_IO_MANAGER
from wcoj_assets.provenance import current_check_result, current_check_spec, rebuild_condition
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import (
    deltas_asset_name,
    query_deltas_asset_name,
    rule_asset_name,
)
from wcoj_assets.steps import (
    add_standard_metadata,
    batch_schema_check,
    batch_uri,
    each_epoch,
    epoch_mapping,
    explain_md,
    output_schema,
    previous_epoch,
    rows_at,
    schema_check_spec,
    summarize,
    trace_uri,
)

if TYPE_CHECKING:
    from wcoj_core.query.ir import Query
    from wcoj_core.query.plan import Plan
    from wcoj_core.state import Batch


def rule_asset(
    *,
    query: "Query",
    plan: "Plan",
    atom: int,
    reads: Mapping[str, frozenset[int]],
    queries: Sequence["Query"],
    epochs: Epochs,
) -> Any:
    """``<q>_rule_<atom>``: the output change of one delta rule at the epoch."""
    from wcoj_core.query.explain import explain_rule

    name = rule_asset_name(query.name, atom)
    delta_relation = query.atoms[atom].relation
    text = explain_rule(plan, plan.rules[atom])
    width = len(query.head)
    partitions = epochs.partitions()
    schema = output_schema(query)
    deps = [AssetDep(deltas_asset_name(delta_relation))]
    deps += [AssetDep(dep, partition_mapping=epoch_mapping(off)) for dep, off in reads.items()]

    @asset(
        name=name,
        partitions_def=partitions,
        group_name=query.name,
        kinds={"spark"},
        deps=deps,
        backfill_policy=BackfillPolicy.single_run(),
        check_specs=[schema_check_spec(name, partitions), current_check_spec(name, partitions)],
        description=(
            f"Rule {atom} of `{query.name}`: the output change caused by the changes to atom "
            f"{atom} (`{query.atoms[atom]}`) at the epoch, joining atoms before it as of the "
            "epoch (new) and atoms after it as of the previous epoch (old). GenericJoin: count, "
            "propose from the fewest, validate against the others.\n\n"
            f"```\n{text}\n```"
        ),
        metadata={"explain": explain_md(text), "dagster/column_schema": schema},
        automation_condition=rebuild_condition(name),
    )
    def _rule(context: AssetExecutionContext, wcoj: WcojResource) -> MaterializeResult:
        from wcoj_core.traces import relation_trace_name
        from wcoj_core.updates import relation_columns

        history = wcoj.history(queries)
        batches: list[Batch] = []

        def step(t: int) -> dict[str, Any]:
            batch, work = history.derive_rule(query.name, atom, t)
            batches.append(batch)
            uri = batch_uri(history, batch)
            add_standard_metadata(context, name, epochs.key(t), schema, uri, batch.rows)
            return {
                "rows_in": rows_at(history, relation_trace_name(delta_relation), t),
                "rows_proposed": work.proposed,
                "rows_validated": work.validated,
                "rows_out": batch.rows,
                "ran on": work.deployment,
            }

        per_epoch = each_epoch(context, epochs, step)
        checks = [
            batch_schema_check(history, batches, relation_columns(width), name),
            current_check_result(context, history, name, [e["epoch"] for e in per_epoch], epochs),
        ]
        metadata = {**summarize(per_epoch), "explain": explain_md(text)}
        return MaterializeResult(metadata=metadata, check_results=checks)

    return _rule


def query_deltas_asset(*, query: "Query", queries: Sequence["Query"], epochs: Epochs) -> Any:
    """``<q>_deltas``: the rules' outputs at the epoch, summed and consolidated."""
    name = query_deltas_asset_name(query.name)
    partitions = epochs.partitions()
    schema = output_schema(query)
    rules = [rule_asset_name(query.name, i) for i in range(len(query.atoms))]

    @asset(
        name=name,
        partitions_def=partitions,
        group_name=query.name,
        kinds={"spark"},
        deps=[AssetDep(r) for r in rules],
        backfill_policy=BackfillPolicy.single_run(),
        check_specs=[schema_check_spec(name, partitions), current_check_spec(name, partitions)],
        description=f"The change of `{query.name}`'s output at the epoch: its delta rules' "
        "outputs summed and consolidated.",
        metadata={"dagster/column_schema": schema},
        io_manager_key=OUTPUTS_IO_MANAGER,
        automation_condition=rebuild_condition(name),
    )
    def _query_deltas(context: AssetExecutionContext, wcoj: WcojResource) -> MaterializeResult:
        from wcoj_core.history import rule_trace_name
        from wcoj_core.updates import relation_columns

        history = wcoj.history(queries)
        batches: list[Batch] = []

        def step(t: int) -> dict[str, Any]:
            rows_in = sum(
                rows_at(history, rule_trace_name(query.name, i), t) for i in range(len(rules))
            )
            batches.append(history.derive_output(query.name, t))
            uri = batch_uri(history, batches[-1])
            add_standard_metadata(context, name, epochs.key(t), schema, uri, batches[-1].rows)
            return {"rows_in": rows_in, "rows_out": batches[-1].rows}

        per_epoch = each_epoch(context, epochs, step)
        checks = [
            batch_schema_check(history, batches, relation_columns(len(query.head)), name),
            current_check_result(context, history, name, [e["epoch"] for e in per_epoch], epochs),
        ]
        return MaterializeResult(metadata=summarize(per_epoch), check_results=checks)

    return _query_deltas


def query_asset(*, query: "Query", queries: Sequence["Query"], epochs: Epochs) -> Any:
    """``<q>``: the query's accumulated output as of the epoch."""
    name = query.name
    partitions = epochs.partitions()
    schema = output_schema(query)

    @asset(
        name=name,
        partitions_def=partitions,
        group_name=query.name,
        kinds={"spark"},
        deps=[
            AssetDep(query_deltas_asset_name(query.name)),
            AssetDep(name, partition_mapping=previous_epoch()),
        ],
        backfill_policy=BackfillPolicy.single_run(),
        check_specs=[current_check_spec(name, partitions)],
        description=f"The output of `{query}` as of the epoch: the previous output plus the "
        "epoch's change (the sum of the stored changes up to the epoch).",
        metadata={"dagster/column_schema": schema},
        io_manager_key=OUTPUTS_IO_MANAGER,
        automation_condition=rebuild_condition(name),
    )
    def _query(context: AssetExecutionContext, wcoj: WcojResource) -> MaterializeResult:
        from pyspark.sql import functions as F

        from wcoj_core.engine import output_trace_name
        from wcoj_core.updates import DIFF

        history = wcoj.history(queries)

        def step(t: int) -> dict[str, Any]:
            figures = history.output_figures(query.name, t)
            if figures is None:  # Spark's path: aggregate the accumulated output
                row = (
                    history.output(query.name, t)
                    .agg(
                        F.count(F.lit(1)).alias("rows"),
                        F.coalesce(F.sum(DIFF), F.lit(0)).alias("count"),
                    )
                    .first()
                )
                assert row is not None
                figures = int(row["rows"]), int(row["count"])
            uri = trace_uri(history, output_trace_name(query.name), t)
            add_standard_metadata(context, name, epochs.key(t), schema, uri, figures[0])
            return {
                "rows_in": rows_at(history, output_trace_name(query.name), t),
                "rows_out": figures[0],
                "count": figures[1],
            }

        per_epoch = each_epoch(context, epochs, step)
        check = current_check_result(
            context, history, name, [e["epoch"] for e in per_epoch], epochs
        )
        return MaterializeResult(
            metadata=summarize(per_epoch, latest=("rows_out", "count")), check_results=[check]
        )

    return _query
