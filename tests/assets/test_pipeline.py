"""The Dagster pipeline end to end: epochs run in-process against the naive oracle.

One scenario (two queries sharing the `edge` arrangements, four epochs landed as CSV, Parquet, a
SNAP edge list and a two-file folder) is processed epoch by epoch through ``wcoj_epoch_job``, one
run per epoch as the sensor requests them. The tests then read it, and the later ones change it
in ways that must either leave it as it was (bad data) or end where a from-scratch computation
ends (a repaired output, a corrected epoch): they run in file order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterRun,
    DagsterRunStatus,
    RunRequest,
    build_sensor_context,
)
from pyspark.sql import SparkSession
from wcoj_support import (
    Changes,
    Pipeline,
    checks,
    failures,
    materializations,
    oracle,
    updates,
)

from wcoj_assets.checks import BINARY_JOIN, CURRENT, DELTA_RULES, NON_NEGATIVE
from wcoj_assets.definitions import JOB_NAME, VERIFY_JOB
from wcoj_assets.epochs import epoch_key
from wcoj_assets.provenance import RANGE_TAGS, REBUILD_SENSOR
from wcoj_assets.report import INTERNAL
from wcoj_assets.specs import DEFAULT_SPECS, QuerySpec
from wcoj_core.query.builtins import BUILTINS

SPECS = (*DEFAULT_SPECS, QuerySpec("paths2", BUILTINS["2-paths"], ("edge",)))
QUERIES = ("triangles", "paths2")
EPOCHS = 4
# update_triples on edge_deltas, non_negative on edge_snapshot; per query current_history,
# matches_delta_rules and matches_binary_join.
CHECKS_PER_EPOCH = 1 + 1 + 2 * 3
EVERY = 3  # the binary-join recomputation on epoch 2 (one in three)


@dataclass
class Scenario:
    pipeline: Pipeline
    history: list[Changes]
    results: list


@pytest.fixture(scope="module", params=["driver", "executors"])
def scenario(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Scenario]:
    """The scenario with every kernel step on the driver, and on Spark's executors."""
    previous = spark.conf.get("spark.sql.codegen.wholeStage")
    spark.conf.set("spark.sql.codegen.wholeStage", "false")
    p = Pipeline(
        spark,
        tmp_path_factory.mktemp("pipeline"),
        SPECS,
        deployment=request.param,
        check_every=EVERY,
    )
    history = updates(seed=11, epochs=EPOCHS)
    p.land(0, history[0], "txt")
    p.land(1, history[1], "parquet")
    p.land(2, history[2], "csv")
    half = len(history[3]) // 2
    p.land(3, history[3][:half], "csv", name="a")
    p.land(3, history[3][half:], "parquet", name="b", clear=False)
    results = [p.run(n) for n in range(EPOCHS)]
    ran = [e.metadata[INTERNAL].value["ran on"] for r in results for e in _rule_figures(r)]
    assert ran and set(ran) == {request.param}, ran
    yield Scenario(p, history, results)
    spark.conf.set("spark.sql.codegen.wholeStage", previous or "true")


def _rule_figures(result) -> list:
    """The rule assets' materializations of a run (their metadata names where they ran)."""
    return [m for m in materializations(result) if "_rule_" in m.asset_key.to_user_string()]


def test_every_epoch_matches_the_oracle(scenario: Scenario) -> None:
    p = scenario.pipeline
    for result in scenario.results:
        assert result.success, failures(result)
    for t in range(EPOCHS):
        for q in QUERIES:
            expected = oracle(p.topology, q, scenario.history, t)
            assert p.output(q, t) == expected, f"{q} at epoch {t}"
    assert sum(oracle(p.topology, "triangles", scenario.history, EPOCHS - 1).values()) > 0


