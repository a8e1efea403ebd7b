"""Inputs that must neither hang nor eat the machine, and arguments that must not do harm.

* what is not a regular file (a named pipe, a device, a socket; a folder unless Parquet) is
  refused from ``os.stat`` with one line, by the CLI, the pre-flight check and both readers,
  never opened (a run of the real command in a subprocess, with a timeout, proves no hang);
* the pre-flight check reads a bounded number of decompressed bytes, and the full reader refuses
  an endless line instead of buffering it;
* ``--output`` never replaces a file without ``--force``, never an input even with it, and
  creates its file with the mode the umask gives;
* ``--epoch`` and ``--state`` are refused while the arguments are parsed.

No test here starts Spark.
"""

from __future__ import annotations

import argparse
import gzip
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from wcoj_core.cli.console import MAX_EPOCH, Parser, UsageError, epoch_argument, state_argument
from wcoj_core.cli.inputs import needs_spark, parse_changes, parse_inputs
from wcoj_core.cli.results import OutputFormat, add_output_arguments, check_output, write_tuples
from wcoj_core.errors import InputError
from wcoj_core.input_read import (
    MAX_LINE_BYTES,
    check_input_file,
    check_locally,
    is_local_input,
    negative_rows,
    read_local,
)
from wcoj_core.query.builtins import builtin

REPO = Path(__file__).resolve().parents[2]


def rows(table: pa.Table) -> Counter[tuple[int, ...]]:
    return Counter(zip(*(c.to_pylist() for c in table.columns), strict=True))


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "edges.txt"
    os.mkfifo(path)
    return path


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "edges.csv"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    yield path
    server.close()


# --- what is not a regular file -----------------------------------------------------------------


def test_the_command_refuses_a_named_pipe_at_once(fifo: Path) -> None:
    """The real ``wcoj count`` in a subprocess: a pipe nobody writes would block a reader."""
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "wcoj_core.cli",
            "count",
            "--query",
            "triangles",
            "--input",
            f"edge={fifo}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"wcoj: error: {fifo} (relation edge): is not a regular file (a named pipe); give a file"
    ]
    assert time.monotonic() - started < 60


