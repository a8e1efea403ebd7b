"""`WcojComponent`: a ``defs.yaml`` builds the pipeline, and ``dg`` knows the component.

The component is loaded the way a project loads it (Dagster's defs-folder sandbox), and its
definitions are compared with what `build_definitions` gives for the same arguments. ``dg`` (the
dagster-dg-cli of the dev extra) lists the component from the package's entry point and checks
a project's ``defs.yaml`` against its attributes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetKey
from dagster.components.testing import create_defs_folder_sandbox

from wcoj_assets.component import WcojComponent
from wcoj_assets.definitions import JOB_NAME, build_definitions
from wcoj_assets.provenance import REBUILD_SENSOR
from wcoj_assets.specs import QuerySpec
from wcoj_core.errors import WcojError
from wcoj_core.query.builtins import BUILTINS

DG = Path(sys.executable).with_name("dg")
TYPE = "wcoj_assets.component.WcojComponent"
WEDGES = "wedges(a, b, c) :- edge(a, b), edge(b, c), a < c"

ATTRIBUTES: dict[str, Any] = {
    "relations": [{"name": "edge", "arity": 2}],
    "queries": [{"name": "triangles", "query": "triangles"}, {"name": "wedges", "query": WEDGES}],
    "undirected": ["edge"],
    "landing": "/data/landing",
    "storage": "/data/state",
    "start": "2024-03-01",
    "spark_master": "spark://127.0.0.1:7077",
    "spark_conf": {"spark.executor.memory": "2g"},
}


def load(attributes: dict[str, Any]) -> tuple[Any, Any]:
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=WcojComponent,
            defs_yaml_contents={"type": TYPE, "attributes": attributes},
        )
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            return component, defs


def test_a_defs_yaml_builds_what_build_definitions_builds() -> None:
    component, defs = load(ATTRIBUTES)
    assert isinstance(component, WcojComponent)
    expected = build_definitions(
        [
            QuerySpec("triangles", BUILTINS["triangles"], ("edge",)),
            QuerySpec("wedges", WEDGES, ("edge",)),
        ],
        storage="/data/state",
        landing="/data/landing",
        spark_master="spark://127.0.0.1:7077",
        spark_conf={"spark.executor.memory": "2g"},
        start="2024-03-01",
        undirected=["edge"],
    )
    graph, want = defs.resolve_asset_graph(), expected.resolve_asset_graph()
    assert graph.get_all_asset_keys() == want.get_all_asset_keys()
    assert AssetKey("wedges_rule_1") in graph.get_all_asset_keys()
    assert graph.asset_check_keys == want.asset_check_keys
    for node in graph.asset_nodes:
        assert node.partitions_def == want.get(node.key).partitions_def
        assert node.partitions_def.get_first_partition_key() == "2024-03-01"
    assert "Undirected" in (graph.get(AssetKey("edge_deltas")).description or "")
    wcoj = defs.resources["wcoj"]
    assert (wcoj.landing, wcoj.storage, wcoj.master) == (
        "/data/landing",
        "/data/state",
        "spark://127.0.0.1:7077",
    )
    assert wcoj.spark_conf == {"spark.executor.memory": "2g"}
    assert set(defs.resources) == {"wcoj", "wcoj_outputs"}
    assert defs.resolve_job_def(JOB_NAME) is not None
    assert defs.resolve_sensor_def(REBUILD_SENSOR) is not None
    assert defs.resolve_sensor_def("wcoj_landing_sensor") is not None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"relations": [{"name": "edge", "arity": 3}]}, "declared with arity 3"),
        ({"relations": []}, "'edge', which is not declared"),
        (
            {"relations": [{"name": "edge", "arity": 2}, {"name": "other", "arity": 1}]},
            "declared but read by no query",
        ),
        ({"undirected": ["other"]}, "undirected relation 'other' is read by no query"),
        ({"queries": [{"name": "t", "query": "t(a) :- edge(a, b"}]}, "query line 1"),
    ],
)
def test_a_wrong_defs_yaml_is_refused_with_its_reason(change: dict, message: str) -> None:
    with pytest.raises(Exception) as caught:
        load({**ATTRIBUTES, **change})
    chain: list[BaseException] = []
    error: BaseException | None = caught.value
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    reasons = [str(e) for e in chain if isinstance(e, WcojError)]
    assert any(message in reason for reason in reasons), chain


def dg(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if not DG.exists():
        pytest.skip("the dg command (dagster-dg-cli, in the dev extra) is not installed")
    env = {"PATH": f"{DG.parent}:/usr/bin:/bin", "HOME": str(cwd), "NO_COLOR": "1"}
    return subprocess.run(
        [str(DG), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_dg_lists_the_component(tmp_path: Path) -> None:
    out = dg("list", "components", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    found = {entry["key"]: entry for entry in json.loads(out.stdout)["items"]}
    assert TYPE in found, sorted(found)
    assert "kept up to date" in found[TYPE]["summary"]


def project(root: Path, attributes: dict[str, Any]) -> Path:
    """A dg project whose defs folder holds one wcoj component."""
    root.mkdir()
    (root / "dg.toml").write_text(
        'directory_type = "project"\n\n[project]\nroot_module = "edges"\n'
    )
    package = root / "src" / "edges"
    (package / "defs" / "wcoj").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    yaml = json.dumps({"type": TYPE, "attributes": attributes}, indent=2)  # JSON is YAML
    (package / "defs" / "wcoj" / "defs.yaml").write_text(yaml)
    return root


def test_dg_checks_a_defs_yaml(tmp_path: Path) -> None:
    good = dg("check", "yaml", cwd=project(tmp_path / "good", ATTRIBUTES))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "validated successfully" in good.stdout + good.stderr
    wrong = {**ATTRIBUTES, "relations": [{"name": "edge", "arity": "two"}], "stat": "2024-03-01"}
    bad = dg("check", "yaml", cwd=project(tmp_path / "bad", wrong))
    assert bad.returncode != 0
    said = bad.stdout + bad.stderr
    assert "arity" in said and "stat" in said, said
