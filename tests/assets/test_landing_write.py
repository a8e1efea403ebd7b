"""The landing zone: one folder per epoch, one file per folder, and the files are the stream."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession

from wcoj_assets.epochs import epoch_key
from wcoj_assets.landing_write import LandingError, generate_landing, write_epochs
from wcoj_core.generate import generate
from wcoj_core.input_spark import read_relation
from wcoj_core.replay import epoch_stream
from wcoj_core.updates import update_schema

SMALL = {"scale": 6, "edges": 300, "seed": 11, "epochs": 4, "delete_fraction": 0.3}

Row = tuple[int, ...]


def small_stream(spark: SparkSession) -> DataFrame:
    graph = generate(spark, "rmat:scale=6,edges=300,seed=11")
    return epoch_stream(graph, 4, 0.3, 11, undirected=True)


def stream_rows(df: DataFrame) -> Counter[Row]:
    """The stream as a multiset of ``(c0, .., time, diff)``."""
    return Counter(tuple(r) for r in df.select("c0", "c1", "time", "diff").collect())


def landed_rows(spark: SparkSession, landing: Path, relation: str, arity: int) -> Counter[Row]:
    """Every landed file read back with `read_relation`, its epoch taken from the folder."""
    keys = [p.name for p in sorted((landing / relation).iterdir())]
    rows: Counter[Row] = Counter()
    for n, key in enumerate(keys):
        assert key == epoch_key(n), f"folder {key} is not epoch {n}; folders {keys}"
        (file,) = (landing / relation / key).iterdir()
        df = read_relation(spark, str(file), arity, relation)
        rows.update((*r[:-1], n, r[-1]) for r in df.collect())
    return rows


def file_rows(path: Path) -> Counter[Row]:
    table = pq.read_table(path)
    return Counter(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))


def tree(root: Path) -> list[str]:
    """Every path under `root`, hidden ones included, relative and sorted."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_epoch_keys_are_days_from_2020() -> None:
    assert [epoch_key(n) for n in (0, 1, 30, 366)] == [
        "2020-01-01",
        "2020-01-02",
        "2020-01-31",
        "2021-01-01",
    ]


def test_generated_landing_has_one_file_per_epoch_folder(small, tmp_path: Path) -> None:
    keys = generate_landing(small, str(tmp_path), **SMALL)
    assert keys == [epoch_key(n) for n in range(4)]
    # Nothing else is left behind: no staging directory, no hidden or checksum files.
    expected = ["edge", *(f"edge/{k}" for k in keys), *(f"edge/{k}/part-0.parquet" for k in keys)]
    assert tree(tmp_path) == sorted(expected)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_files_read_back_as_the_stream(small, tmp_path: Path, fmt: str) -> None:
    stream = small_stream(small)
    keys = write_epochs(small, str(tmp_path), "edge", stream, fmt)
    assert keys == [epoch_key(n) for n in range(4)]
    assert all(f.name == f"part-0.{fmt}" for f in (tmp_path / "edge").rglob("*") if f.is_file())
    expected = stream_rows(stream)
    assert any(diff < 0 for *_, diff in expected), "the stream should contain deletions"
    assert landed_rows(small, tmp_path, "edge", 2) == expected


def test_csv_file_has_a_header_row(small, tmp_path: Path) -> None:
    stream = small.createDataFrame([(3, 4, 0, 1)], "c0 long, c1 long, time long, diff long")
    write_epochs(small, str(tmp_path), "edge", stream, "csv")
    lines = (tmp_path / "edge" / "2020-01-01" / "part-0.csv").read_text().splitlines()
    assert lines == ["c0,c1,diff", "3,4,1"]


