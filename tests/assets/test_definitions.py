"""The code location: cheap to import, valid for Dagster, and wired as the issue describes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    BackfillPolicy,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    TimeWindowPartitionMapping,
)

from wcoj_assets.definitions import JOB_NAME, build_definitions
from wcoj_assets.epochs import EPOCH_START, epoch_key, epoch_number, epoch_partitions
from wcoj_assets.specs import QuerySpec
from wcoj_core.errors import InputError, QueryError
from wcoj_core.query.builtins import BUILTINS

BIN = Path(sys.executable).parent

IMPORT_PROBE = """
import json, os, sys
before = sorted(os.listdir("."))
import wcoj_assets.definitions as d
from pyspark import SparkContext
print(json.dumps({
    "files": sorted(os.listdir(".")) == before,
    "jvm": SparkContext._gateway is not None,
    "session": SparkContext._active_spark_context is not None,
    "pandera": "pandera" in sys.modules,
    "type": type(d.defs).__name__,
}))
"""


def test_importing_the_definitions_has_no_side_effects(tmp_path: Path) -> None:
    env = {"PATH": str(BIN), "HOME": str(tmp_path), "WCOJ_STORAGE": "/nonexistent"}
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe == {
        "files": True,
        "jvm": False,
        "session": False,
        "pandera": False,
        "type": "Definitions",
    }
    assert list(tmp_path.iterdir()) == []


def test_dagster_validates_the_code_location(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate", "-m", "wcoj_assets.definitions"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Validation successful" in out.stdout + out.stderr


def test_the_default_spec_builds_the_documented_assets() -> None:
    defs = build_definitions()
    graph = defs.resolve_asset_graph()
    names = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert names == {
        "edge_deltas",
        "edge_snapshot",
        "edge_counts_c0",
        "edge_counts_c1",
        "triangles_rule_0",
        "triangles_rule_1",
        "triangles_rule_2",
        "triangles_deltas",
        "triangles",
    }
    job = defs.resolve_job_def(JOB_NAME)
    assert {k.to_user_string() for k in job.asset_layer.selected_asset_keys} == names
    checks = {(c.asset_key.to_user_string(), c.name) for c in graph.asset_check_keys}
    assert ("triangles", "matches_binary_join") in checks
    assert ("edge_snapshot", "non_negative") in checks
    assert {a for a, name in checks if name == "update_triples"} == names - {
        "edge_snapshot",
        "triangles",
    }
    # Everything derived from the changes says whether it is current with corrected history.
    assert {a for a, name in checks if name == "current_history"} == names - {
        "edge_deltas",
        "edge_snapshot",
    }
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.partitions_def == epoch_partitions()
        assert node.backfill_policy == BackfillPolicy.single_run()
    assert defs.resolve_sensor_def("wcoj_landing_sensor").default_status is (
        DefaultSensorStatus.RUNNING
    )
    assert defs.resolve_schedule_def("wcoj_daily_schedule").default_status is (
        DefaultScheduleStatus.STOPPED
    )


def offsets(graph, child: str, parent: str) -> tuple[int, int]:
    """The epochs of `parent` that `child` at epoch t reads, relative to t."""
    mapping = graph.get_partition_mapping(AssetKey(child), AssetKey(parent))
    assert isinstance(mapping, TimeWindowPartitionMapping)
    if mapping.start_offset < 0:  # epoch 0 has no predecessor, and needs none
        assert mapping.allow_nonexistent_upstream_partitions
    return (mapping.start_offset, mapping.end_offset)


def test_rules_read_new_atoms_at_the_epoch_and_old_atoms_before_it() -> None:
    graph = build_definitions().resolve_asset_graph()
    for self_dependent in ("edge_snapshot", "edge_counts_c0", "edge_counts_c1", "triangles"):
        assert offsets(graph, self_dependent, self_dependent) == (-1, -1)
    # rule 0 reads atoms 1 and 2 old; rule 2 reads atoms 0 and 1 new; rule 1 both.
    assert offsets(graph, "triangles_rule_0", "edge_snapshot") == (-1, -1)
    assert offsets(graph, "triangles_rule_2", "edge_snapshot") == (0, 0)
    assert offsets(graph, "triangles_rule_1", "edge_snapshot") == (-1, 0)
    for i in range(3):
        assert offsets(graph, f"triangles_rule_{i}", "edge_deltas") == (0, 0)
    parents = {p.to_user_string() for p in graph.get(AssetKey("triangles_rule_0")).parent_keys}
    assert "triangles" not in parents and "triangles_deltas" not in parents  # no earlier outputs


def test_arrangements_are_shared_across_queries() -> None:
    specs = [
        QuerySpec("triangles", BUILTINS["triangles"], ("edge",)),
        QuerySpec("cycles4", BUILTINS["4-cycles"], ("edge",)),
    ]
    graph = build_definitions(specs).resolve_asset_graph()
    counts = sorted(
        k.to_user_string() for k in graph.get_all_asset_keys() if "_counts_" in k.to_user_string()
    )
    assert counts == ["edge_counts_all", "edge_counts_c0", "edge_counts_c1"]
    readers = {c.to_user_string() for c in graph.get(AssetKey("edge_counts_c0")).child_keys}
    assert {r.split("_rule_")[0] for r in readers if "_rule_" in r} == {"triangles", "cycles4"}


@pytest.mark.parametrize(
    "specs, message",
    [
        ([QuerySpec("t", BUILTINS["triangles"], ("edges",))], "declares relations"),
        ([QuerySpec("edge_snapshot", BUILTINS["2-paths"], ("edge",))], "is used for both"),
        ([QuerySpec("a", BUILTINS["2-paths"], ("edge",))] * 2, "share a name"),
        ([], "no query specs"),
    ],
)
def test_bad_specs_are_refused_with_a_clear_message(specs, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        build_definitions(specs)


def test_epoch_keys_round_trip() -> None:
    assert epoch_key(0) == EPOCH_START
    for n in (0, 1, 59, 60, 366, 5000):
        assert epoch_number(epoch_key(n)) == n
    keys = epoch_partitions().get_partition_keys()
    assert keys[:3] == [epoch_key(0), epoch_key(1), epoch_key(2)]
    with pytest.raises(InputError):
        epoch_key(-1)


def test_storage_from_an_env_var_is_read_at_run_time_only(monkeypatch) -> None:
    from dagster import EnvVar

    monkeypatch.delenv("WCOJ_TEST_STORAGE", raising=False)
    defs = build_definitions(storage=EnvVar("WCOJ_TEST_STORAGE"), landing="/data/landing")
    resource = defs.resources["wcoj"]
    assert resource.landing == "/data/landing"
    monkeypatch.setenv("WCOJ_TEST_STORAGE", "/data/state")
    assert resource.process_config_and_initialize().storage == "/data/state"
