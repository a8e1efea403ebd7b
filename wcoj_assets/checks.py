"""The pipeline's checks, and how their results reach Dagster (docs/dagster.md lists them).

Per epoch partition: ``update_triples`` on each ``<rel>_deltas`` (the landed files, before
anything is applied: bad rows named, pandera's check, something landed), ``non_negative`` on
each ``<rel>_snapshot`` (blocking), ``current_history`` and ``matches_delta_rules``
(`wcoj_core.audit`, sampled on a large epoch: `wcoj_core.audit_sample`) on each ``<q>_deltas``;
without partitions, ``matches_binary_join`` on each output (`wcoj_core.reference`), run on one
epoch in ``check_every`` (`due`), on a run's last epoch when the run selects it, or when its op
config says ``binary_join: true``.

In a run over a range, only an `AssetCheckEvaluation` carrying the partition fills that
partition's row; `CheckReporting` chooses which are written: ``every``, ``news`` (failures and
recoveries, the rest summarized) or ``auto`` (``every`` up to `PER_PARTITION_LIMIT` epochs). A
check not evaluated at a partition reports nothing there (SKIPPED, never passed).
"""

from __future__ import annotations

import time as clock
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from wcoj_assets.graph import EpochGraph, Role

if TYPE_CHECKING:
    from wcoj_core.engine import Engine
    from wcoj_core.query.ir import Query

UPDATE_TRIPLES = "update_triples"
NON_NEGATIVE = "non_negative"
CURRENT = "current_history"
DELTA_RULES = "matches_delta_rules"
BINARY_JOIN = "matches_binary_join"
EXAMPLES = 20
# The most bad rows of an epoch's landed files one run lists.
BAD_ROWS = 100


# A run over at most this many epochs gives every partition its own check evaluations by default.
PER_PARTITION_LIMIT = 100


class CheckReporting(Enum):
    """Which partitions of a run over a range get a check evaluation of their own (see the
    module): every evaluated partition, failures and recoveries, or (auto) every one for ranges
    of at most `PER_PARTITION_LIMIT` epochs."""

    AUTO = "auto"
    NEWS = "news"
    EVERY = "every"

    def for_range(self, epochs: int) -> CheckReporting:
        """What `AUTO` means for a range of `epochs`; the others as they are.

        >>> CheckReporting.AUTO.for_range(100), CheckReporting.AUTO.for_range(101)
        (<CheckReporting.EVERY: 'every'>, <CheckReporting.NEWS: 'news'>)
        """
        if self is not CheckReporting.AUTO:
            return self
        return CheckReporting.EVERY if epochs <= PER_PARTITION_LIMIT else CheckReporting.NEWS


def check_specs(graph: EpochGraph, rebuild_sensor: str) -> list[AssetCheckSpec]:
    """The checks of `graph` (see the module), on its translated keys; `rebuild_sensor` names
    the pipeline's rebuild sensor."""
    partitions = graph.epochs.partitions()
    specs: list[AssetCheckSpec] = []
    for info in graph.of_role(Role.CHANGES):
        specs.append(
            AssetCheckSpec(
                UPDATE_TRIPLES,
                asset=graph.key(info.name),
                partitions_def=partitions,
                description="The landed files of the epoch, checked before anything is applied: "
                "every row readable (the bad rows listed with file, line and column, up to "
                f"{BAD_ROWS}), long non-null columns, diff != 0 (pandera); and something landed "
                "(an epoch with no folder fails, naming it, unless empty epochs are declared "
                "normal). A failure applies nothing and fails only this check.",
            )
        )
    for info in graph.of_role(Role.SNAPSHOT):
        specs.append(
            AssetCheckSpec(
                NON_NEGATIVE,
                asset=graph.key(info.name),
                blocking=True,
                partitions_def=partitions,
                description="No tuple is held a negative number of times as of the epoch (a "
                "deletion of something absent from a bag); reports the offending tuples.",
            )
        )
    for info in graph.of_role(Role.QUERY_CHANGES):
        key = graph.key(info.name)
        specs += [
            AssetCheckSpec(
                CURRENT,
                asset=key,
                partitions_def=partitions,
                description="The partition was derived from the relations' history as it is "
                "now: no epoch up to it was corrected since. After a corrected epoch is re-run, "
                "every later partition is reported failed until it is rebuilt (the rebuild "
                f"sensor `{rebuild_sensor}` does it, or a backfill from that epoch).",
            ),
            AssetCheckSpec(
                DELTA_RULES,
                asset=key,
                partitions_def=partitions,
                description="The epoch's output change recomputed by an independent evaluation "
                "of the query's delta rules (other code, other joins) over the stored "
                "relations, and compared as exact multisets, with the output's figures checked "
                "exactly: every tuple of a small epoch, a random sample of a large one (each "
                "sampled tuple recomputed whole; its chance of finding a wrong tuple is in the "
                "metadata), so its cost stays about the epoch's own.",
            ),
        ]
    for info in graph.of_role(Role.OUTPUT):
        specs.append(
            AssetCheckSpec(
                BINARY_JOIN,
                asset=graph.key(info.name),
                description=f"Recomputes `{info.query}` from the relations as of one epoch with a "
                "plain Spark SQL binary-join plan (`wcoj_core.reference`; the SQL is in each "
                "evaluation's metadata) and compares it with the maintained output as exact "
                "multisets. Its status is the latest recomputation's (its epoch and partition "
                "are in the metadata): the epoch job runs it on one epoch in every `check_every` "
                "(the resource's; a run over a range: its last due epoch); the verify job, a "
                "run that selects it and op config `binary_join: true` run it on the run's "
                "last epoch.",
            )
        )
    return specs


