"""The local reader hands Arrow's threaded readers only memory Arrow owns.

A buffer over Python's memory (``pa.py_buffer``) takes the GIL when it is released; a threaded
CSV or Parquet reader's last reference to its input may be dropped by one of Arrow's threads
after the read returned (seen under gdb: ``PyBuffer::~PyBuffer`` on an Arrow worker, disposing
of the CSV reader). If the interpreter is exiting by then — a command that refuses its input
right after reading it — that thread is ended inside the destructor and the process aborts with
``terminate called without an active exception`` (exit status -6: issue 30's flaky
``test_4_a_count_leaving_int64...`` and ``test_2_another_meaning...``). The race needs a loaded
machine to show; what is pinned here is its cause: every read and pre-flight check of text, CSV,
gzipped CSV and Parquet files succeeds, with the exact rows, while ``pa.py_buffer`` refuses to
be called.
"""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wcoj_core.input_read import check_locally, read_local

ROWS = [(1, 2, 1), (2, 3, 1), (1, 3, 2), (3, 4, -1), (2, 4, 1)]


def inputs(folder: Path) -> dict[str, tuple[Path, list[tuple[int, ...]]]]:
    """Each format's file of `ROWS`, with the rows it reads as (a text edge list: diff 1)."""
    csv = "c0,c1,diff\n" + "".join(f"{a},{b},{d}\n" for a, b, d in ROWS)
    text = "# an edge list\n" + "".join(f"{a} {b}\n" for a, b, _ in ROWS)
    tabs = "".join(f"{a}\t{b}\n" for a, b, _ in ROWS)
    (folder / "e.csv").write_text(csv)
    (folder / "e.csv.gz").write_bytes(gzip.compress(csv.encode()))
    (folder / "e.txt").write_text(text)
    (folder / "t.txt").write_text(tabs)
    columns = list(zip(*ROWS, strict=True))
    table = pa.table(
        {name: list(col) for name, col in zip(("c0", "c1", "diff"), columns, strict=True)}
    )
    pq.write_table(table, folder / "e.parquet")
    edges = [(a, b, 1) for a, b, _ in ROWS]
    return {
        "csv": (folder / "e.csv", ROWS),
        "gzipped csv": (folder / "e.csv.gz", ROWS),
        "text": (folder / "e.txt", edges),
        "tab-separated text": (folder / "t.txt", edges),
        "parquet": (folder / "e.parquet", ROWS),
    }


def test_reads_hand_arrow_no_python_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = inputs(tmp_path)

    def refused(*_args: object, **_kwargs: object) -> pa.Buffer:
        raise AssertionError("a buffer over Python's memory handed to Arrow")

    monkeypatch.setattr(pa, "py_buffer", refused)
    for kind, (path, rows) in files.items():
        check_locally(str(path), 2, "edge")
        table = read_local(str(path), 2, "edge")
        got = Counter(
            zip(*(table.column(c).to_pylist() for c in ("c0", "c1", "diff")), strict=True)
        )
        assert got == Counter(rows), kind
