"""Bad input at the Dagster level: landed files, epoch keys, repeated epochs, absent deletions.

One pipeline (the default triangles spec: ``edge`` a bag) ingests a good epoch 0. Then each bad
file lands at epoch 1 and a run of the epoch job must fail the ``update_triples`` check of
``edge_deltas`` — and no other check — with a message naming the epoch, the file, the line and
the column, materialize nothing, leave every file of the state as it was, and end without an
error (a data problem: no step failure, no stack trace), the run tagged ``wcoj/refused`` (seen
in the Runs list) and its log saying why the other checks were skipped. A file with several bad rows has them
all listed in one run; an epoch with nothing landed fails the check naming the folder unless
empty epochs are declared normal. The last tests land data that is accepted but suspicious (the
same epoch again, deletions of absent edges from a bag): they run in file order, after the
refusals.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import Failure
from pyspark.sql import SparkSession
from wcoj_support import Changes, Pipeline, checks, failures, materializations, oracle

from wcoj_assets.epochs import Epochs, epoch_key
from wcoj_assets.pipeline import REFUSED_TAG, epochs_of
from wcoj_core.traces import relation_trace_name

FIRST: Changes = [
    (edge, 1) for a, b in ((1, 2), (2, 3), (1, 3), (3, 4)) for edge in ((a, b), (b, a))
]


@dataclass
class Scenario:
    pipeline: Pipeline
    history: list[Changes]


@pytest.fixture(scope="module")
def scenario(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    previous = spark.conf.get("spark.sql.codegen.wholeStage")
    spark.conf.set("spark.sql.codegen.wholeStage", "false")
    p = Pipeline(spark, tmp_path_factory.mktemp("bad_input"))
    p.land(0, FIRST, "csv")
    result = p.run(0)
    assert result.success, failures(result)
    yield Scenario(p, [FIRST])
    spark.conf.set("spark.sql.codegen.wholeStage", previous or "true")


def files_under(root: Path) -> dict[str, str]:
    """Every file under `root` with a digest of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _parquet(columns: dict[str, pa.Array]) -> Callable[[Path], None]:
    return lambda path: pq.write_table(pa.table(columns), path)


def _int64(*values: int | None) -> pa.Array:
    return pa.array(values, pa.int64())


# (id, file name, content, fragments of the first error)
BAD_LANDINGS: list[tuple[str, str, str | bytes | Callable[[Path], None], tuple[str, ...]]] = [
    ("malformed-line", "part.txt", "1\t2\n2\t3\t4\n", ("line 2, column 5", "expected 2 fields")),
    ("non-integer-id", "part.txt", "1 2\n3 x\n", ("line 2, column 3", "not an integer: 'x'")),
    (
        "out-of-range-id",
        "part.csv",
        "src,dst\n1,99999999999999999999\n",
        ("line 2, column 2", "out of the signed 64-bit range"),
    ),
    ("empty-file", "part.txt", "", ("has no data rows",)),
    ("missing-column", "part.csv", "src\n1\n", ("line 1", "has 1 data columns ['src']")),
    (
        "wrong-type",
        "part.parquet",
        _parquet({"src": _int64(1), "dst": pa.array([2.5])}),
        ("column dst", "has type double"),
    ),
    ("nan", "part.csv", "src,dst\n1,NaN\n", ("line 2, column 2", "'NaN'")),
    (
        "null",
        "part.parquet",
        _parquet({"src": _int64(1, None), "dst": _int64(2, 3)}),
        ("line 2, column src", "is null"),
    ),
    ("zero-diff", "part.csv", "src,dst,diff\n1,2,0\n", ("line 2, column 3", "is zero")),
    ("corrupt-parquet", "part.parquet", b"PAR1 not really", ("cannot be read as Parquet",)),
]


@pytest.mark.parametrize(
    ("name", "content", "fragments"),
    [pytest.param(n, c, f, id=i) for i, n, c, f in BAD_LANDINGS],
)
def test_a_bad_landed_file_fails_the_check_and_writes_nothing(
    scenario: Scenario,
    name: str,
    content: str | bytes | Callable[[Path], None],
    fragments: tuple[str, ...],
) -> None:
    refused_alone(scenario.pipeline, name, content, fragments)


def refused_alone(
    p: Pipeline,
    name: str,
    content: str | bytes | Callable[[Path], None],
    fragments: tuple[str, ...],
) -> None:
    """Epoch 1 landed as one bad file `name`: its input check alone fails, naming the file and
    the `fragments`, with no stack trace; nothing is materialized or written."""
    folder = p.landing / "edge" / epoch_key(1)
    folder.mkdir(parents=True)
    try:
        path = folder / name
        if isinstance(content, str):
            path.write_text(content)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            content(path)
        before, stored = p.traces(), files_under(p.storage)
        result = p.run(1)
        assert result.success and failures(result) == []  # no stack trace for bad data
        (check,) = checks(result)  # the input's check, and no other: nothing else ran
        assert (check.asset, check.name) == ("edge_deltas", "update_triples")
        assert not check.passed and check.partition == epoch_key(1)
        (first, *_) = check.metadata["errors"]
        assert first.startswith(f"epoch 1 ({epoch_key(1)}): {path} (relation edge)"), first
        for fragment in fragments:
            assert fragment in first, (fragment, first)
        assert materializations(result) == []
        assert p.traces() == before
        assert files_under(p.storage) == stored
        # Visible as such in the Runs list (a tag), and the log says why no other check ran.
        assert p.instance.get_run_by_id(result.run_id).tags[REFUSED_TAG] == epoch_key(1)
        logged = [e.user_message for e in p.instance.all_logs(result.run_id) if e.level >= 40]
        said = "so its other checks were not evaluated (Skipped: current_history, "
        assert any(said + "matches_delta_rules, non_negative)" in m for m in logged), logged
    finally:
        shutil.rmtree(folder)