@dataclass(frozen=True)
class Outcome:
    """One check evaluated at one partition."""

    passed: bool
    metadata: Mapping[str, Any] = field(default_factory=dict)
    description: str | None = None


@dataclass
class CheckBook:
    """Every check outcome of a run, by check and partition: a partition of several epochs
    keeps its first failure, else its last outcome."""

    outcomes: dict[AssetCheckKey, dict[str, Outcome]] = field(default_factory=dict)

    def add(self, key: AssetCheckKey, partition: str, outcome: Outcome) -> None:
        known = self.outcomes.setdefault(key, {})
        if partition not in known or known[partition].passed:
            known[partition] = outcome

    def get(self, key: AssetCheckKey, partition: str) -> Outcome | None:
        return self.outcomes.get(key, {}).get(partition)


# -- the checks ------------------------------------------------------------------------------------


def non_negative(
    relation: str, epoch: int, negative: int, examples: Sequence[tuple[Any, int]] = ()
) -> Outcome:
    """A relation as of `epoch` holds no tuple a negative number of times (`negative` tuples
    do; a few of them with their multiplicity in `examples`)."""
    offending = [f"epoch {epoch}: {t} has multiplicity {m}" for t, m in examples]
    return Outcome(
        negative == 0,
        {"negative_tuples": negative, "offending": offending[:EXAMPLES]},
        None
        if negative == 0
        else f"{negative} tuple(s) with a negative multiplicity: " + "; ".join(offending[:5]),
    )


def delta_rules(engine: Engine, query: str, epoch: int, full: bool = False) -> Outcome:
    """`wcoj_core.audit_sample.audit_epoch` in its default mode (every tuple of a small epoch, a
    sample of a large one), or with `full` every tuple whatever it costs."""
    from wcoj_core.audit import AuditMode
    from wcoj_core.audit_sample import audit_epoch

    since = engine.served.since(query)
    if since is not None and epoch < since:  # a query attached later (wcoj_core.attach)
        note = f"{query} was attached at epoch {since}: the state keeps no change of it before"
        return Outcome(True, {"checked": False, "note": note}, f"not evaluated: {note}")
    try:
        audit = audit_epoch(engine, query, epoch, AuditMode.FULL if full else AuditMode.SAMPLED)
    except Exception as e:  # a check that cannot run fails, saying why
        return Outcome(
            False, {"checked": True, "error": f"{type(e).__name__}: {e}"}, f"the audit failed: {e}"
        )
    examples = [str(e) for e in audit.examples][:EXAMPLES]
    return Outcome(
        bool(audit.passed),
        {
            "checked": True,
            "mismatches": int(audit.mismatches),
            "expected_rows": int(audit.expected_rows),
            "actual_rows": int(audit.actual_rows),
            "joined_rows": int(audit.joined_rows),
            "seconds": round(float(audit.seconds), 4),
            "examples": examples,
            "mode": audit.mode,
            "chance_to_find_a_wrong_tuple": round(float(audit.catch), 6),
            "chance_to_find_a_missing_or_extra_tuple": round(float(audit.catch_sum), 6),
            "can_miss": audit.misses,
            "figures": audit.figures,
            "method": audit.method,
        },
        None
        if audit.passed
        else (
            f"{audit.mismatches} tuple(s) differ at epoch {epoch}"
            + (f"; {audit.figures}" if audit.figures != "ok" else "")
            + ": "
            + "; ".join(examples[:5])
        ),
    )