def test_every_check_runs_for_its_epoch_and_passes(scenario: Scenario) -> None:
    for n, result in enumerate(scenario.results):
        found = checks(result)
        due = n % EVERY == EVERY - 1  # one epoch in EVERY: epoch 2
        # The binary join reports only where it ran; the epoch job does not plan it, so that
        # nowhere else is it SKIPPED (drawn red) or passed. Its status is the latest run's.
        logs = scenario.pipeline.instance.all_logs(result.run_id)
        planned = {
            e.dagster_event.event_specific_data.check_name
            for e in logs
            if e.dagster_event
            and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION_PLANNED"
        }
        assert BINARY_JOIN not in planned and len(planned) == CHECKS_PER_EPOCH - len(QUERIES) - 2
        assert len(found) == CHECKS_PER_EPOCH - (0 if due else len(QUERIES))
        assert all(c.passed for c in found), [c for c in found if not c.passed]
        assert {c.partition for c in found if c.name != BINARY_JOIN} == {epoch_key(n)}
        # A check's figures are plotted by the time of the evaluation: no epoch number there.
        assert not [c for c in found if isinstance(c.metadata.get("epoch"), int)]
        audits = [c for c in found if c.name == DELTA_RULES]
        assert {c.asset for c in audits} == {f"{q}_deltas" for q in QUERIES}
        assert all(c.metadata["checked"] and c.metadata["mismatches"] == 0 for c in audits)
        correctness = [c for c in found if c.name == BINARY_JOIN]
        assert {c.asset for c in correctness} == (set(QUERIES) if due else set())
        assert all(c.partition is None for c in correctness)
        assert all(c.metadata["partition"] == epoch_key(n) for c in correctness)
        assert all(c.metadata["checked"] and c.metadata["mismatches"] == 0 for c in correctness)


def test_arrangements_are_shared_and_metadata_is_complete(scenario: Scenario) -> None:
    mats = materializations(scenario.results[-1])
    by_asset: dict[str, list] = {}
    for m in mats:
        by_asset.setdefault(m.asset_key.to_user_string(), []).append(m)
    # One materialization per asset per run, however many rules of however many queries read it.
    assert all(len(ms) == 1 for ms in by_asset.values())
    arrangements = {
        n for n in by_asset if n.startswith("edge_") and n not in ("edge_deltas", "edge_snapshot")
    }
    # The four shared arrangements: forward, reverse, counts (and self: the snapshot).
    assert arrangements == {"edge_forward", "edge_reverse", "edge_counts_c0", "edge_counts_c1"}
    for name, (m,) in by_asset.items():
        assert m.partition == epoch_key(EPOCHS - 1)
        assert {"epoch", INTERNAL, "dagster/row_count"} <= set(m.metadata), name
        assert m.metadata["epoch"].value == EPOCHS - 1
    for name in arrangements:
        (m,) = by_asset[name]
        internal = m.metadata[INTERNAL].value
        assert internal["bytes"] > 0 and internal["segments"], name
        assert "/arrangements/" in m.metadata["dagster/uri"].value, name
    for i in range(2):
        (rule,) = by_asset[f"paths2_rule_{i}"]
        assert {"rows proposed", "rows validated"} <= set(rule.metadata[INTERNAL].value)
        assert "output rows" in rule.metadata
    graph = scenario.pipeline.defs.resolve_asset_graph()
    for i in range(2):
        explain = graph.get(AssetKey(f"paths2_rule_{i}")).metadata["explain"].value
        assert f"rule {i}: delta edge" in explain
    (out,) = by_asset["triangles"]
    expected = oracle(scenario.pipeline.topology, "triangles", scenario.history, EPOCHS - 1)
    assert out.metadata["count"].value == sum(expected.values())
    assert out.metadata["dagster/row_count"].value == len(expected)
    assert {"open", "rules", "commit"} <= set(out.metadata[INTERNAL].value["seconds by phase"])
    # The figures a user follows, numeric so that Dagster plots them per epoch.
    change = oracle(scenario.pipeline.topology, "triangles", scenario.history, EPOCHS - 2)
    diff = expected - change, change - expected
    assert out.metadata["added"].value == sum(diff[0].values())
    assert out.metadata["removed"].value == sum(diff[1].values())
    assert out.metadata["net"].value == sum(expected.values()) - sum(change.values())


@pytest.mark.parametrize(
    "bad",
    [
        "src,dst,diff\n1,2,1\n2,1,0\n",  # a zero diff
        "src,dst,diff\n1,2,1\n2,,1\n",  # a null id
        "src,dst,diff\n1,2,1\nx,1,1\n",  # a string id
    ],
    ids=["zero-diff", "null", "string-id"],
)
def test_bad_data_fails_the_check_and_changes_nothing(scenario: Scenario, bad: str) -> None:
    p = scenario.pipeline
    folder = p.landing / "edge" / epoch_key(EPOCHS)
    folder.mkdir(parents=True)
    try:
        (folder / "part.csv").write_text(bad)
        before = p.traces()
        result = p.run(EPOCHS)
        assert result.success and failures(result) == []  # a data problem: no stack trace
        (check,) = checks(result)  # the input's check alone
        assert check.asset == "edge_deltas"
        assert not check.passed and check.partition == epoch_key(EPOCHS)
        assert "part.csv" in str(check.metadata["errors"])
        assert p.traces() == before  # not a relation, arrangement or output batch changed
        assert not [m for m in materializations(result)]
    finally:
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()


