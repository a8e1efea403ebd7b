"""The pipeline's asset graph with empty bodies: what Dagster itself costs per epoch.

`hollow_definitions` copies a code location's steps — their asset and check specs, dependencies
and partition mappings, partitions, backfill policies, whether they can be subset — into
definitions whose every step does nothing but report: each of its assets materialized, and each
check passed the way the pipeline reports it (`wcoj_assets.checks.report`: one result per check,
and in a run over a range an evaluation of its own for each partition the reporting picks —
failures and recoveries by default, or every evaluated one —, aimed at that partition's
materialization; the binary-join recomputation once at most, at the range's last due epoch). A run of the hollow job over a range of epochs therefore writes the same events as
the real pipeline's run over that range and does no wcoj work at all. `wcoj_bench.parts.backfill` times it beside the real run:
the floor under any per-epoch figure a pipeline of this asset model can reach on the instance
used.

>>> import warnings; warnings.simplefilter("ignore")
>>> from wcoj_assets.definitions import build_definitions
>>> hollow = hollow_definitions(build_definitions())
>>> [a.node_def.name for a in hollow.assets]
['wcoj_epochs']
"""

import datetime as dt
import warnings
from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetCheckKey,
    AssetChecksDefinition,
    AssetExecutionContext,
    AssetsDefinition,
    BetaWarning,
    ConfigurableIOManager,
    Definitions,
    MaterializeResult,
    PreviewWarning,
    asset_check,
    define_asset_job,
    in_process_executor,
    multi_asset,
)

from wcoj_assets.checks import BINARY_JOIN, CheckBook, CheckReporting, Outcome, due, report
from wcoj_assets.instance import hold_connections
from wcoj_assets.resources import CHECK_EVERY

HOLLOW_JOB = "hollow_epoch_job"


def hollow_definitions(
    defs: Definitions,
    check_every: int = CHECK_EVERY,
    reporting: CheckReporting = CheckReporting.AUTO,
) -> Definitions:
    """`defs`' steps and checks with empty bodies, and one job over all of them; checks
    reported as `reporting` says (the pipeline's resource default: ``auto``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        warnings.simplefilter("ignore", PreviewWarning)
        assets = [
            _hollow_assets(a, check_every, reporting)
            for a in defs.assets or ()
            if isinstance(a, AssetsDefinition)
        ]
        checks = [_hollow_check(c) for c in defs.asset_checks or ()]
    # The IO managers the specs name (the pipeline's outputs for downstream readers) store
    # nothing on output: the hollow twin gets ones that do nothing either.
    io_managers = {
        key: _NoIO()
        for a in assets
        for spec in a.specs
        if (key := spec.metadata.get("dagster/io_manager_key")) is not None
    }
    return Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=[define_asset_job(HOLLOW_JOB, description="Every hollow asset and check.")],
        resources=io_managers,
        executor=in_process_executor,
    )


class _NoIO(ConfigurableIOManager):
    """Stores nothing, loads nothing."""

    def handle_output(self, context: Any, obj: Any) -> None:
        pass

    def load_input(self, context: Any) -> Any:
        return None


def _epoch(partitions_def: Any, key: str) -> int:
    """An epoch's number: days from the first partition's day."""
    first = partitions_def.get_first_partition_key()
    return (dt.date.fromisoformat(key) - dt.date.fromisoformat(first)).days


def _topological(real: AssetsDefinition) -> list[Any]:
    """The step's asset keys, each after the ones it depends on (its own previous epoch aside):
    the order Dagster requires a multi-asset to yield them in."""
    deps = {s.key: {d.asset_key for d in s.deps} & set(real.keys) - {s.key} for s in real.specs}
    done: list[Any] = []
    while len(done) < len(deps):
        ready = sorted((k for k, d in deps.items() if k not in done and d <= set(done)), key=str)
        done += ready
    return done


def _hollow_assets(
    real: AssetsDefinition, check_every: int, reporting: CheckReporting
) -> AssetsDefinition:
    keys = _topological(real)
    specs = list(real.check_specs)
    partitions = real.partitions_def

    @multi_asset(
        name=real.node_def.name,
        specs=list(real.specs),
        check_specs=specs,
        partitions_def=partitions,
        backfill_policy=real.backfill_policy,
        can_subset=real.can_subset,
    )
    def _step(context: AssetExecutionContext) -> Iterator[Any]:
        hold_connections(context.instance)  # as the pipeline's step does
        for key in keys:
            yield MaterializeResult(asset_key=key)
        run = list(context.partition_keys)
        due_ones = [p for p in run if due(_epoch(partitions, p), check_every)]
        recomputed = due_ones[-1] if due_ones else None  # a range recomputes once at most
        book = CheckBook()
        for spec in specs:
            for partition in run:
                if spec.name != BINARY_JOIN or partition == recomputed:
                    book.add(AssetCheckKey(spec.asset_key, spec.name), partition, Outcome(True))
        yield from report(context, specs, book, run, reporting)

    return _step


def _hollow_check(real: Any) -> AssetChecksDefinition:
    (spec,) = real.check_specs  # a stand-alone @asset_check defines one check

    @asset_check(
        asset=spec.asset_key,
        name=spec.name,
        partitions_def=spec.partitions_def,
        additional_deps=list(spec.additional_deps),
    )
    def _check() -> Any:
        from dagster import AssetCheckResult

        return AssetCheckResult(passed=True)

    return _check
