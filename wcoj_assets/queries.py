"""Query assets: one ``<q>_rule_<i>`` per delta rule, ``<q>_deltas`` and the output ``<q>``.

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
    PartitionsDefinition,
    asset,
)

from wcoj_assets.provenance import current_check_result, current_check_spec
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import (
    deltas_asset_name,
    query_deltas_asset_name,
    rule_asset_name,
)
from wcoj_assets.steps import (
    batch_schema_check,
    each_epoch,
    epoch_mapping,
    explain_md,
    previous_epoch,
    rows_at,
    schema_check_spec,
    summarize,
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
    partitions: PartitionsDefinition,
) -> Any:
    """``<q>_rule_<atom>``: the output change of one delta rule at the epoch."""
    from wcoj_core.query.explain import explain_rule

    name = rule_asset_name(query.name, atom)
    delta_relation = query.atoms[atom].relation
    text = explain_rule(plan, plan.rules[atom])
    width = len(query.head)
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
        metadata={"explain": explain_md(text)},
    )
    def _rule(context: AssetExecutionContext, wcoj: WcojResource) -> MaterializeResult:
        from wcoj_core.arrangement import relation_trace_name
        from wcoj_core.updates import relation_columns

        history = wcoj.history(queries)
        batches: list[Batch] = []

        def step(t: int) -> dict[str, Any]:
            batch, work = history.derive_rule(query.name, atom, t)
            batches.append(batch)
            return {
                "rows_in": rows_at(history, relation_trace_name(delta_relation), t),
                "rows_proposed": work.proposed,
                "rows_validated": work.validated,
                "rows_out": batch.rows,
                "path": work.path,
            }

        per_epoch = each_epoch(context, step)
        checks = [
            batch_schema_check(history, batches, relation_columns(width), name),
            current_check_result(context, history, name, [e["epoch"] for e in per_epoch]),
        ]
        metadata = {**summarize(per_epoch), "explain": explain_md(text)}
        return MaterializeResult(metadata=metadata, check_results=checks)

    return _rule


def query_deltas_asset(
    *, query: "Query", queries: Sequence["Query"], partitions: PartitionsDefinition
) -> Any:
    """``<q>_deltas``: the rules' outputs at the epoch, summed and consolidated."""
    name = query_deltas_asset_name(query.name)
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
            return {"rows_in": rows_in, "rows_out": batches[-1].rows}

        per_epoch = each_epoch(context, step)
        checks = [
            batch_schema_check(history, batches, relation_columns(len(query.head)), name),
            current_check_result(context, history, name, [e["epoch"] for e in per_epoch]),
        ]
        return MaterializeResult(metadata=summarize(per_epoch), check_results=checks)

    return _query_deltas


def query_asset(
    *, query: "Query", queries: Sequence["Query"], partitions: PartitionsDefinition
) -> Any:
    """``<q>``: the query's accumulated output as of the epoch."""
    name = query.name

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
            return {
                "rows_in": rows_at(history, output_trace_name(query.name), t),
                "rows_out": figures[0],
                "count": figures[1],
            }

        per_epoch = each_epoch(context, step)
        check = current_check_result(context, history, name, [e["epoch"] for e in per_epoch])
        return MaterializeResult(
            metadata=summarize(per_epoch, latest=("rows_out", "count")), check_results=[check]
        )

    return _query