def test_columns_are_reordered_and_empty_epochs_get_no_folder(small, tmp_path: Path) -> None:
    rows = [(1, 0, 2, 5, 1), (1, 0, 2, 5, 1), (7, 2, 8, 9, -1), (4, 2, 5, 6, 2)]
    stream = small.createDataFrame(rows, "c1 long, time long, c0 long, c2 long, diff long")
    keys = write_epochs(small, str(tmp_path), "triple", stream)
    assert keys == ["2020-01-01", "2020-01-03"]
    first = tmp_path / "triple" / "2020-01-01" / "part-0.parquet"
    assert pq.read_schema(first).names == ["c0", "c1", "c2", "diff"]
    assert file_rows(first) == Counter({(2, 1, 5, 1): 2})
    assert file_rows(tmp_path / "triple" / "2020-01-03" / "part-0.parquet") == Counter(
        {(8, 7, 9, -1): 1, (5, 4, 6, 2): 1}
    )


def test_generation_is_deterministic_per_seed(small, tmp_path: Path) -> None:
    first, again, other = tmp_path / "first", tmp_path / "again", tmp_path / "other"
    generate_landing(small, str(first), **SMALL)
    generate_landing(small, str(again), **SMALL)
    generate_landing(small, str(other), **{**SMALL, "seed": 12})
    assert tree(first) == tree(again)
    for file in sorted(first.rglob("*.parquet")):
        relative = file.relative_to(first)
        assert file_rows(file) == file_rows(again / relative), f"{relative} differs between runs"
    files = sorted(first.rglob("*.parquet"))
    assert [file_rows(f) for f in files] != [file_rows(other / f.relative_to(first)) for f in files]


def test_landing_again_replaces_the_files(small, tmp_path: Path) -> None:
    schema = "c0 long, c1 long, time long, diff long"
    write_epochs(small, str(tmp_path), "edge", small.createDataFrame([(1, 2, 0, 1)], schema))
    write_epochs(small, str(tmp_path), "edge", small.createDataFrame([(5, 6, 0, 1)], schema))
    assert tree(tmp_path) == ["edge", "edge/2020-01-01", "edge/2020-01-01/part-0.parquet"]
    assert file_rows(tmp_path / "edge" / "2020-01-01" / "part-0.parquet") == Counter({(5, 6, 1): 1})


def test_a_folder_with_a_foreign_file_is_refused(small, tmp_path: Path) -> None:
    foreign = tmp_path / "edge" / "2020-01-02" / "part-0.csv"
    foreign.parent.mkdir(parents=True)
    foreign.write_text("c0,c1,diff\n1,2,1\n")
    stream = small.createDataFrame([(1, 2, 0, 1), (3, 4, 1, 1)], update_schema(["c0", "c1"]))
    with pytest.raises(LandingError, match=r"2020-01-02.*part-0\.csv"):
        write_epochs(small, str(tmp_path), "edge", stream)
    # Checked before anything is published: epoch 0 did not land either.
    assert tree(tmp_path) == ["edge", "edge/2020-01-02", "edge/2020-01-02/part-0.csv"]


def test_bad_streams_are_refused(small, tmp_path: Path) -> None:
    negative = small.createDataFrame([(1, 2, -1, 1)], "c0 long, c1 long, time long, diff long")
    with pytest.raises(LandingError, match="time -1"):
        write_epochs(small, str(tmp_path), "edge", negative)
    no_diff = small.createDataFrame([(1, 2, 0)], "c0 long, c1 long, time long")
    with pytest.raises(LandingError, match="'diff'"):
        write_epochs(small, str(tmp_path), "edge", no_diff)
    named = small.createDataFrame([(1, 2, 0, 1)], "src long, dst long, time long, diff long")
    with pytest.raises(LandingError, match=r"c0 \.\. c\(k-1\)"):
        write_epochs(small, str(tmp_path), "edge", named)
    with pytest.raises(LandingError, match="unknown landing format 'orc'"):
        write_epochs(small, str(tmp_path), "edge", negative, "orc")
    for relation in ("", "../edge", ".edge"):
        with pytest.raises(LandingError, match="plain folder name"):
            write_epochs(small, str(tmp_path), relation, negative)
    assert not any(p.name != "edge" for p in tmp_path.rglob("*"))
