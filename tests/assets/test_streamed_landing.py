"""Landed files too big to read at once are streamed: checked a batch at a time as the engine
lands them, each file read once; a bad one is refused exactly as a small one is.

Every test streams every landed file (`wcoj_assets.landing_read.TABLE_BYTES` set to 0, as for a file
that may decompress past it) and counts the reader's passes over each file. No Spark: the step
reads local files with pyarrow.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bad_input_assets import BAD_LANDINGS, FIRST, every_bad_row_listed, refused_alone
from wcoj_support import Pipeline, checks, failures, materializations, oracle, updates

from wcoj_assets import landing_read
from wcoj_assets.epochs import epoch_key
from wcoj_assets.landing_read import LandedStream, Refused
from wcoj_assets.schemas import Depth, arrow_problems, problems, triples_schema
from wcoj_core import input_read
from wcoj_core.state_read import read_table
from wcoj_core.traces import output_trace_name


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every landed file streamed; the files the reader was asked for, one entry per pass."""
    monkeypatch.setattr(landing_read, "TABLE_BYTES", 0)
    passes: list[str] = []
    real = input_read.read_local_batches

    def counted(path: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        passes.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(input_read, "read_local_batches", counted)
    return passes


def triangles(p: Pipeline, epoch: int) -> Counter:
    table = read_table(p.engine, output_trace_name("triangles"), epoch).to_pydict()
    out: Counter = Counter()
    for *row, diff in zip(*table.values(), strict=True):
        out[tuple(row)] += diff
    return Counter({k: v for k, v in out.items() if v})


def test_streamed_epochs_are_read_once_and_exact(tmp_path: Path, reads: list[str]) -> None:
    p = Pipeline(None, tmp_path)
    history = updates(seed=5, epochs=4)
    for n, fmt in enumerate(["txt", "csv", "parquet", "csv"]):
        p.land(n, history[n], fmt)
    streamed = landing_read.read_epoch(str(p.landing), "edge", 2, epoch_key(0), lambda _: None)  # type: ignore[arg-type]
    assert isinstance(streamed.rows, LandedStream)
    for n in (0, 1):
        before = len(reads)
        result = p.run(n)
        assert result.success, failures(result)
        assert reads[before:] == ["part.txt" if n == 0 else "part.csv"]  # one pass, not two
        assert all(c.passed for c in checks(result)), checks(result)
        # Streamed rows are counted as they are checked: every epoch says how many landed.
        (deltas,) = [m for m in materializations(result) if m.asset_key.path == ["edge_deltas"]]
        assert deltas.metadata["rows landed"].value == len(history[n])
        assert triangles(p, n) == oracle(p.topology, "triangles", history, n)
    before = len(reads)
    result = p.run((2, 3))  # a range: each epoch's file read once, as it is applied
    assert result.success, failures(result)
    assert reads[before:] == ["part.parquet", "part.csv"]
    for n in (2, 3):
        assert triangles(p, n) == oracle(p.topology, "triangles", history, n)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    p = Pipeline(None, tmp_path_factory.mktemp("streamed_bad"))
    p.land(0, FIRST, "csv")
    result = p.run(0)
    assert result.success, failures(result)
    return p


@pytest.mark.parametrize(
    ("name", "content", "fragments"),
    [pytest.param(n, c, f, id=i) for i, n, c, f in BAD_LANDINGS],
)
def test_a_bad_streamed_file_is_refused_as_a_small_one_is(
    loaded: Pipeline, reads: list[str], name: str, content, fragments: tuple[str, ...]
) -> None:
    refused_alone(loaded, name, content, fragments)


def test_every_bad_row_of_a_streamed_file_is_listed(loaded: Pipeline, reads: list[str]) -> None:
    every_bad_row_listed(loaded)


def test_a_range_stops_at_a_refused_streamed_epoch(tmp_path: Path, reads: list[str]) -> None:
    """Epochs before the refused one are applied and reported; it fails its input check alone;
    the later ones are not applied and report no check."""
    p = Pipeline(None, tmp_path)
    history = updates(seed=9, epochs=4)
    p.land(0, history[0], "csv")
    assert p.run(0).success
    p.land(1, history[1], "csv")
    bad = p.land(2, history[2], "csv")
    bad.write_text(bad.read_text() + "1,x,1\n")
    p.land(3, history[3], "csv")
    result = p.run((1, 3))
    assert result.success and failures(result) == []
    by_partition: dict[str | None, list] = {}
    for c in checks(result):
        by_partition.setdefault(c.partition, []).append(c)
    assert epoch_key(3) not in by_partition
    (refused,) = by_partition[epoch_key(2)]
    assert (refused.name, refused.passed) == ("update_triples", False)
    assert "not an integer: 'x'" in refused.metadata["errors"][0]
    assert all(c.passed for c in by_partition[epoch_key(1)])
    assert {m.partition for m in materializations(result)} == {epoch_key(1)}
    assert triangles(p, 1) == oracle(p.topology, "triangles", history, 1)
    assert max(b.time for t in p.traces().values() for b in t.batches) == 1


def test_a_check_refuses_a_later_batch_before_it_goes_on(tmp_path: Path) -> None:
    files = []
    for i in range(3):
        path = tmp_path / f"part{i}.parquet"
        pq.write_table(pa.table({"src": [i], "dst": [i + 1], "diff": [1]}), path)
        files.append(str(path))
    local = LandedStream(tuple(files), 2, "edge")
    seen: list[int] = []

    def check(batch: pa.RecordBatch, before: int) -> list[str]:
        seen.append(before)
        return ["the third"] if before == 2 else []

    reader = local.checked(check, 10)
    assert reader.read_next_batch().num_rows == 1
    assert reader.read_next_batch().num_rows == 1
    with pytest.raises(Refused) as refused:
        reader.read_next_batch()
    assert (refused.value.relation, refused.value.lines, seen) == ("edge", ["the third"], [0, 1, 2])


COLUMNS = ["c0", "c1"]


@st.composite
def landed_tables(draw: st.DrawFn) -> pa.Table:
    """Small tables of landed rows, some with nulls, zero diffs or a column of another type."""
    n = draw(st.integers(1, 12))
    values = st.one_of(st.none(), st.integers(-3, 3)) if draw(st.booleans()) else st.integers(-3, 3)
    columns = {
        c: pa.array(draw(st.lists(values, min_size=n, max_size=n)), pa.int64())
        for c in [*COLUMNS, "diff"]
    }
    kind = draw(st.sampled_from(["int64", "int64", "double", "int32"]))
    if kind != "int64":
        name = draw(st.sampled_from([*COLUMNS, "diff"]))
        columns[name] = columns[name].cast(pa.float64() if kind == "double" else pa.int32())
    return pa.table(columns)


@settings(max_examples=60, deadline=None)
@given(landed_tables(), st.integers(0, 4))
def test_arrow_checks_agree_with_pandera(table: pa.Table, epoch: int) -> None:
    """The vectorized checks of a big landed table refuse exactly what pandera's full check of
    its rows refuses."""
    frame = table.to_pandas()
    frame.insert(len(COLUMNS), "time", np.full(len(frame), epoch, dtype=np.int64))
    expected = problems(frame, triples_schema(COLUMNS, epoch=epoch, local=True), Depth.FULL)
    found = arrow_problems(table, COLUMNS, epoch)
    assert bool(found) == bool(expected), (found, expected)


def test_a_refused_streamed_epoch_after_a_correction_rebuilds_nothing(
    tmp_path: Path, reads: list[str]
) -> None:
    """A correction leaves a later epoch stale; the next epoch's run would derive it again (and
    commit it) before landing its own rows: those rows are checked first, so a refusal leaves
    the state exactly as it was, and good rows give the exact answer."""
    p = Pipeline(None, tmp_path)
    history = updates(seed=13, epochs=4)
    for n in range(3):
        p.land(n, history[n], "csv")
        assert p.run(n).success
    history[1] = [c for c in history[1] if c[1] > 0]  # corrected (no deletions): 2 is stale
    p.land(1, history[1], "csv")
    assert p.run(1).success
    assert p.engine.stale() == [2]
    bad = p.land(3, history[3], "csv")
    bad.write_text(bad.read_text() + "1,x,1\n")
    generation = p.generation()
    result = p.run(3)
    assert result.success and failures(result) == []
    (check,) = checks(result)
    assert (check.name, check.passed) == ("update_triples", False)
    assert p.generation() == generation and p.engine.stale() == [2]
    p.land(3, history[3], "csv")
    before = len(reads)
    result = p.run(3)
    assert result.success, failures(result)
    assert reads[before:] == ["part.csv", "part.csv"]  # checked first, then landed
    for n in (2, 3):
        assert triangles(p, n) == oracle(p.topology, "triangles", history, n)