def test_every_bad_row_of_a_file_is_listed_in_one_run(scenario: Scenario) -> None:
    every_bad_row_listed(scenario.pipeline)


def every_bad_row_listed(p: Pipeline) -> None:
    """Epoch 1 landed as a CSV with four bad rows among good ones: one run lists every bad
    row, in file order, and materializes nothing."""
    folder = p.landing / "edge" / epoch_key(1)
    folder.mkdir(parents=True)
    try:
        rows = ["src,dst,diff", "1,2,1", "1,x,1", "2,3,1", "3,4,0", "4,5", "5,6,1", "y,7,1"]
        (folder / "changes.csv").write_text("\n".join(rows) + "\n")
        result = p.run(1)
        assert result.success and failures(result) == []
        (check,) = checks(result)
        assert not check.passed
        errors = check.metadata["errors"]
        lines = [e.split(", line ")[1].split(",")[0] for e in errors]
        assert lines == ["3", "5", "6", "8"], errors  # every bad row, in file order
        said = check.description or ""  # what it counts, what it shows, where the rest are
        assert said.startswith("4 problem(s), nothing applied: ") and said.count("epoch 1 (") == 3
        assert said.endswith("; the first 3 of 4 shown, every one under errors"), said
        assert check.metadata["problems found"] == 4
        assert materializations(result) == []
    finally:
        shutil.rmtree(folder)


def test_an_epoch_with_nothing_landed_fails_its_input_check_naming_the_folder(
    spark: SparkSession, tmp_path: Path
) -> None:
    p = Pipeline(spark, tmp_path)
    p.land(0, FIRST, "csv")
    assert p.run(0).success
    result = p.run(1)  # a day with no folder: a schedule firing before the data would do this
    (check,) = checks(result)
    assert not check.passed and check.name == "update_triples"
    assert f"nothing landed in {p.landing}/edge/{epoch_key(1)}/" in check.metadata["errors"][0]
    assert materializations(result) == [] and p.engine.epoch == 0
    declared = Pipeline(spark, tmp_path / "declared", empty_epochs=True)
    declared.land(0, FIRST, "csv")
    assert declared.run(0).success
    result = declared.run(1)  # declared normal: applied, nothing changed
    assert result.success and all(c.passed for c in checks(result))
    assert declared.engine.epoch == 1
    assert declared.output("triangles", 1) == declared.output("triangles", 0)


@pytest.mark.parametrize("key", ["..", "../2020-01-02", "/2020-01-02", "/etc", "2020-02-30"])
def test_a_malformed_partition_key_fails_the_step_before_any_path(key: str) -> None:
    with pytest.raises(Failure) as caught:
        epochs_of(SimpleNamespace(partition_keys=[epoch_key(0), key]), Epochs())
    assert f"epoch key {key!r}" in str(caught.value.description)


def test_the_same_epoch_again_keeps_its_changes_and_its_answer(scenario: Scenario) -> None:
    p = scenario.pipeline
    trace = relation_trace_name("edge")
    (batch,) = [b for b in p.traces()[trace].batches if b.time == 0]
    result = p.run(0)
    assert result.success, failures(result)
    (again,) = [b for b in p.traces()[trace].batches if b.time == 0]
    assert (again.rows, again.landed, again.figures) == (batch.rows, batch.landed, batch.figures)
    assert p.engine.stale() == []
    assert p.output("triangles", 0) == oracle(p.topology, "triangles", scenario.history, 0)


def test_deleting_absent_edges_is_flagged_with_the_tuples(scenario: Scenario) -> None:
    p = scenario.pipeline
    absent: Changes = [((5, 6), -1), ((6, 5), -1), ((7, 8), -2)]
    p.land(1, [((1, 4), 1), *absent], "csv")
    result = p.run(1)
    found = {(c.asset, c.name): c for c in checks(result)}
    assert found[("edge_deltas", "update_triples")].passed  # signed multiplicities are fine
    check = found[("edge_snapshot", "non_negative")]
    assert not check.passed and check.partition == epoch_key(1)
    assert check.metadata["negative_tuples"] == 3
    assert check.metadata["offending"] == [
        "epoch 1: (5, 6) has multiplicity -1",
        "epoch 1: (6, 5) has multiplicity -1",
        "epoch 1: (7, 8) has multiplicity -2",
    ]
    # The epoch is applied (a bag holds what it is given), and the check blocks: the run fails,
    # so nothing downstream of the pipeline runs on it.
    assert not result.success
    assert any("blocking asset check" in f for f in failures(result)), failures(result)
    materialized = {m.asset_key.to_user_string() for m in materializations(result)}
    assert {"edge_deltas", "edge_snapshot", "triangles"} <= materialized