def replace_output(p: Pipeline, query: str, t: int, rows: list, diff: list) -> None:
    """Commit a manifest whose output batch of `query` at `t` holds `rows` and `diff` (files
    written with their own digests: only the data is wrong)."""
    import numpy as np

    from wcoj_core.store.names import trace_dir
    from wcoj_core.traces import output_trace_name

    engine = p.engine
    name = output_trace_name(query)
    current = engine.store.current()
    trace = current.trace(name)
    assert trace is not None
    folder = f"traces/{trace_dir(name)}/b-k-{t}-0123456789ab"
    rows_a = np.array(rows, dtype=np.int64).reshape(len(rows), len(trace.columns))
    files = engine.batches.write(folder, trace.columns, rows_a, np.array(diff, dtype=np.int64), t)
    (old,) = [b for b in trace.batches if b.time == t]
    batch = dataclasses.replace(old, path=folder, rows=len(diff), files=files)
    engine.store.commit(current.with_trace(trace.replacing(batch)), expected=current)


def stored_change(p: Pipeline, query: str, t: int) -> tuple[list, list]:
    table = p.engine.change(query, t)
    cols = [c for c in table.column_names if c != "diff"]
    return [list(r) for r in zip(*(table[c].to_pylist() for c in cols), strict=True)], table[
        "diff"
    ].to_pylist()


def test_a_tampered_output_batch_fails_the_binary_join_check(scenario: Scenario) -> None:
    p = scenario.pipeline
    last = EPOCHS - 1
    rows, diff = stored_change(p, "triangles", 1)
    replace_output(p, "triangles", 1, [*rows, [100, 101, 102]], [*diff, 1])
    # The verify job finds it at epoch 1, applying nothing: the change and the output are wrong.
    verified = {
        (c.asset, c.name): c.passed
        for c in checks(p.run(1, job=p.defs.resolve_job_def(VERIFY_JOB)))
    }
    assert not verified.pop(("triangles", BINARY_JOIN))
    assert not verified.pop(("triangles_deltas", DELTA_RULES))
    assert all(verified.values()), verified
    on_demand = {"ops": {"wcoj_epochs": {"config": {"binary_join": True}}}}
    result = p.run(last, run_config=on_demand)
    found = {(c.asset, c.name): c for c in checks(result)}
    check = found[("triangles", BINARY_JOIN)]
    assert not check.passed and check.metadata["checked"]
    said = [e.user_message for e in p.instance.all_logs(result.run_id)]
    progress = f"{BINARY_JOIN} of triangles at epoch {last} ({epoch_key(last)}): recomputing"
    assert any(m.startswith(progress) for m in said), said  # before a long Spark check
    assert any(
        m.startswith(f"{BINARY_JOIN} of triangles at epoch {last}: FAILED in ") for m in said
    )
    assert check.metadata["mismatches"] == 1
    assert "(100, 101, 102): expected 0, maintained 1" in str(check.metadata["examples"])
    assert found[("paths2", BINARY_JOIN)].passed
    # The epoch's own change is right: the per-epoch audit passes.
    assert found[("triangles_deltas", DELTA_RULES)].passed
    # Applying epoch 1 again writes its change again.
    assert p.run(1).success
    again = {(c.asset, c.name): c for c in checks(p.run(last, run_config=on_demand))}
    assert again[("triangles", BINARY_JOIN)].passed


def test_the_verify_job_checks_an_epoch_as_stored_and_applies_nothing(scenario: Scenario) -> None:
    """One click verifies an epoch: the verify job runs every check but the landed files' on the
    epoch as the state holds it (the binary join too), materializes and commits nothing; an epoch
    the state does not hold fails each check, saying so (but current_history: it has no history
    to be stale, and a failure would have the automation run it)."""
    p = scenario.pipeline
    before = p.generation()
    verify = p.defs.resolve_job_def(VERIFY_JOB)
    result = p.run(1, job=verify)
    assert result.success, failures(result)
    assert materializations(result) == [] and p.generation() == before
    found = {(c.asset, c.name): c for c in checks(result)}
    expected = {("edge_snapshot", NON_NEGATIVE)}
    for q in QUERIES:
        expected |= {(f"{q}_deltas", CURRENT), (f"{q}_deltas", DELTA_RULES), (q, BINARY_JOIN)}
    assert set(found) == expected
    assert all(c.passed for c in found.values()), [c for c in found.values() if not c.passed]
    for c in found.values():
        where = c.metadata["partition"] if c.name == BINARY_JOIN else c.partition
        assert where == epoch_key(1), c

    result = p.run(EPOCHS + 5, job=verify)  # never applied
    found = checks(result)  # current_history has nothing to say: no history, nothing stale
    assert len(found) == len(expected) - len(QUERIES) and not any(c.passed for c in found)
    said = f"epoch {EPOCHS + 5} ({epoch_key(EPOCHS + 5)}) is not in the state: run it first"
    assert all(c.metadata["error"] == said for c in found), found


