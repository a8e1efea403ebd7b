"""The hollow twin of the pipeline: the same asset graph, checks and partitions, empty bodies."""

from __future__ import annotations

import doctest
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetsDefinition, BetaWarning, Definitions, PreviewWarning

from wcoj_assets.definitions import build_definitions
from wcoj_assets.instance import dagster_env
from wcoj_assets.specs import QuerySpec
from wcoj_bench.infra import hollow
from wcoj_bench.parts import backfill_sides as bb
from wcoj_core.query.builtins import BUILTINS


def _shape(defs: Definitions) -> dict[str, object]:
    """Everything of a code location's assets and checks that decides what a run records."""
    assets = [a for a in defs.assets or () if isinstance(a, AssetsDefinition)]
    steps = {
        a.node_def.name: (
            sorted(k.to_user_string() for k in a.keys),
            sorted(
                (s.key.to_user_string(), d.asset_key.to_user_string(), repr(d.partition_mapping))
                for s in a.specs
                for d in s.deps
            ),
            sorted((c.asset_key.to_user_string(), c.name) for c in a.check_specs),
            repr(a.partitions_def),
            repr(a.backfill_policy),
            a.can_subset,
        )
        for a in assets
    }
    checks = sorted(
        (s.asset_key.to_user_string(), s.name, repr(s.partitions_def), repr(s.additional_deps))
        for c in defs.asset_checks or ()
        for s in c.check_specs
    )
    return {"steps": steps, "checks": checks}


def test_doctests() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        warnings.simplefilter("ignore", PreviewWarning)
        result = doctest.testmod(hollow)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize(
    "specs",
    [
        None,
        [
            QuerySpec("triangles", BUILTINS["triangles"], ("edge",)),
            QuerySpec("cycles4", BUILTINS["4-cycles"], ("edge",)),
        ],
    ],
    ids=["default", "two-queries"],
)
def test_the_twin_has_the_pipelines_shape(specs: list[QuerySpec] | None) -> None:
    real = build_definitions() if specs is None else build_definitions(specs)
    twin = hollow.hollow_definitions(real)
    assert _shape(twin) == _shape(real)
    assert len(_shape(real)["steps"]) > 0  # type: ignore[arg-type]


def test_a_floor_that_writes_other_events_than_the_pipeline_is_refused(tmp_path: Path) -> None:
    said: list[str] = []
    with pytest.raises(
        bb.BackfillError,
        match=r"^floor: the hollow run wrote \{.materializations.: 11, .check_evaluations.: 8\}",
    ):
        bb.run_hollow(tmp_path, 1, {"materializations": 10, "check_evaluations": 9}, said.append)
    assert said and "empty bodies" in said[0]


@pytest.mark.e2e  # a Postgres server
def test_the_floor_on_postgres_is_stored_there_and_its_server_stopped(tmp_path: Path) -> None:
    """``--instance postgres``: the floor's runs go to a server of their own, with the Dagster
    settings, and the server and its temporary folder are gone after."""
    from dagster import DagsterInstance

    said: list[str] = []
    seen: list[tuple[str, dict[str, str], str]] = []
    make = bb.bench_instance

    @contextmanager
    def watched(*args: Any) -> Iterator[DagsterInstance]:
        with make(*args) as instance:
            settings = {k: os.environ.get(k, "") for k in dagster_env()}
            seen.append(
                (type(instance.event_log_storage).__name__, settings, instance.root_directory)
            )
            yield instance

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bb, "bench_instance", watched)
        side = bb.run_hollow(
            tmp_path,
            2,
            # 4 checks per epoch, each its own; and each check's result of the range
            {"materializations": 22, "check_evaluations": 12},
            said.append,
            bb.InstanceKind.POSTGRES,
        )
    assert side.range_seconds > 0
    ((storage, settings, home),) = seen
    assert storage == "PostgresEventLogStorage" and settings == dagster_env()
    assert any(line.startswith("postgres: serving on port") for line in said)
    assert not Path(home).parent.exists()  # the server's folder, removed once it stopped
    assert not (tmp_path / "dagster-hollow").exists()  # nothing of SQLite's