def binary_join(engine: Engine, query: Query, epoch: int, partition: str) -> Outcome:
    """The full Spark SQL recomputation of `query` as of `epoch` against the maintained output."""
    from dagster import MetadataValue

    from wcoj_core.reference import compare, output_columns, reference_output, reference_sql

    start = clock.perf_counter()
    spark = engine.spark(f"the binary-join check of {query.name} at epoch {epoch}")
    relations = {rel: engine.relation(rel, epoch) for rel in query.relations}
    expected = reference_output(spark, query, relations)
    result = compare(expected, engine.output(query.name, epoch), output_columns(query))
    examples = [f"{tup}: expected {e}, maintained {a}" for tup, e, a in result.examples]
    return Outcome(
        result.equal,
        {
            "checked": True,
            "epoch": str(epoch),
            "partition": partition,
            "mismatches": result.mismatches,
            "expected_rows": result.expected_rows,
            "actual_rows": result.actual_rows,
            "expected_count": result.expected_total,
            "actual_count": result.actual_total,
            "examples": examples,
            "seconds": round(clock.perf_counter() - start, 3),
            "sql": MetadataValue.md(f"```sql\n{reference_sql(query)}\n```"),
        },
        None
        if result.equal
        else f"{result.mismatches} tuple(s) differ at epoch {epoch}: " + "; ".join(examples),
    )


def due(epoch: int, every: int) -> bool:
    """Whether the binary-join recomputation runs at `epoch`: one epoch in every `every`, the
    last of each group (so the bulk load of epoch 0 is recomputed only when every epoch is).

    >>> [t for t in range(8) if due(t, 3)], [t for t in range(3) if due(t, 1)]
    ([2, 5], [0, 1, 2])
    """
    return (epoch + 1) % every == 0


# -- reporting -------------------------------------------------------------------------------------


def report(
    context: Any,
    specs: Sequence[AssetCheckSpec],
    book: CheckBook,
    run_partitions: Sequence[str],
    reporting: CheckReporting = CheckReporting.AUTO,
) -> Iterator[AssetCheckResult | AssetCheckEvaluation]:
    """Every check's results of a run (see the module): in a one-partition run an `AssetCheckResult`
    per check evaluated; in a range run an `AssetCheckEvaluation` per partition `reporting`
    picks and the range's summary as the result; evaluations of checks the run did not select and of
    partitions outside the run; the binary join's one evaluation, its partition in the metadata."""
    single = bool(context.has_partition_key)
    unpartitioned = not single and not context.has_partition_key_range  # a check's Execute
    reporting = reporting.for_range(len(run_partitions))
    selected = set(context.selected_asset_check_keys)
    partitioned = {spec.key for spec in specs if spec.partitions_def is not None}
    own: dict[AssetCheckKey, list[str]] = {
        key: _own(
            context.instance,
            key,
            book.outcomes[key],
            run_partitions,
            single and key in selected,
            reporting if key in selected else CheckReporting.EVERY,
        )
        if key in partitioned
        else list(book.outcomes[key])[-1:]
        for key in {spec.key for spec in specs} & set(book.outcomes)
    }
    wanted: dict[AssetKey, set[str]] = {}
    for key, partitions in own.items():
        wanted.setdefault(key.asset_key, set()).update(partitions)
    targets = {
        asset: latest_materializations(context.instance, asset, sorted(partitions))
        for asset, partitions in wanted.items()
    }
    for spec in specs:
        key, whole = spec.key, spec.key not in partitioned
        outcomes = book.outcomes.get(key, {})
        ours = [(p, outcomes[p]) for p in run_partitions if p in outcomes]
        apart: list[str | None] = list(own.get(key, []))
        if key in selected and ours and unpartitioned and not whole:
            # The run's own row (no partition: an AssetCheckResult cannot find its target there).
            apart.append(None)
        elif key in selected and (outcomes if whole else ours) and not unpartitioned:
            # The run's result of the check, which Dagster counts as the check's output.
            named = [p for p in apart if p is not None]  # no run's own row on this branch
            if whole or single:
                last = outcomes[named[-1]] if whole else ours[-1][1]
                yield AssetCheckResult(
                    asset_key=key.asset_key,
                    check_name=key.name,
                    passed=last.passed,
                    metadata=dict(last.metadata),
                    description=last.description,
                )
                apart = [] if whole else apart
            else:
                yield _summary(key, ours, named, reporting)
        for partition in apart:
            at = partition if partition is not None else ours[-1][0]
            outcome = outcomes[at]
            yield AssetCheckEvaluation(
                asset_key=key.asset_key,
                check_name=key.name,
                passed=outcome.passed,
                partition=None if whole else partition,
                metadata=dict(outcome.metadata),
                description=outcome.description,
                target_materialization_data=targets.get(key.asset_key, {}).get(at),
                blocking=spec.blocking,
                severity=AssetCheckSeverity.ERROR,
            )


