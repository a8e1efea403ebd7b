"""The pipeline's asset graph with empty bodies: what Dagster itself costs per epoch.

`hollow_definitions` copies a code location's assets and asset checks — their keys, steps,
dependencies and partition mappings, partitions, backfill policies and check specs — into
definitions whose every step does nothing but report each of its assets materialized and each of
its checks passed. A run of the hollow job over a range of epochs therefore writes the same
events as the real pipeline's run over that range when nothing in it was stale (the planned
materializations when the run is created, then per step, asset and partition a materialization
and per check one evaluation) and does no wcoj work at all. `wcoj_bench.backfill` times it beside
the real run: the floor under any per-epoch figure a pipeline of this asset model can reach on the
instance used.

>>> import warnings; warnings.simplefilter("ignore")
>>> from wcoj_assets.definitions import build_definitions
>>> hollow = hollow_definitions(build_definitions())
>>> sorted(a.node_def.name for a in hollow.assets)[:3]
['edge_counts_c0', 'edge_counts_c1', 'edge_snapshot']
"""

import warnings
from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetChecksDefinition,
    AssetsDefinition,
    BetaWarning,
    Definitions,
    MaterializeResult,
    PreviewWarning,
    asset_check,
    define_asset_job,
    in_process_executor,
    multi_asset,
)

HOLLOW_JOB = "hollow_epoch_job"


def hollow_definitions(defs: Definitions) -> Definitions:
    """`defs`' assets and checks with empty bodies, and one job over all of them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        warnings.simplefilter("ignore", PreviewWarning)
        assets = [_hollow_assets(a) for a in defs.assets or () if isinstance(a, AssetsDefinition)]
        checks = [_hollow_check(c) for c in defs.asset_checks or ()]
    return Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=[define_asset_job(HOLLOW_JOB, description="Every hollow asset and check.")],
        executor=in_process_executor,
    )


def _hollow_assets(real: AssetsDefinition) -> AssetsDefinition:
    keys = list(real.keys)
    check_keys = [(s.asset_key, s.name) for s in real.check_specs]

    @multi_asset(
        name=real.node_def.name,
        specs=list(real.specs),
        check_specs=list(real.check_specs),
        partitions_def=real.partitions_def,
        backfill_policy=real.backfill_policy,
    )
    def _step() -> Iterator[Any]:
        for key in keys:
            yield MaterializeResult(asset_key=key)
        for key, name in check_keys:
            yield AssetCheckResult(asset_key=key, check_name=name, passed=True)

    return _step


def _hollow_check(real: Any) -> AssetChecksDefinition:
    (spec,) = real.check_specs  # each of the pipeline's @asset_check defines one check

    @asset_check(
        asset=spec.asset_key,
        name=spec.name,
        partitions_def=spec.partitions_def,
        additional_deps=list(spec.additional_deps),
    )
    def _check() -> AssetCheckResult:
        return AssetCheckResult(passed=True)

    return _check
