"""`WcojComponent`: a ``defs.yaml`` builds the pipeline, and ``dg`` knows the component.

The component is loaded the way a project loads it (Dagster's defs-folder sandbox), and its
definitions are compared with what `build_definitions` gives for the same arguments. Its
``translation`` (as dagster-dbt's: key prefix, group, owners, tags, kinds), ``op`` (name, tags,
pool, backfill policy) and `WcojComponent.get_asset_spec` override point change what they say
and nothing else. ``dg`` (dagster-dg-cli, which the install brings) lists the component from the
package's entry point, scaffolds a ``defs.yaml`` that loads, and checks a project's ``defs.yaml``
against its attributes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import AssetKey, AssetSpec
from dagster.components.testing import create_defs_folder_sandbox

from wcoj_assets.checks import CheckReporting
from wcoj_assets.component import QueryModel, RelationModel, WcojComponent
from wcoj_assets.definitions import build_definitions
from wcoj_assets.graph import AssetInfo
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
    "check_every": 7,
    "name": "graphs",
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
    component, defs = load({**ATTRIBUTES, "check_reporting": "every"})
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
        check_every=7,
        check_reporting="every",
        name="graphs",
    )
    graph, want = defs.resolve_asset_graph(), expected.resolve_asset_graph()
    assert graph.get_all_asset_keys() == want.get_all_asset_keys()
    assert AssetKey("wedges_rule_1") in graph.get_all_asset_keys()
    assert graph.asset_check_keys == want.asset_check_keys
    for node in graph.asset_nodes:
        assert node.partitions_def == want.get(node.key).partitions_def
        assert node.partitions_def.get_first_partition_key() == "2024-03-01"
    assert "Undirected" in (graph.get(AssetKey("edge_deltas")).description or "")
    wcoj = defs.resources["graphs_wcoj"]
    assert (wcoj.landing, wcoj.storage, wcoj.master) == (
        "/data/landing",
        "/data/state",
        "spark://127.0.0.1:7077",
    )
    assert wcoj.spark_conf == {"spark.executor.memory": "2g"}
    assert wcoj.check_every == 7
    assert wcoj.check_reporting is CheckReporting.EVERY
    # Named after the component: nothing of the code location's (no executor, no fixed names).
    assert set(defs.resources) == {"graphs_wcoj", "graphs_outputs"}
    assert defs.executor is None
    (step,) = defs.assets
    assert step.op.name == "graphs_epochs" and step.can_subset
    assert defs.resolve_job_def("graphs_epoch_job") is not None
    assert defs.resolve_sensor_def("graphs_rebuild_sensor") is not None
    assert defs.resolve_sensor_def("graphs_automation_sensor") is not None
    assert defs.resolve_sensor_def("graphs_landing_sensor") is not None


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


def test_relations_meanings_are_configurable() -> None:
    _, defs = load({**ATTRIBUTES, "undirected": [], "sets": ["edge"]})
    description = defs.resolve_asset_graph().get(AssetKey("edge_deltas")).description or ""
    assert "(a set)" in description and "Undirected" not in description
    _, defs = load({**ATTRIBUTES, "bags": ["edge"]})
    description = defs.resolve_asset_graph().get(AssetKey("edge_deltas")).description or ""
    assert "(an undirected bag)" in description
    with pytest.raises(Exception) as caught:
        load({**ATTRIBUTES, "sets": ["edge"], "bags": ["edge"]})
    assert "both a set and a bag" in str(caught.value) + str(caught.value.__cause__)


TRANSLATED = {
    **ATTRIBUTES,
    "op": {
        "name": "graph_epochs",
        "tags": {"team": "graphs"},
        "pool": "wcoj",
        "backfill_policy": {"type": "single_run"},
    },
    "translation": {
        "key_prefix": "graphs",
        "group_name": "wcoj_{{ asset.group }}",
        "owners": ["team:graphs"],
        "tags": {"layer": "{{ asset.role.value }}"},
        "kinds": ["wcoj", "numpy"],
    },
}


def test_translation_and_op_change_what_they_say_and_nothing_else() -> None:
    _, plain = load(ATTRIBUTES)
    _, defs = load(TRANSLATED)
    graph, base = defs.resolve_asset_graph(), plain.resolve_asset_graph()
    prefixed = {k.with_prefix("graphs") for k in base.get_all_asset_keys()}
    assert graph.get_all_asset_keys() == prefixed
    for key in base.get_all_asset_keys():
        node, was = graph.get(key.with_prefix("graphs")), base.get(key)
        assert node.group_name == f"wcoj_{was.group_name}"
        assert node.owners == ["team:graphs"]
        assert node.tags["layer"] in {
            "changes",
            "snapshot",
            "index",
            "counts",
            "rule",
            "query_changes",
            "output",
        }
        assert set(node.kinds) == {"wcoj", "numpy"}
        # The lineage is wcoj's, on the translated keys.
        assert node.parent_keys == {p.with_prefix("graphs") for p in was.parent_keys}
        assert node.partitions_def == was.partitions_def
    assert {(c.asset_key, c.name) for c in graph.asset_check_keys} == {
        (c.asset_key.with_prefix("graphs"), c.name) for c in base.asset_check_keys
    }
    (step,) = defs.assets
    assert step.op.name == "graph_epochs" and step.op.tags["team"] == "graphs"
    assert step.op.pool == "wcoj"
    job = defs.resolve_job_def("graphs_epoch_job")
    assert job.asset_layer.selected_asset_keys == prefixed


class Owned(WcojComponent):
    """A subclass setting attributes in Python."""

    def get_asset_spec(self, spec: AssetSpec, asset: AssetInfo) -> AssetSpec:
        spec = super().get_asset_spec(spec, asset)
        return spec.replace_attributes(owners=[f"team:{asset.role.value}"])


def test_get_asset_spec_is_the_override_point() -> None:
    component = Owned(
        relations=[RelationModel(name="edge", arity=2)],
        queries=[QueryModel(name="triangles", query="triangles")],
    )
    defs = component.build_defs(None)  # type: ignore[arg-type]
    graph = defs.resolve_asset_graph()
    assert graph.get(AssetKey("edge_forward")).owners == ["team:index"]
    assert graph.get(AssetKey("triangles")).owners == ["team:output"]


def test_a_translation_cannot_rewire_the_lineage() -> None:
    with pytest.raises(Exception) as caught:
        load({**ATTRIBUTES, "translation": {"deps": ["somewhere_else"]}})
    assert "wires its assets' lineage" in repr(caught.value) + repr(caught.value.__cause__)


def dg(*args: str, cwd: Path, src: bool = False) -> subprocess.CompletedProcess[str]:
    if not DG.exists():
        pytest.skip("the dg command (dagster-dg-cli, in the dev extra) is not installed")
    env = {"PATH": f"{DG.parent}:/usr/bin:/bin", "HOME": str(cwd), "NO_COLOR": "1"}
    if src:
        env["PYTHONPATH"] = str(cwd / "src")
    return subprocess.run(
        [str(DG), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


K4 = "k4(a, b, c, d) :- edge(a, b), edge(a, c), edge(a, d), edge(b, c), edge(b, d), edge(c, d)"


def test_a_checks_description_names_the_components_own_sensor() -> None:
    _, defs = load({**ATTRIBUTES, "name": "graphs"})
    (spec,) = [
        s
        for a in defs.assets or ()
        for s in getattr(a, "check_specs", ())
        if s.name == "current_history" and s.asset_key == AssetKey("triangles_deltas")
    ]
    assert "`graphs_rebuild_sensor`" in (spec.description or "")
    assert "wcoj_rebuild_sensor" not in (spec.description or "")


def test_a_second_component_over_the_same_relation_is_refused_naming_both_files() -> None:
    """Two components each maintaining a query over ``edge`` define ``edge_deltas`` twice:
    refused with both files and what to do (Dagster alone says ``Duplicate asset key``). The
    second query in ``queries:`` of one component builds, and so do two components with keys
    of their own."""
    one = {"relations": [{"name": "edge", "arity": 2}], "start": "2024-03-01"}
    triangles = {**one, "queries": [{"name": "triangles", "query": "triangles"}]}
    cliques = {**one, "queries": [{"name": "cliques", "query": K4}]}
    with create_defs_folder_sandbox() as sandbox:
        for folder, attributes in (("triangles", triangles), ("cliques", cliques)):
            sandbox.scaffold_component(
                component_cls=WcojComponent,
                defs_path=folder,
                defs_yaml_contents={"type": TYPE, "attributes": attributes},
            )
        with pytest.raises(Exception) as refused, sandbox.build_all_defs():
            pass
        error: BaseException | None = refused.value  # Dagster's, caused by the component's
        while error is not None and not isinstance(error, WcojError):
            error = error.__cause__
        message = str(error)
        for part in (
            "defs/cliques/defs.yaml and ",
            "defs/triangles/defs.yaml both define the assets edge_counts_c0, ",
            "edge_deltas",
            "goes in `queries:` of the component that has the relation",
            "`translation: {key_prefix: ",
        ):
            assert part in message, message
        prefixed = {**cliques, "translation": {"key_prefix": "cliques"}}
        cliques_yaml = sandbox.defs_folder_path / "cliques" / "defs.yaml"
        cliques_yaml.write_text(json.dumps({"type": TYPE, "attributes": prefixed}))
        with sandbox.build_all_defs() as defs:
            assert defs.resolve_asset_graph().has(AssetKey(["cliques", "edge_deltas"]))
    # The README's two queries in one component: one relation's assets, both queries'.
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("**More queries over the same relation**")[1].split("```")[1]
    _, defs = load({**one, **yaml.safe_load(block.removeprefix("yaml\n"))})
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"edge_deltas", "triangles", "cliques"} <= keys


def test_dg_lists_the_component(tmp_path: Path) -> None:
    out = dg("list", "components", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    found = {entry["key"]: entry for entry in json.loads(out.stdout)["items"]}
    assert TYPE in found, sorted(found)
    assert "kept up to date" in found[TYPE]["summary"]


DEFINITIONS_PY = """\
from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
"""


def project(root: Path, attributes: dict[str, Any] | None) -> Path:
    """A dg project (as the quick start lays it out) whose defs folder holds one wcoj
    component, or none yet."""
    root.mkdir()
    (root / "dg.toml").write_text(
        'directory_type = "project"\n\n[project]\nroot_module = "edges"\n'
    )
    package = root / "src" / "edges"
    (package / "defs").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "definitions.py").write_text(DEFINITIONS_PY)
    (package / "defs" / "__init__.py").write_text("")
    if attributes is not None:
        (package / "defs" / "wcoj").mkdir()
        yaml = json.dumps({"type": TYPE, "attributes": attributes}, indent=2)  # JSON is YAML
        (package / "defs" / "wcoj" / "defs.yaml").write_text(yaml)
    return root


def test_dg_scaffolds_a_defs_yaml_that_loads(tmp_path: Path) -> None:
    root = project(tmp_path / "edges", None)
    made = dg("scaffold", "defs", TYPE, "triangles", cwd=root)
    assert made.returncode == 0, made.stdout + made.stderr
    yaml = root / "src" / "edges" / "defs" / "triangles" / "defs.yaml"
    assert f"type: {TYPE}" in yaml.read_text()
    checked = dg("check", "yaml", cwd=root)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    listed = dg("list", "defs", "--json", cwd=root, src=True)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    found = json.loads(listed.stdout)
    keys = {a["asset_key"] for a in found["assets"]}
    assert {"edge_deltas", "edge_forward", "edge_reverse", "triangles"} <= keys, keys


def test_dg_checks_a_defs_yaml(tmp_path: Path) -> None:
    good = dg("check", "yaml", cwd=project(tmp_path / "good", ATTRIBUTES))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "validated successfully" in good.stdout + good.stderr
    wrong = {**ATTRIBUTES, "relations": [{"name": "edge", "arity": "two"}], "stat": "2024-03-01"}
    bad = dg("check", "yaml", cwd=project(tmp_path / "bad", wrong))
    assert bad.returncode != 0
    said = bad.stdout + bad.stderr
    assert "arity" in said and "stat" in said, said