def _own(
    instance: Any,
    key: AssetCheckKey,
    outcomes: Mapping[str, Outcome],
    run_partitions: Sequence[str],
    single: bool,
    reporting: CheckReporting,
) -> list[str]:
    """The partitions of one check that get an evaluation of their own, sorted: those outside
    the run; in a run of one partition that selected the check, no other; else the evaluated
    partitions `reporting` picks (``news``: failures and recoveries)."""
    in_run = set(run_partitions)
    checked = sorted(outcomes)
    if single:
        return [p for p in checked if p not in in_run]
    if reporting is not CheckReporting.NEWS:
        return checked
    passed = [p for p in checked if p in in_run and outcomes[p].passed]
    recovered = latest_failed(instance, key, passed) if passed else set()
    return [p for p in checked if p not in passed or p in recovered]


def _summary(
    key: AssetCheckKey,
    outcomes: Sequence[tuple[str, Outcome]],
    own: Sequence[str],
    reporting: CheckReporting,
) -> AssetCheckResult:
    """A range run's result of one check: what its partitions say, in short."""
    failed = [p for p, o in outcomes if not o.passed]
    metadata: dict[str, Any] = {
        "partitions": f"{outcomes[0][0]}..{outcomes[-1][0]}" if outcomes else "",
        "evaluated": len(outcomes),
        "passed": len(outcomes) - len(failed),
        "failed": failed[:EXAMPLES],
        "reported per partition": len(own),
    }
    seconds = [o.metadata["seconds"] for _, o in outcomes if "seconds" in o.metadata]
    if seconds:
        metadata["seconds"] = round(sum(float(x) for x in seconds), 4)
    if failed:
        description = (
            f"failed at {len(failed)} partition(s): {', '.join(failed[:5])}; each failing "
            "partition carries its own result"
        )
    elif reporting is CheckReporting.NEWS:
        description = (
            f"passed at every partition evaluated ({len(outcomes)}, {metadata['partitions']}); "
            f"reported per partition: {len(own)} (failures and recoveries only: the others "
            "show SKIPPED in this run, passing)"
        )
    else:
        description = (
            f"passed at every partition of the run ({len(outcomes)}, "
            f"{metadata['partitions']}), each with its own evaluation"
        )
    return AssetCheckResult(
        asset_key=key.asset_key,
        check_name=key.name,
        passed=not failed,
        metadata=metadata,
        description=description,
    )


def latest_failed(instance: Any, check: AssetCheckKey, keys: Sequence[str]) -> set[str]:
    """The partitions among `keys` whose latest evaluation of `check` failed: the failed evaluations
    (few), newest first, then per failing partition whether a pass came later; planned ones skipped.
    """
    from dagster._core.event_api import PartitionKeyFilter
    from dagster._core.storage.asset_check_execution_record import (
        AssetCheckExecutionRecordStatus as Status,
    )

    storage = instance.event_log_storage
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


def latest_materializations(
    instance: Any, asset: AssetKey, partitions: Iterable[str]
) -> dict[str, AssetCheckEvaluationTargetMaterializationData]:
    """Each partition's latest materialization (storage id, run, time), for those that have one:
    two queries however many partitions."""
    keys = set(partitions)
    if not keys:
        return {}
    ids = instance.event_log_storage.get_latest_storage_id_by_partition(
        asset, DagsterEventType.ASSET_MATERIALIZATION, keys
    )
    if not ids:
        return {}
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=asset, storage_ids=list(ids.values())), limit=len(ids)
    ).records
    by_id = {r.storage_id: r for r in records}
    return {
        partition: AssetCheckEvaluationTargetMaterializationData(
            storage_id=i, run_id=by_id[i].run_id, timestamp=by_id[i].timestamp
        )
        for partition, i in ids.items()
        if i in by_id
    }
