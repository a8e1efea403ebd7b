"""Queries sharing one state in Dagster (`wcoj_core.attach`): a second pipeline over the same
relation and the same storage shares its arrangements (its query attached to the state, made
from them), a query added to a running pipeline is attached at its next run, and a user's asset
asks the state a question through the resource (`WcojResource.ask`). Every output equals the
oracle's; no JVM starts (local files, the binary-join check off the cadence).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import dagster as dg
import pyarrow as pa
from oracle import naive_eval
from wcoj_support import set_edges, updates, write_landing

from wcoj_assets.definitions import build_definitions
from wcoj_assets.instance import dagster_settings
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import QuerySpec
from wcoj_core.query.builtins import BUILTINS, builtin
from wcoj_core.state_read import read_table
from wcoj_core.store.store import Store
from wcoj_core.traces import output_trace_name

START = "2024-03-01"
EPOCHS = 3


def pipeline(
    root: Path, name: str, specs: list[QuerySpec], prefix: str | None = None
) -> dg.JobDefinition:
    def translate(spec: dg.AssetSpec, _info: object) -> dg.AssetSpec:
        return spec.replace_attributes(key=spec.key.with_prefix(prefix)) if prefix else spec

    defs = build_definitions(
        specs,
        name=name,
        storage=str(root / "state"),
        landing=str(root / "landing"),
        start=START,
        undirected=["edge"],
        check_every=1000,
        translate=translate,
    )
    return defs.resolve_job_def(f"{name}_epoch_job")


def run(job: dg.JobDefinition, instance: dg.DagsterInstance, n: int) -> None:
    with dagster_settings():
        result = job.execute_in_process(
            instance=instance, partition_key=f"2024-03-0{n + 1}", raise_on_error=False
        )
    assert result.success, [e.message for e in result.all_events if e.is_failure]


def test_two_pipelines_over_one_storage_share_the_relation(tmp_path: Path) -> None:
    """triangles, then 4-cliques in a second pipeline (its own keys) pointed at the same
    storage and landing: one relation trace and one set of arrangements; each output exact
    at every epoch, whichever pipeline ran the epoch first."""
    edges = updates(seed=61, epochs=EPOCHS)
    for n in range(EPOCHS):
        write_landing(tmp_path / "landing", n, edges[n], "csv", start=START)
    tri = pipeline(tmp_path, "tri", [QuerySpec("triangles", BUILTINS["triangles"], ("edge",))])
    k4 = pipeline(tmp_path, "k4", [QuerySpec("cliques", BUILTINS["4-cliques"], ("edge",))], "k4")
    with dg.DagsterInstance.ephemeral() as instance:
        run(tri, instance, 0)
        run(tri, instance, 1)
        run(k4, instance, 1)  # attached at epoch 1, then epoch 1 applied again
        run(k4, instance, 2)  # both queries at epoch 2
        run(tri, instance, 2)
    m = Store.open(tmp_path / "state", create=False).current()
    assert m.plan is not None and m.plan.queries["cliques"].since == 1
    assert sorted(n for n in m.traces if n.startswith("rel/")) == ["rel/edge"]
    resource = WcojResource(storage=str(tmp_path / "state"))
    for n in range(EPOCHS):
        relation = {"edge": set_edges(edges, n)}
        expect = naive_eval(builtin("triangles"), relation)
        assert _read(resource, "triangles", n) == expect, n
        if n >= 1:
            k = builtin("4-cliques")
            assert _read(resource, "cliques", n) == naive_eval(k, relation), n
    # A user's asset, a notebook: any question, answered from the arrangements.
    got = resource.ask(
        "t(v, count()) :- edge(v, b), edge(b, c), edge(v, c), b < c", bind={"v": [1, 2, 3]}
    )
    assert isinstance(got, pa.Table) and got.column_names == ["v", "count"]
    per = builtin("triangles-per-vertex")
    want = naive_eval(per, {"edge": set_edges(edges, EPOCHS - 1)})
    assert {(r["v"],): r["count"] for r in got.to_pylist()} == {
        k: v for k, v in want.items() if k[0] in (1, 2, 3)
    }
    assert resource.ask("triangles", epoch=0).num_rows == len(
        naive_eval(builtin("triangles"), {"edge": set_edges(edges, 0)})
    )


def test_a_query_added_to_a_running_pipeline_is_attached_at_its_next_run(tmp_path: Path) -> None:
    edges = updates(seed=62, epochs=EPOCHS)
    for n in range(EPOCHS):
        write_landing(tmp_path / "landing", n, edges[n], "csv", start=START)
    specs = [QuerySpec("triangles", BUILTINS["triangles"], ("edge",))]
    with dg.DagsterInstance.ephemeral() as instance:
        run(pipeline(tmp_path, "g", specs), instance, 0)
        more = [*specs, QuerySpec("per", BUILTINS["triangles-per-vertex"], ("edge",))]
        run(pipeline(tmp_path, "g", more), instance, 1)
        run(pipeline(tmp_path, "g", more), instance, 2)
    m = Store.open(tmp_path / "state", create=False).current()
    assert m.plan is not None and m.plan.queries["per"].since == 0
    resource = WcojResource(storage=str(tmp_path / "state"))
    for n in range(EPOCHS):
        want = naive_eval(builtin("triangles-per-vertex"), {"edge": set_edges(edges, n)})
        assert _read(resource, "per", n) == want, n


def _read(resource: WcojResource, query: str, epoch: int) -> Counter:
    """A query's output as of an epoch, read with pyarrow from the state's batches."""
    from wcoj_core.served import StateAccess
    from wcoj_core.session import starter_of

    access = StateAccess.open(resource.storage_path(), starter_of(None), create=False)
    table = read_table(access, output_trace_name(query), epoch)
    return Counter(
        {tuple(r[c] for c in table.column_names[:-1]): r["diff"] for r in table.to_pylist()}
    )
