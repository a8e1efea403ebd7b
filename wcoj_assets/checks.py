"""The correctness check: each query's maintained output against a from-scratch binary-join plan.

For epoch ``t`` the check accumulates every relation as of ``t``, evaluates the query with the
plain Spark SQL of `wcoj_core.reference` and compares the result with the accumulated output as
exact multisets. It runs on every epoch divisible by the resource's ``check_every`` (1 by default,
right for small data; raise it for large data, where a full recomputation per epoch costs more
than the maintenance it checks). On other epochs it passes without work, saying so in its
metadata. For a step covering a range of epochs it checks the last due epoch of the range.
"""

import time as clock
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    asset_check,
)

from wcoj_assets.epochs import Epochs
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import snapshot_asset_name
from wcoj_assets.steps import epochs_of
from wcoj_core.reference import compare, output_columns, reference_output, reference_sql

if TYPE_CHECKING:
    from wcoj_core.query.ir import Query

CORRECTNESS = "matches_binary_join"


def correctness_check(*, query: "Query", queries: Sequence["Query"], epochs: Epochs) -> Any:
    """The `matches_binary_join` check of ``<query>``."""
    sql = reference_sql(query)

    @asset_check(
        asset=query.name,
        name=CORRECTNESS,
        partitions_def=epochs.partitions(),
        additional_deps=[snapshot_asset_name(rel) for rel in query.relations],
        description=(
            f"Recomputes `{query.name}` from the relations as of the epoch with a plain Spark SQL "
            "binary-join plan and compares it with the maintained output as exact multisets "
            "(every epoch divisible by the resource's `check_every`).\n\n"
            f"```sql\n{sql}\n```"
        ),
        compute_kind="spark",
    )
    def _check(context: AssetCheckExecutionContext, wcoj: WcojResource) -> AssetCheckResult:
        run_epochs = epochs_of(context, epochs)
        due = [(key, t) for key, t in run_epochs if t % wcoj.check_every == 0]
        if not due:
            return AssetCheckResult(
                passed=True,
                metadata={
                    "checked": False,
                    "epoch": run_epochs[-1][1],
                    "check_every": wcoj.check_every,
                },
                description=f"not due: checks run on epochs divisible by {wcoj.check_every}",
            )
        key, t = due[-1]
        start = clock.perf_counter()
        history = wcoj.history(queries)
        relations = {rel: history.relation(rel, t) for rel in query.relations}
        expected = reference_output(history.engine.spark, query, relations)
        result = compare(expected, history.output(query.name, t), output_columns(query))
        examples = [f"{tup}: expected {e}, maintained {a}" for tup, e, a in result.examples]
        return AssetCheckResult(
            passed=result.equal,
            metadata={
                "checked": True,
                "epoch": t,
                "partition": key,
                "mismatches": result.mismatches,
                "expected_rows": result.expected_rows,
                "actual_rows": result.actual_rows,
                "expected_count": result.expected_total,
                "actual_count": result.actual_total,
                "examples": examples,
                "seconds": round(clock.perf_counter() - start, 3),
            },
            description=(
                f"{result.mismatches} tuple(s) differ at epoch {t}: " + "; ".join(examples)
                if not result.equal
                else None
            ),
        )

    return _check