@pytest.mark.parametrize("kind", ["drop", "add", "flip"])
def test_a_wrong_output_change_fails_the_audit_of_its_epoch(
    scenario: Scenario, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's pass is made to write a wrong change (one tuple dropped, added or its
    multiplicity flipped): the epoch's matches_delta_rules fails, naming the tuple."""
    import numpy as np

    from wcoj_core import epoch as pass_module
    from wcoj_core.kernel.layer import Layer
    from wcoj_core.traces import output_trace_name

    p, last = scenario.pipeline, EPOCHS - 1
    derive = pass_module.EpochPass._derive
    victim: list[tuple[int, ...]] = []

    def wrong(self, *args):
        choice, outputs, tallies = derive(self, *args)
        name = output_trace_name("paths2")
        out = outputs[name]
        held = out if isinstance(out, tuple) else (out.layer.rows, out.layer.diff)
        rows, diff = np.asarray(held[0]), np.asarray(held[1])
        assert len(diff), "the scenario's last epoch changes paths2"
        if kind == "drop":
            victim.append(tuple(int(v) for v in rows[0]))
            rows, diff = rows[1:], diff[1:]
        elif kind == "flip":
            victim.append(tuple(int(v) for v in rows[0]))
            diff = np.concatenate([-diff[:1], diff[1:]])
        else:
            victim.append((90, 91, 92))
            rows, diff = np.concatenate([rows, [[90, 91, 92]]]), np.concatenate([diff, [1]])
        layer = Layer.build(rows.astype(np.int64), diff.astype(np.int64))
        if isinstance(out, tuple):
            outputs[name] = (layer.rows, layer.diff)
        else:
            outputs[name] = dataclasses.replace(out, layer=layer)
        return choice, outputs, tallies

    monkeypatch.setattr(pass_module.EpochPass, "_derive", wrong)
    result = p.run(last)
    found = {(c.asset, c.name): c for c in checks(result)}
    check = found[("paths2_deltas", DELTA_RULES)]
    assert not check.passed and check.metadata["mismatches"] == 1, check
    assert check.metadata["examples"][0].startswith(f"{victim[0]}: expected"), check
    assert found[("triangles_deltas", DELTA_RULES)].passed
    monkeypatch.undo()
    repaired = p.run(last)
    assert all(c.passed for c in checks(repaired)), checks(repaired)