def test_every_local_check_refuses_a_named_pipe_within_a_second(fifo: Path) -> None:
    """Each entry point, timed inside a subprocess (a hang would be killed by the timeout)."""
    script = textwrap.dedent(
        f"""
        import time
        from wcoj_core.errors import InputError
        from wcoj_core.input_read import check_input_file, check_locally, read_local
        for check in (
            lambda: check_input_file({str(fifo)!r}, "edge"),
            lambda: check_locally({str(fifo)!r}, 2, "edge"),
            lambda: read_local({str(fifo)!r}, 2, "edge"),
        ):
            started = time.monotonic()
            try:
                check()
            except InputError as error:
                print(round(time.monotonic() - started, 3), error)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    for line in lines:
        seconds, message = line.split(" ", 1)
        assert float(seconds) < 1.0
        assert (
            message == f"{fifo} (relation edge): is not a regular file (a named pipe); give a file"
        )


@pytest.mark.parametrize(
    ("path", "kind"),
    [("/dev/zero", "a character device"), ("/dev/null", "a character device")],
)
def test_devices_are_refused(path: str, kind: str) -> None:
    expected = f"{path} (relation edge): is not a regular file ({kind}); give a file"
    for check in (check_locally, read_local):
        with pytest.raises(InputError) as caught:
            check(path, 2, "edge")
        assert str(caught.value) == expected
    with pytest.raises(InputError, match="a character device"):
        parse_inputs([f"edge={path}"], builtin("triangles"))


def test_sockets_and_folders_that_are_not_parquet_are_refused(
    unix_socket: Path, tmp_path: Path
) -> None:
    with pytest.raises(InputError, match=r"is not a regular file \(a socket\); give a file$"):
        read_local(str(unix_socket), 2, "edge")
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    with pytest.raises(InputError, match=r"is not a regular file \(a directory\); give a file$"):
        check_input_file(str(folder), "edge")
    with pytest.raises(InputError, match="a directory"):
        parse_changes([f"edge={folder}"], builtin("triangles"))


def test_a_pipe_inside_a_parquet_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "edges"
    folder.mkdir()
    pq.write_table(pa.table({"a": [1], "b": [2]}), folder / "part-0.parquet")
    os.mkfifo(folder / "part-1.parquet")
    for check in (check_locally, read_local):
        with pytest.raises(InputError) as caught:
            check(str(folder), 2, "edge")
        assert str(caught.value) == (
            f"{folder} (relation edge) [{folder / 'part-1.parquet'}]: "
            "is not a regular file (a named pipe); give a file"
        )


def test_generators_and_remote_uris_are_not_local() -> None:
    assert not is_local_input("rmat:scale=10,edges=100")
    assert not is_local_input(" RMAT :scale=4")
    assert not is_local_input("s3a://bucket/edges.parquet")
    assert is_local_input("file:///tmp/edges.txt") and is_local_input("edges.txt")
    assert needs_spark({"a": "e.txt", "b": "rmat:scale=4"})
    assert not needs_spark({"a": "e.txt", "b": "file:///tmp/e.csv"})
    with pytest.raises(InputError, match="is not a file on this machine"):
        read_local("rmat:scale=4", 2, "edge")


# --- bounded reads ------------------------------------------------------------------------------


def test_the_pre_flight_check_reads_a_bounded_prefix(tmp_path: Path) -> None:
    """A small archive of a huge file: the check stops after its window, right or wrong."""
    bomb = tmp_path / "bomb.txt.gz"
    with gzip.open(bomb, "wb", compresslevel=1) as out:
        out.write(b"1 2\n")
        out.write(b"3 4\n" * (2 << 20))  # 8 MiB, twice the window
        out.write(b"5 x\n")
    assert bomb.stat().st_size < 1 << 20
    started = time.monotonic()
    check_locally(str(bomb), 2, "edge")  # the bad last line is past the window
    assert time.monotonic() - started < 5
    with pytest.raises(InputError, match=r"line 2097154, column 3: field 2 is not an integer"):
        read_local(str(bomb), 2, "edge")


def test_an_endless_line_is_refused_not_buffered(tmp_path: Path) -> None:
    endless = tmp_path / "endless.txt.gz"
    with gzip.open(endless, "wb", compresslevel=1) as out:
        out.write(b"1 2\n")
        zeros = b"0" * (16 << 20)
        for _ in range(MAX_LINE_BYTES // len(zeros) + 2):
            out.write(zeros)
    check_locally(str(endless), 2, "edge")  # no whole bad line within the window
    with pytest.raises(InputError) as caught:
        read_local(str(endless), 2, "edge")
    assert str(caught.value) == (
        f"{endless} (relation edge), line 2: is longer than 64 MiB; give a file whose lines each hold a tuple"
    )


# --- reading without Spark, as the commands do --------------------------------------------------


def test_negative_tuples_without_spark() -> None:
    table = pa.table({"c0": [1, 3, 4, 5], "c1": [2, 3, 5, 4], "time": [0, 0, 1, 1]})
    table = table.append_column("diff", pa.array([1, 1, -1, -2]))
    got = negative_rows(table)  # what Spark's tasks run too (`negative_tuples`)
    assert got.to_pydict() == {"c0": [4, 5], "c1": [5, 4], "diff": [-1, -2]}


def test_web_notredame_reads_in_well_under_a_second(shared_data: Path) -> None:
    path = str(shared_data / "web-NotreDame.txt.gz")
    read_local(path, 2, "edge")  # warm the caches
    started = time.monotonic()
    table = read_local(path, 2, "edge")
    assert time.monotonic() - started < 2.0  # typically 0.3 s; a shared machine is slower
    assert table.num_rows == 1_497_134


# --- --output -----------------------------------------------------------------------------------


TABLE = pa.table({"c0": [1, 2], "c1": [2, 3], "time": [0, 0], "diff": [1, -1]})


@pytest.fixture
def umask() -> Iterator[None]:
    previous = os.umask(0o027)
    yield
    os.umask(previous)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_output_is_created_with_the_umasks_mode(umask: None, tmp_path: Path, suffix: str) -> None:
    target = tmp_path / f"out{suffix}"
    assert write_tuples(TABLE, *check_output(str(target))) == 2
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # 0666 & ~0027, not mkstemp's 0600
    table = pq.read_table(target) if suffix == ".parquet" else pacsv.read_csv(target)
    assert table.column_names == ["c0", "c1", "diff"]
    assert rows(table) == Counter({(1, 2, 1): 1, (2, 3, -1): 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name], "no scratch file left"


def test_an_existing_output_needs_force(tmp_path: Path) -> None:
    target = tmp_path / "out.csv"
    target.write_text("keep me\n")
    with pytest.raises(UsageError, match=r"the file exists; pass --force to replace it$"):
        check_output(str(target))
    assert target.read_text() == "keep me\n"
    assert write_tuples(TABLE, *check_output(str(target), force=True), force=True) == 2
    assert target.read_text().splitlines()[0] == "c0,c1,diff"


def test_an_output_that_appears_meanwhile_is_not_replaced(tmp_path: Path) -> None:
    target = tmp_path / "out.parquet"
    checked = check_output(str(target))
    target.write_text("written by someone else")
    with pytest.raises(UsageError, match="the file exists"):
        write_tuples(TABLE, *checked)
    assert target.read_text() == "written by someone else"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_an_input_is_never_the_output(tmp_path: Path) -> None:
    edges = tmp_path / "edges.csv"
    edges.write_text("a,b\n1,2\n")
    linked = tmp_path / "linked.csv"
    os.link(edges, linked)
    symlinked = tmp_path / "symlinked.csv"
    symlinked.symlink_to(edges)
    folder = tmp_path / "rel"
    folder.mkdir()
    inputs = [str(edges), f"file://{folder}", "rmat:scale=4"]
    for target in (edges, linked, symlinked, f"{folder}/../edges.csv"):
        with pytest.raises(UsageError, match=r"is the input .*; write the output to another file"):
            check_output(str(target), force=True, inputs=inputs)
    with pytest.raises(UsageError, match="is inside the input folder"):
        check_output(str(folder / "out.parquet"), force=True, inputs=inputs)
    assert edges.read_text() == "a,b\n1,2\n"


def test_an_output_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.csv")
    with pytest.raises(UsageError, match="exists and is not a regular file"):
        check_output(str(tmp_path / "pipe.csv"), force=True)


def test_output_arguments() -> None:
    parser = Parser(prog="wcoj count")
    add_output_arguments(parser)
    args = parser.parse_args(["--output", "x.csv", "--force"])
    assert (args.output, args.force) == ("x.csv", True)
    assert parser.parse_args([]).force is False
    assert check_output("x.parquet")[1] is OutputFormat.PARQUET


# --- --epoch and --state ------------------------------------------------------------------------


def _epoch_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="wcoj apply")
    parser.add_argument("--epoch", type=epoch_argument, required=True)
    parser.add_argument("--state", type=state_argument, required=True)
    return parser


@pytest.mark.parametrize("epoch", ["0", "7", str(MAX_EPOCH)])
def test_good_epochs(epoch: str) -> None:
    args = _epoch_parser().parse_args(["--epoch", epoch, "--state", "s"])
    assert args.epoch == int(epoch) and args.state == "s"


@pytest.mark.parametrize(
    "epoch", ["-1", str(MAX_EPOCH + 1), str(10**30), "1.5", "", "1_000", "٣", "+3", "0x10"]
)
def test_bad_epochs_are_one_usage_line(epoch: str) -> None:
    with pytest.raises(UsageError) as caught:
        _epoch_parser().parse_args(["--epoch", epoch, "--state", "s"])
    message = str(caught.value)
    assert message == (
        f"--epoch {epoch!r}: give a whole number from 0 to 2**62 (4611686018427387904)"
    )


def test_an_empty_state_is_refused() -> None:
    with pytest.raises(UsageError, match=r"^--state is empty: pass a directory$"):
        _epoch_parser().parse_args(["--epoch", "1", "--state", ""])