def test_a_corrected_epoch_and_a_later_epoch_equal_the_from_scratch_answer(
    scenario: Scenario,
) -> None:
    p = scenario.pipeline
    extra = [(0, 7), (7, 8), (0, 8), (1, 7), (1, 8)]
    corrected = list(scenario.history)
    corrected[1] = [*corrected[1], *[(e, 1) for e in extra], *[((b, a), 1) for a, b in extra]]
    p.land(1, corrected[1], "csv")
    rerun = p.run(1)  # what the sensor requests for the changed folder
    assert rerun.success, failures(rerun)
    (deltas,) = [
        m for m in materializations(rerun) if m.asset_key.to_user_string() == "edge_deltas"
    ]
    # Dagster marks only the corrected partitions' direct readers stale; the materialization
    # names every later epoch derived from the old changes, and where a backfill must start,
    # and every later partition of every query's change fails `current_history`.
    assert deltas.metadata["stale later epochs"].value == EPOCHS - 2
    assert deltas.metadata["backfill from"].value == epoch_key(2)
    later = {epoch_key(t) for t in range(2, EPOCHS)}
    failed = {(c.asset, c.partition) for c in checks(rerun) if c.name == CURRENT and not c.passed}
    assert failed == {(f"{q}_deltas", k) for q in QUERIES for k in later}
    # The rebuild sensor requests ONE run over exactly the range of those partitions (the step
    # makes whole epochs: every asset), under one run key however often it ticks.
    assets = {k.to_user_string() for k in p.defs.resolve_asset_graph().get_all_asset_keys()}
    (request,) = rebuild_requests(p)
    assert [request.tags[t] for t in RANGE_TAGS] == [epoch_key(2), epoch_key(EPOCHS - 1)]
    assert [r.run_key for r in rebuild_requests(p)] == [request.run_key]
    assert p.output("triangles", 1) == oracle(p.topology, "triangles", corrected, 1)
    # Verifying epoch 2 as stored says it is stale, and rebuilds nothing.
    history = {AssetCheckKey(AssetKey(f"{q}_deltas"), CURRENT) for q in QUERIES}
    verify = p.defs.resolve_job_def(VERIFY_JOB)
    every = {AssetKey(a) for a in assets}
    verified = p.run(2, job=verify.get_subset(asset_selection=every, asset_check_selection=history))
    assert [(c.name, c.passed) for c in checks(verified)] == [(CURRENT, False)] * len(QUERIES)
    assert materializations(verified) == []
    # A run of the last epoch alone derives the stale epoch 2 again first, and reports it.
    result = p.run(EPOCHS - 1)
    assert result.success, failures(result)
    rebuilt = {(m.asset_key.to_user_string(), m.partition) for m in materializations(result)}
    assert {(a, epoch_key(2)) for a in assets} <= rebuilt
    current = {(c.asset, c.partition): c.passed for c in checks(result) if c.name == CURRENT}
    assert current == {(f"{q}_deltas", k): True for q in QUERIES for k in later}
    assert rebuild_requests(p) == []  # nothing left to rebuild
    for t in range(EPOCHS):
        for q in QUERIES:
            assert p.output(q, t) == oracle(p.topology, q, corrected, t), f"{q} at epoch {t}"
    assert all(c.passed for c in checks(result))
    scenario.history = corrected


def test_the_rebuild_sensor_requests_one_run_over_the_stale_range_once_nothing_runs(
    scenario: Scenario,
) -> None:
    p = scenario.pipeline
    corrected = list(scenario.history)
    corrected[0] = [*corrected[0], ((5, 9), 1), ((9, 5), 1), ((0, 9), 1), ((9, 0), 1)]
    p.land(0, corrected[0], "csv")
    # While a run of the job has not ended (this one, or the correction's own run,
    # still writing its reports), the sensor waits and names it.
    waiting = DagsterRun(job_name=JOB_NAME, run_id="epoch-run", status=DagsterRunStatus.STARTED)
    p.instance.add_run(waiting)
    assert p.run(0).success
    (skipped,) = rebuild_skips(p)
    assert "run epoch-run is in flight" in skipped, skipped
    p.instance.delete_run(waiting.run_id)
    (request,) = rebuild_requests(p)
    assert [request.tags[t] for t in RANGE_TAGS] == [epoch_key(1), epoch_key(EPOCHS - 1)]
    result = p.run((1, EPOCHS - 1))  # the requested run: one run, its range tags
    assert result.success, failures(result)
    current = {(c.asset, c.partition): c.passed for c in checks(result) if c.name == CURRENT}
    later = [epoch_key(t) for t in range(1, EPOCHS)]  # each partition, then the range's result
    assert current == {(f"{q}_deltas", k): True for q in QUERIES for k in [*later, None]}
    assert rebuild_requests(p) == []
    assert p.engine.stale() == []
    for t in range(EPOCHS):
        for q in QUERIES:
            assert p.output(q, t) == oracle(p.topology, q, corrected, t), f"{q} at epoch {t}"
    scenario.history = corrected


def rebuild_tick(p: Pipeline) -> tuple[list[RunRequest], list[str]]:
    """One tick of the rebuild sensor, as the daemon evaluates it: its requests and skip
    message."""
    sensor = p.defs.resolve_sensor_def(REBUILD_SENSOR)
    with build_sensor_context(instance=p.instance, definitions=p.defs) as context:
        tick = sensor.evaluate_tick(context)
    return list(tick.run_requests or []), [tick.skip_message] if tick.skip_message else []


def rebuild_requests(p: Pipeline) -> list[RunRequest]:
    return rebuild_tick(p)[0]


def rebuild_skips(p: Pipeline) -> list[str]:
    return rebuild_tick(p)[1]


def test_state_lives_under_the_configured_storage(scenario: Scenario) -> None:
    root = Path(scenario.pipeline.storage)
    assert (root / "manifests").is_dir() and (root / "traces").is_dir()
