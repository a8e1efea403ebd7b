"""The project's input format and its one reader: integer edge lists, CSV, Parquet.

Contract: `read_local` reads a local text edge list, CSV or Parquet file (or folder) with
pyarrow and numpy into an Arrow table ``c0 .. c{arity-1}, diff`` (int64, no nulls), a multiset
(two equal lines give two rows), and refuses a bad file with one `InputError` naming the file,
the line and the column. `read_file_bytes` is the same reader over one file's bytes: what Spark's
tasks run (`wcoj_core.input_spark`), so a file reads the same on the driver and in Spark. The
dialect, by extension (a local folder is Parquet):

* text (``.txt``, ``.tsv``, no extension, ... and their ``.gz``): lines whose first non-blank
  character is ``#`` and blank lines are skipped; fields are separated by runs of spaces or tabs;
  ``\\r\\n`` and a lone ``\\r`` end a line; every data line carries exactly ``arity`` signed
  64-bit integers (ASCII digits, an optional sign), each with multiplicity 1.
* CSV with a header row (``.csv``, ``.csv.gz``): the first non-blank line names the columns;
  columns in file order apart from the one named ``diff`` (and ``time`` for updates). Fields
  are separated by ``,`` and may be quoted with ``"``, a quote enclosing a whole field;
  blanks around a value are dropped; a data line holds exactly one integer per column
  (`csv_fields`); lines of nothing but blanks and control characters are skipped.
* Parquet: integer columns that fit a signed 64-bit value (int8 .. int64, uint8 .. uint32),
  no nulls, ``diff`` optional and never zero; a folder's files (not ``_*`` or ``.*``) alike.

Only a file on this machine is local (`is_local_input`): a generator spec (``rmat:...``) or a
URI with a scheme other than ``file`` needs Spark. Nothing is read that is not a regular file (a
folder only for Parquet): `check_input_file` refuses a named pipe, a device or a socket from
``os.stat`` before anything is opened, and each open checks again (``O_NONBLOCK``, ``fstat``).

Text and CSV are read (gunzipped as they stream) in blocks of whole lines; a whole file is
read ahead on a thread (`_read_ahead`: the next blocks inflate while this one is parsed). A block
takes a fast path (text: the compiled kernel's `parse_text`, which takes exactly the dialect's
blank, comment and data lines and vouches for nothing else; CSV: pyarrow's CSV parser, after
checking that the block's bytes leave nothing to interpret); a block the fast path does not
vouch for is halved, and pieces of at most 64 KiB it still does not vouch for are read line by
line by the exact rules, which also find the first bad line. A line longer than
`MAX_LINE_BYTES` is refused rather than buffered.
`check_locally` is the pre-flight check: the same reading over at most the first
`LOCAL_CHECK_BYTES` decompressed bytes (a Parquet file's footers, and its values when small).
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import queue
import re
import stat
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from wcoj_core.errors import InputError, listed
from wcoj_core.kernel.native import native
from wcoj_core.store.location import Location
from wcoj_core.traces import DIFF, TIME, relation_columns

if TYPE_CHECKING:  # imported where used: pyarrow.compute and .parquet are slow to import
    import pyarrow.parquet as pq

# The pre-flight check reads at most this many (decompressed) bytes of a text or CSV file, and
# reads a Parquet file's values only when the files are at most this big.
LOCAL_CHECK_BYTES = 4 << 20
_BLOCK = 16 << 20  # text and CSV are parsed this many bytes of whole lines at a time
_AHEAD_BYTES = 4 << 20  # a whole stream is read (inflated) this much at a time, on a thread
_EXACT_BYTES = 64 << 10  # a piece the fast path does not vouch for is halved down to this
PARQUET_BATCH_ROWS = 1 << 20  # a Parquet file is read this many rows at a time
MAX_LINE_BYTES = 64 << 20  # a longer line is refused rather than buffered
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FIELD = re.compile(r"[^ \t\r]+")
_MIN_LONG, _MAX_LONG = -(2**63), 2**63 - 1
_TEXT_BYTES = b"0123456789+- \t\r\n"
_CSV_BYTES = _TEXT_BYTES + b',"'


Rows = list[pa.ChunkedArray]  # a block's rows: one int64 array per column of the file


def _rows(columns: Sequence[np.ndarray | pa.ChunkedArray]) -> Rows:
    """Columns as int64 Arrow arrays (numpy arrays wrapped, Arrow ones cast, neither copied)."""
    out: Rows = []
    for column in columns:
        if isinstance(column, np.ndarray):
            out.append(pa.chunked_array([column], pa.int64()))
        elif column.type == pa.int64():  # a cast would import pyarrow.compute for nothing
            out.append(column)
        else:
            out.append(column.cast(pa.int64()))
    return out


class Format(Enum):
    """How a relation file is encoded."""

    TEXT = "text"
    CSV = "csv"
    PARQUET = "parquet"


class Role(Enum):
    """What a column of a CSV or Parquet file holds."""

    DATA = "data"
    TIME = "time"
    DIFF = "diff"


def is_generator_spec(path: str) -> bool:
    """Whether `path` names a generated graph (``rmat:...``), as `wcoj_core.generate` tells,
    without importing Spark.

    >>> is_generator_spec("rmat:scale=10"), is_generator_spec("data/rmat.txt")
    (True, False)
    """
    return ":" in path and path.split(":", 1)[0].strip().lower() == "rmat"


def local_path(path: str) -> str | None:
    """The path on this machine behind `path`, or None for a remote URI or a generator spec.

    >>> local_path("file:///tmp/e.txt"), local_path("s3a://b/e.txt"), local_path("rmat:scale=4")
    ('/tmp/e.txt', None, None)
    """
    where = Location.of(path)
    return where.path if where.local and not is_generator_spec(path) else None


def is_local_input(path: str) -> bool:
    """Whether `read_local` can read `path`: a file here, not a generator spec or remote URI.

    >>> is_local_input("edges.txt.gz"), is_local_input("rmat:scale=10"), is_local_input("hdfs://e")
    (True, False, False)
    """
    return local_path(path) is not None


def detect_format(path: str) -> Format:
    """The format of `path`, from its extension (a local directory is Parquet).

    >>> detect_format("edges.txt.gz"), detect_format("e.CSV.gz"), detect_format("e.parquet")
    (<Format.TEXT: 'text'>, <Format.CSV: 'csv'>, <Format.PARQUET: 'parquet'>)
    """
    lowered = path.lower().rstrip("/")
    if lowered.endswith(".parquet"):
        return Format.PARQUET
    if lowered.endswith((".csv", ".csv.gz")):
        return Format.CSV
    local = local_path(path)
    if local is not None and os.path.isdir(local):
        return Format.PARQUET
    return Format.TEXT


def source_name(path: str, name: str) -> str:
    """How messages name relation `name`'s file: ``<path> (relation <name>)``."""
    return f"{path} (relation {name})"


# --- what may be opened -------------------------------------------------------------------------


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, for a message."""
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "a special file"


def _not_regular(kind: str, where: str) -> InputError:
    return InputError(f"is not a regular file ({kind}); give a file", where)


def check_input_file(path: str, name: str) -> None:
    """Refuse, from ``os.stat`` alone, a local input that cannot be read as relation `name`:
    missing, not a regular file (a folder only for Parquet, holding regular files) or unreadable.
    Remote URIs and generator specs are left alone.

    >>> try:
    ...     check_input_file("/dev/zero", "edge")
    ... except InputError as error:
    ...     print(error)
    /dev/zero (relation edge): is not a regular file (a character device); give a file
    """
    local = local_path(path)
    if local is None:
        return
    source = source_name(path, name)
    mode = _stat(local, source).st_mode
    if stat.S_ISDIR(mode) and detect_format(path) is Format.PARQUET:
        for file in _parquet_files(local, source):
            file_mode = _stat(file, f"{source} [{file}]").st_mode
            if not stat.S_ISREG(file_mode):
                raise _not_regular(_kind(file_mode), f"{source} [{file}]")
    elif not stat.S_ISREG(mode):
        raise _not_regular(_kind(mode), source)
    if not os.access(local, os.R_OK):
        raise InputError("cannot be read: permission denied", source)


def _stat(local: str, source: str) -> os.stat_result:
    try:
        return os.stat(local)
    except (FileNotFoundError, NotADirectoryError):
        raise InputError("no such file", source) from None
    except OSError as exc:
        raise InputError(f"cannot be read: {exc.strerror or exc}", source) from None


def _parquet_files(local: str, source: str) -> list[str]:
    """The data files of a Parquet file or folder (not those named ``_*`` or ``.*``)."""
    if not os.path.isdir(local):
        return [local]
    found: list[str] = []
    for root, dirs, files in os.walk(local):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        for d in dirs:
            if "=" in d:
                raise InputError(
                    f"cannot be read as Parquet: {os.path.join(root, d)} is a partition folder "
                    "(key=value); give a folder of Parquet files",
                    source,
                )
        found.extend(os.path.join(root, f) for f in sorted(files) if not f.startswith(("_", ".")))
    return found


@contextmanager
def _open_regular(local: str, where: str) -> Iterator[io.BufferedReader]:
    """`local` opened for reading, never blocking: refused unless it is a regular file."""
    try:
        fd = os.open(local, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError("no such file", where) from None
    except OSError as exc:
        raise InputError(f"cannot be read: {exc.strerror or exc}", where) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(_kind(mode), where)
    with os.fdopen(fd, "rb") as handle:
        yield handle


@contextmanager
def _decompressed(local: str, source: str, what: str) -> Iterator[io.BufferedIOBase]:
    """The bytes of a local text or CSV file, gunzipped when its name ends in ``.gz``."""
    with _open_regular(local, source) as raw:
        if not local.lower().endswith(".gz"):
            yield raw
            return
        with _unreadable(source, what), _gunzipped(raw) as unzipped:
            yield unzipped


def _gunzipped(raw: Any) -> io.BufferedIOBase:
    """A gzip stream inflated as it is read by ISA-L (`isal.igzip`: gzip's format, members and
    errors, a faster inflate); a stream without gzip's magic is refused here, as `gzip.GzipFile`
    does."""
    from isal import igzip

    at = raw.tell()
    head = raw.read(2)
    raw.seek(at)
    if len(head) == 2 and head != b"\x1f\x8b":
        raise gzip.BadGzipFile(f"Not a gzipped file ({head!r})")
    return igzip.GzipFile(fileobj=raw, mode="rb")


def _inflate_errors() -> tuple[type[BaseException], ...]:
    """What inflating a damaged stream raises: zlib's error, or ISA-L's (imported only when an
    exception is matched against it)."""
    from isal import isal_zlib

    isal_error: type[BaseException] = isal_zlib.error  # pyright: ignore[reportAssignmentType] (its stub says an instance)
    return (zlib.error, isal_error)


@contextmanager
def _unreadable(source: str, what: str) -> Iterator[None]:
    """A damaged compressed file, refused (``cannot be read as ...``)."""
    try:
        yield
    except gzip.BadGzipFile:
        raise InputError(f"cannot be read as {what}: not a gzip file", source) from None
    except EOFError:
        raise InputError(
            f"cannot be read as {what}: the compressed stream ends early (a truncated file)",
            source,
        ) from None
    except _inflate_errors() as exc:
        raise InputError(
            f"cannot be read as {what}: damaged compressed data ({exc})", source
        ) from None


class _Lines:
    """The whole lines of a byte stream, a block at a time. A line ends at ``\\n``, ``\\r\\n`` or
    a lone ``\\r``; each block is rewritten so that only ``\\n`` or ``\\r\\n`` end its lines, a
    leading byte order mark dropped. With `limit`, only the lines wholly within the first `limit`
    bytes; `complete` says whether that was all."""

    def __init__(
        self, handle: io.BufferedIOBase, source: str, what: str, limit: int | None = None
    ) -> None:
        self.handle, self.source, self.what, self.limit = handle, source, what, limit
        self.complete = True

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """``(number of the block's first line, block)``, the blocks in order."""
        if self.limit is not None:
            yield from self._blocks(self.handle.read, _BLOCK)
            return
        with _read_ahead(self.handle.read, _AHEAD_BYTES) as read:
            yield from self._blocks(read, _AHEAD_BYTES)

    def _blocks(self, read: Callable[[int], bytes], size: int) -> Iterator[tuple[int, bytes]]:
        line, carry, start, budget = 1, b"", True, self.limit
        while True:
            # One byte past the limit tells whether the stream goes on.
            want = size if budget is None else min(size, budget + 1)
            with _unreadable(self.source, self.what):
                data = read(want)
            if budget is not None:
                if len(data) > budget:
                    data, self.complete = data[:budget], False
                budget -= len(data)
            buffer = carry + data
            if start and (len(buffer) >= 3 or not data):
                buffer, start = buffer.removeprefix(b"\xef\xbb\xbf"), False
            if not data or not self.complete:  # the end of the stream, or of the window
                end = len(buffer) if self.complete else _last_break(buffer, final=True)
                if end:
                    yield line, _normalize(buffer[:end])
                return
            end = _last_break(buffer, final=False)
            if end == 0:
                if len(buffer) > MAX_LINE_BYTES:
                    raise InputError(
                        f"is longer than {MAX_LINE_BYTES >> 20} MiB; give a file whose lines each hold a tuple",
                        self.source,
                        line,
                    )
                carry = buffer
                continue
            block, carry = _normalize(buffer[:end]), buffer[end:]
            yield line, block
            line += native.newlines(block)


@contextmanager
def _read_ahead(read: Callable[[int], bytes], size: int) -> Iterator[Callable[[int], bytes]]:
    """A reader of what `read` reads, `size` bytes a call whatever it is asked for (`_Lines`
    asks for `size`): the next blocks are read on a thread while the caller parses this one (a
    gzip stream is inflated beside the parsing: ISA-L and the compiled reader release the GIL).
    An error of the read is raised where its block would have come; leaving the context stops
    the thread before the stream can be closed."""
    ahead: queue.Queue[tuple[bytes, BaseException | None]] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def work() -> None:
        try:
            while not stop.is_set():
                data = read(size)
                ahead.put((data, None))
                if not data:
                    return
        except BaseException as error:  # handed to the reader, raised there
            ahead.put((b"", error))

    worker = threading.Thread(target=work, name="wcoj-read-ahead", daemon=True)
    worker.start()

    def next_block(_: int) -> bytes:
        data, error = ahead.get()
        if error is not None:
            raise error
        return data

    try:
        yield next_block
    finally:
        stop.set()
        while worker.is_alive():  # a worker waiting to hand over a block is let go
            with suppress(queue.Empty):
                ahead.get(timeout=0.05)
        worker.join()


def _last_break(buffer: bytes, *, final: bool) -> int:
    """Where the last whole line of `buffer` ends (0 if none): after a ``\\n`` or a ``\\r``.

    A ``\\r`` at the very end counts only when nothing follows (`final`): a ``\\n`` may come next.
    """
    last_cr = buffer.rfind(b"\r", 0, len(buffer) if final else len(buffer) - 1)
    return max(buffer.rfind(b"\n"), last_cr) + 1


def _normalize(block: bytes) -> bytes:
    """`block` with every lone ``\\r`` made a ``\\n`` (``\\r\\n`` stays, as one line end)."""
    if b"\r" in block and native.lone_returns(block):
        return block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return block


def _text_lines(block: bytes) -> list[str]:
    """The lines of a block: UTF-8 (bad bytes replaced), no line end."""
    lines = block.decode("utf-8", "replace").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [t[:-1] if t.endswith("\r") else t for t in lines]


# --- text ---------------------------------------------------------------------------------------


def check_text_line(line: str, arity: int) -> tuple[str, int] | None:
    """The problem with one line of a text edge list, as ``(message, column)``, or None if fine.

    Comment and blank lines are fine. The column is 1-based and points at the offending field.

    >>> check_text_line("# Nodes: 5", 2) is None, check_text_line("1\\t2\\r", 2) is None
    (True, True)
    >>> check_text_line("  7 x9", 2)
    ("field 2 is not an integer: 'x9'", 5)
    >>> check_text_line("1 2 3", 2)
    ('expected 2 fields, found 3', 5)
    """
    stripped = line.strip(" \t\r")
    if not stripped or stripped.startswith("#"):
        return None
    fields = list(_FIELD.finditer(line))
    if len(fields) > arity:
        return f"expected {arity} fields, found {len(fields)}", fields[arity].start() + 1
    if len(fields) < arity:
        return f"expected {arity} fields, found {len(fields)}", len(line.rstrip(" \t\r")) + 1
    for index, field in enumerate(fields, 1):
        problem = integer_problem(field.group())
        if problem is not None:
            return f"field {index} {problem}", field.start() + 1
    return None


def _text_rows(lines: _Lines, arity: int) -> Iterator[Rows]:
    """The rows of a text edge list, block by block, as they are read."""
    for first, block in lines:
        out: list[Rows] = []
        _by_halves(
            block,
            first,
            lambda b: _text_fast(b, arity),
            lambda b, line: _text_exact(b, line, arity, lines.source),
            out,
        )
        yield from out


def _by_halves(
    block: bytes,
    first: int,
    fast: Callable[[bytes], Rows | None],
    exact: Callable[[bytes, int], Rows],
    out: list[Rows],
) -> None:
    """Append the rows of `block` (whole lines, the first numbered `first`) to `out`: by `fast`
    where it vouches for them, halving the block where it does not, down to pieces of at most
    `_EXACT_BYTES` that `exact` reads line by line (raising the first bad line's error, so the
    halves go in order)."""
    rows = fast(block)
    if rows is not None:
        out.append(rows)
        return
    middle = block.find(b"\n", len(block) // 2) + 1
    if len(block) <= _EXACT_BYTES or middle in (0, len(block)):
        out.append(exact(block, first))
        return
    _by_halves(block[:middle], first, fast, exact, out)
    _by_halves(block[middle:], first + block.count(b"\n", 0, middle), fast, exact, out)


def _text_fast(block: bytes, arity: int) -> Rows | None:
    """The rows of a block when nothing in it needs the exact rules; None otherwise: the
    compiled reader (`parse_text`) takes blank and comment lines and fields of digits and
    signs apart by blanks, and vouches for nothing else."""
    cap = len(block) // (2 * arity) + 1  # a data line holds at least two bytes a field
    out = np.empty(arity * cap, dtype=np.int64)
    rows = native.parse_text(block, arity, out, cap)
    if rows < 0:
        return None
    # Copied: Arrow wraps an array without copying, and a view would keep all of `out` (sized
    # for a line of two bytes a field) alive while the landing holds the block's rows.
    return _rows([out[j * cap : j * cap + rows].copy() for j in range(arity)])


def arrow_owned(data: bytes) -> pa.Buffer:
    """`data` copied into memory Arrow owns, for Arrow's threaded readers.

    A buffer over Python's memory (``pa.py_buffer``) takes the GIL when it is released, and a
    threaded reader's last reference may be dropped by one of Arrow's threads after the read
    returned: when the interpreter is exiting by then (a command refusing its input right after
    reading it), that thread is ended inside the buffer's destructor and the process aborts
    (``terminate called without an active exception``, exit status -6).
    """
    buffer = pa.allocate_buffer(len(data))
    memoryview(buffer).cast("B")[:] = data
    return buffer


def _arrow_csv(body: bytes, width: int, delimiter: str, *, quoted: bool) -> pa.Table | None:
    """`body` parsed by pyarrow as `width` int64 columns; None where it refuses anything."""
    names = [f"_f{i}" for i in range(width)]
    try:
        return pacsv.read_csv(
            arrow_owned(body),
            read_options=pacsv.ReadOptions(column_names=names),
            parse_options=pacsv.ParseOptions(
                delimiter=delimiter,
                quote_char='"' if quoted else False,
                double_quote=False,
                escape_char=False,
                newlines_in_values=False,
                ignore_empty_lines=True,
            ),
            convert_options=pacsv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.int64()),
                null_values=[],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _text_exact(block: bytes, first: int, arity: int, source: str) -> Rows:
    """The rows of a block line by line, raising the first bad line's `InputError`."""
    rows: list[list[int]] = []
    for number, line in enumerate(_text_lines(block), first):
        problem = check_text_line(line, arity)
        if problem is not None:
            raise InputError(problem[0], source, number, problem[1])
        fields = _FIELD.findall(line)
        if fields and not fields[0].startswith("#"):
            rows.append([int(f) for f in fields])
    return _rows(list(np.array(rows, dtype=np.int64).reshape(-1, arity).T))


# --- CSV ----------------------------------------------------------------------------------------


def blank_csv_line(text: str) -> bool:
    """Whether the CSV line `text` is skipped: nothing but spaces and control characters.

    >>> blank_csv_line(" \\t\\x0c"), blank_csv_line("\\xa0"), blank_csv_line(",")
    (True, False, False)
    """
    return all(c <= " " for c in text)


def csv_header(
    first: str, arity: int, source: str, with_time: bool
) -> tuple[list[str], list[Role]]:
    """The column names of a CSV file's first non-empty line and their roles, checked."""
    header = next(csv.reader([first]))
    if all(_INT.fullmatch(h.strip()) for h in header):
        raise InputError(
            "the first line looks like data; a CSV file needs a header row naming its columns",
            source,
            1,
            1,
        )
    return header, assign_roles(header, arity, source, with_time, line=1)


class _LineProblem(Exception):
    def __init__(self, message: str, column: int | None) -> None:
        super().__init__(message)
        self.message, self.column = message, column


def check_csv_line(
    text: str, header: Sequence[str], roles: Sequence[Role]
) -> tuple[str, int | None] | None:
    """The problem with CSV data line `text` (see `csv_fields`), as ``(message, column)``, or
    None when it holds one integer per header column.

    >>> check_csv_line('"1", 2', ["a", "b"], [Role.DATA] * 2) is None
    True
    >>> check_csv_line('1,"2"3', ["a", "b"], [Role.DATA] * 2)
    ('has malformed quoting (\\',\\' expected after \\'"\\'); quote a whole field, on one line', 6)
    """
    try:
        _csv_values(text, header, roles)
    except _LineProblem as problem:
        return problem.message, problem.column
    return None


def csv_fields(line: str) -> list[str]:
    """The fields of one CSV line, in the project's dialect: separated by ``,``; a field may
    be quoted with ``"`` (``""`` inside it is one quote), the quotes then enclosing the whole
    field; no line break inside a field. Blanks (spaces, tabs) around a value are not part of
    it, and are dropped when the field is read as an integer. Raises `csv.Error` for broken
    quoting (a closing quote followed by anything but ``,`` or the line's end, a quote left
    open).

    >>> csv_fields('1,"2", 3'), csv_fields('""')
    (['1', '2', ' 3'], [''])
    """
    return next(csv.reader([line], strict=True), [])


def _csv_values(text: str, header: Sequence[str], roles: Sequence[Role]) -> list[int]:
    """The values of an accepted CSV data line, in file order; else `_LineProblem`."""
    try:
        cells = csv_fields(text)
    except csv.Error as exc:
        raise _LineProblem(
            f"has malformed quoting ({exc}); quote a whole field, on one line",
            _quoting_column(text),
        ) from None
    width = len(header)
    if len(cells) != width:
        column = len(cells) + 1 if len(cells) < width else width + 1
        raise _LineProblem(f"has {len(cells)} fields but the header has {width}", column)
    values: list[int] = []
    for index, (cell, name, role) in enumerate(zip(cells, header, roles, strict=True), 1):
        problem = integer_problem(cell.strip(" \t"))
        if problem is None and role is Role.DIFF and int(cell) == 0:
            problem = "is zero; a diff must be a non-zero multiplicity"
        if problem is not None:
            raise _LineProblem(f"value in column {name!r} {problem}", index)
        values.append(int(cell))
    return values


def _quoting_column(text: str, limit: int = 4096) -> int | None:
    """The 1-based column where strict CSV parsing of the line `text` fails.

    >>> _quoting_column('1,"2"3'), _quoting_column('1,"2')
    (6, 3)
    """
    if len(text) > limit:
        return None
    for end in range(1, len(text) + 1):
        try:
            next(csv.reader([text[:end]], strict=True))
        except csv.Error as exc:
            if "unexpected end of data" not in str(exc):
                return end
    # Only an unclosed quote is left: point at the quote that opens the last field.
    return text.rfind(',"') + 2 if text.rfind(',"') >= 0 else text.find('"') + 1


def _csv_rows(lines: _Lines, arity: int, with_time: bool) -> Iterator[tuple[list[Role], Rows]]:
    """The rows of a CSV file (one int64 array per column and block), each with the roles of
    the file's columns, as they are read."""
    source = lines.source
    header: list[str] | None = None
    roles: list[Role] = []
    dropped = False  # the first non-blank line is the header
    for first, block in lines:
        out: list[Rows] = []
        start, number = 0, first
        while not dropped and start < len(block):
            end = block.find(b"\n", start)
            end = len(block) if end < 0 else end + 1
            (text,) = _text_lines(block[start:end])
            if header is None and text != "":
                header, roles = csv_header(text, arity, source, with_time)
            dropped = not blank_csv_line(text)
            start, number = end, number + 1
        if header is None or start >= len(block):
            continue
        _by_halves(
            block[start:],
            number,
            partial(_csv_fast, roles=roles),
            partial(_csv_exact, header=header, roles=roles, source=source),
            out,
        )
        for rows in out:
            yield roles, rows
    if header is None and lines.complete:
        raise InputError("has no data rows (the file is empty)", source)


def _csv_fast(body: bytes, roles: Sequence[Role]) -> Rows | None:
    """The rows of a block of CSV lines when pyarrow reads them as `csv_fields` does; else None."""
    if body.translate(None, _CSV_BYTES):
        return None
    quoted = b'"' in body
    if quoted and not _whole_fields_quoted(body):
        return None
    table = _arrow_csv(body, len(roles), ",", quoted=quoted)
    if table is None or any(c.null_count for c in table.columns):
        return None
    if Role.DIFF in roles and (_numbers(table.column(roles.index(Role.DIFF))) == 0).any():
        return None
    return _rows(table.columns)


def _whole_fields_quoted(body: bytes) -> bool:
    """Whether every quote of a block of CSV lines opens or closes a whole field, with no
    delimiter or line end inside: then pyarrow and `csv_fields` agree on what the fields hold."""
    buffer = np.frombuffer(body, dtype=np.uint8)
    quotes = np.flatnonzero(buffer == ord('"'))
    if len(quotes) % 2:
        return False
    opening, closing = quotes[0::2], quotes[1::2]
    ends = (buffer == ord(",")) | (buffer == ord("\n")) | (buffer == ord("\r"))
    before = np.concatenate(([True], ends))[opening]  # the line start counts as an end
    after = np.concatenate((ends, [True]))[closing + 1]
    separators = np.flatnonzero(ends)
    inside = np.searchsorted(separators, closing) - np.searchsorted(separators, opening)
    return bool(before.all() and after.all() and not inside.any())


def _csv_exact(
    body: bytes, first: int, header: Sequence[str], roles: Sequence[Role], source: str
) -> Rows:
    """The rows of a block of CSV lines line by line, raising the first bad line's error."""
    rows = []
    for number, text in enumerate(_text_lines(body), first):
        if blank_csv_line(text):
            continue
        try:
            rows.append(_csv_values(text, header, roles))
        except _LineProblem as problem:
            raise InputError(problem.message, source, number, problem.column) from None
    return _rows(list(np.array(rows, dtype=np.int64).reshape(-1, len(roles)).T))


# --- Parquet ------------------------------------------------------------------------------------

# The Parquet column types a relation takes: the integers that fit a signed 64-bit value (an
# all-null column, stored as int32, is refused row by row: "value is null").
_INTEGERS = frozenset(
    [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.null()]
)


def type_name(kind: pa.DataType) -> str:
    """How a message names a Parquet column's type: Arrow's name (a dictionary's values').

    >>> type_name(pa.uint64()), type_name(pa.list_(pa.int32())), type_name(pa.dictionary(pa.int8(), pa.string()))
    ('uint64', 'list<item: int32>', 'string')
    """
    if pa.types.is_dictionary(kind):
        return type_name(kind.value_type)
    return str(kind)


def _parquet_schema(local: str, files: Sequence[str], source: str) -> list[pq.ParquetFile]:
    """The files opened (their footers read), refused unless they read as one relation."""
    opened = [_parquet_file(f, source if f == local else f"{source} [{f}]") for f in files]
    return _checked_schema(opened, files, source)


def _checked_schema(
    opened: list[pq.ParquetFile], files: Sequence[str], source: str
) -> list[pq.ParquetFile]:
    """`opened` (the Parquet `files`, footers read), refused unless they read as one relation."""
    if not opened:
        raise InputError("cannot be read as Parquet: the folder holds no Parquet files", source)
    schema = opened[0].schema_arrow
    for file, other in zip(files[1:], opened[1:], strict=True):
        if not other.schema_arrow.equals(schema):
            raise InputError(
                f"cannot be read as Parquet: its files have different columns ({files[0]}: "
                f"{schema.names}, {file}: {other.schema_arrow.names})",
                source,
            )
    seen: dict[str, str] = {}
    for name in schema.names:
        if name.lower() in seen:
            raise InputError(
                f"cannot be read as Parquet: the column `{seen[name.lower()]}` already exists "
                "(column names are compared without case); rename one",
                source,
            )
        seen[name.lower()] = name
    for field in schema:
        if field.type not in _INTEGERS:
            raise InputError(
                f"column {field.name!r} has type {type_name(field.type)}; "
                "relation columns must be integers (int8 .. int64)",
                source,
                column=field.name,
            )
    return opened


def _parquet_file(file: str, where: str) -> pq.ParquetFile:

    with _open_regular(file, where) as handle:
        size = os.fstat(handle.fileno()).st_size
        if not size:
            return _parquet_buffer(pa.allocate_buffer(0), where)
        # Mapped by Arrow, not Python (see `arrow_owned`).
        return _parquet_buffer(pa.memory_map(file), where)


def _parquet_buffer(content: pa.Buffer | pa.NativeFile, where: str) -> pq.ParquetFile:
    """A Parquet file over Arrow-owned bytes or an Arrow file (never a buffer over Python
    memory: see `arrow_owned`)."""
    import pyarrow.parquet as pq

    try:
        source = content if isinstance(content, pa.NativeFile) else pa.BufferReader(content)
        return pq.ParquetFile(source)
    except (OSError, ValueError, pa.ArrowException) as exc:
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise InputError(f"cannot be read as Parquet: {reason}", where) from None


def _read_parquet(
    local: str, arity: int, source: str, with_time: bool, values: bool
) -> tuple[list[Role], list[Rows]]:
    """The roles of a Parquet file's columns and (when `values`) its rows, file by file."""
    roles, rows = _parquet_rows(local, arity, source, with_time)
    return roles, list(rows) if values else []


def _parquet_rows(
    local: str, arity: int, source: str, with_time: bool
) -> tuple[list[Role], Iterator[Rows]]:
    """The roles of a Parquet file's columns (from its footers, at once) and its rows, a
    record batch of at most `PARQUET_BATCH_ROWS` rows at a time (read as they are asked for)."""
    files = _parquet_files(local, source)
    opened = _parquet_schema(local, files, source)
    wheres = [source if file == local else f"{source} [{file}]" for file in files]
    return _parquet_blocks(opened, wheres, arity, source, with_time)


def _parquet_blocks(
    opened: Sequence[pq.ParquetFile],
    wheres: Sequence[str],
    arity: int,
    source: str,
    with_time: bool,
    *,
    require_rows: bool = True,
) -> tuple[list[Role], Iterator[Rows]]:
    """The roles of opened Parquet files' columns and their rows (`wheres`: how messages name
    each file; `require_rows`: refuse files that hold no row between them)."""
    names = opened[0].schema_arrow.names
    roles = assign_roles(names, arity, source, with_time, line=None)
    if require_rows and sum(f.metadata.num_rows for f in opened) == 0:
        raise InputError("has no data rows", source)

    def rows() -> Iterator[Rows]:
        for where, parquet in zip(wheres, opened, strict=True):
            first = 0  # the file's row number of the batch's first row, less one
            batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS)
            while True:
                try:
                    batch = next(batches, None)
                except (OSError, ValueError, pa.ArrowException) as exc:
                    reason = " ".join(str(exc).split())[:300] or type(exc).__name__
                    raise InputError(f"cannot be read as Parquet: {reason}", where) from None
                if batch is None:
                    break
                table = pa.Table.from_batches([batch])
                _check_cells(table, names, roles, where, first)
                first += table.num_rows
                yield _rows(table.columns)

    return roles, rows()


def _check_cells(
    table: pa.Table, names: Sequence[str], roles: Sequence[Role], where: str, first: int
) -> None:
    """Refuse a null value, or a zero diff, naming its row (`first` rows came before)."""
    bad = np.zeros(table.num_rows, dtype=bool)
    for column, role in zip(table.columns, roles, strict=True):
        bad |= _bad_cells(column, role)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        for name, column, role in zip(names, table.columns, roles, strict=True):
            if _bad_cells(column.slice(row, 1), role)[0]:
                problem = "is null" if column[row].as_py() is None else "is zero"
                if problem == "is zero":
                    problem += "; a diff must be a non-zero multiplicity"
                raise InputError(f"value {problem}", where, first + row + 1, name)


def _bad_cells(column: pa.ChunkedArray, role: Role) -> np.ndarray:
    bad = np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if role is Role.DIFF and not pa.types.is_null(column.type):
        bad |= np.asarray(column.fill_null(1).to_numpy(zero_copy_only=False)) == 0
    return bad


def _numbers(column: pa.ChunkedArray) -> np.ndarray:
    """An integer column as an int64 numpy array."""
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


# --- reading and checking -----------------------------------------------------------------------


def read_local(path: str, arity: int, name: str, *, with_time: bool = False) -> pa.Table:
    """Relation `name` of `arity` from local `path`, without Spark: the file's rows (a multiset)
    as int64 ``c0 .. c{arity-1}, [time,] diff``; an `InputError` naming the line and column for a
    bad file, ``cannot be read as <format>: <why>`` for one that does not decompress or read.

    >>> import pathlib, tempfile
    >>> edges = pathlib.Path(tempfile.mkdtemp()) / "e.txt"
    >>> _ = edges.write_text("# a graph\\n1\\t2\\n2 3\\n")
    >>> read_local(str(edges), 2, "edge").to_pydict()
    {'c0': [1, 2], 'c1': [2, 3], 'diff': [1, 1]}
    """
    return read_local_batches(path, arity, name, with_time=with_time).read_all()


def read_local_batches(
    path: str, arity: int, name: str, *, with_time: bool = False
) -> pa.RecordBatchReader:
    """`read_local` as a stream of record batches, a block of the file at a time: a bad line
    raises when its block is read, an empty file after the last.

    >>> import pathlib, tempfile
    >>> edges = pathlib.Path(tempfile.mkdtemp()) / "e.txt"
    >>> _ = edges.write_text("1 2\\n2 3\\n")
    >>> reader = read_local_batches(str(edges), 2, "edge")
    >>> reader.schema.names, reader.read_all().num_rows
    (['c0', 'c1', 'diff'], 2)
    """
    local = local_path(path)
    source = source_name(path, name)
    if local is None:
        raise InputError("is not a file on this machine; it is read through Spark", source)
    check_arity(arity, source)
    check_input_file(path, name)
    kind = detect_format(path)
    if with_time and kind is Format.TEXT:
        raise InputError(
            "update files must be CSV or Parquet with 'time' and 'diff' columns; "
            "a plain-text edge list cannot carry them",
            source,
        )
    names = [*relation_columns(arity), *([TIME] if with_time else []), DIFF]
    schema = pa.schema([pa.field(n, pa.int64()) for n in names])

    def batches() -> Iterator[pa.RecordBatch]:
        rows = 0
        for roles, block in _stream(local, kind, arity, source, with_time):
            if not len(block[0]):
                continue
            rows += len(block[0])
            table = _relation([block], roles, arity)
            if not table.schema.equals(schema):
                table = table.cast(schema)
            yield from table.combine_chunks().to_batches()
        if rows == 0:
            raise InputError("has no data rows", source)

    return pa.RecordBatchReader.from_batches(schema, batches())


def check_locally(path: str, arity: int, name: str, *, window: int = LOCAL_CHECK_BYTES) -> None:
    """Refuse a bad local relation file cheaply, with the message `read_local` would give: from
    ``os.stat``; the lines within the first `window` decompressed bytes of a text or CSV file; a
    Parquet file's footers (and values, when small). What does not decompress or whose footer
    does not read is left to the full read; generator specs and remote paths are left alone.

    >>> import pathlib, tempfile
    >>> bad = pathlib.Path(tempfile.mkdtemp()) / "e.txt"
    >>> _ = bad.write_text("1 2\\n3 x\\n")
    >>> try:
    ...     check_locally(str(bad), 2, "edge")
    ... except InputError as error:
    ...     print(error.line, error.column, str(error).split(": ", 1)[1])
    2 3 field 2 is not an integer: 'x'
    """
    local = local_path(path)
    if local is None:
        return
    source = source_name(path, name)
    check_arity(arity, source)
    check_input_file(path, name)
    kind = detect_format(path)
    try:
        _, blocks = _read(local, kind, arity, source, False, limit=window)
    except InputError as error:
        if "cannot be read as" in str(error):
            return  # a damaged file: the full read reports it
        raise
    if blocks is not None and not any(len(b[0]) for b in blocks):
        raise InputError("has no data rows", source)


def _read(
    local: str, kind: Format, arity: int, source: str, with_time: bool, limit: int | None
) -> tuple[list[Role], list[Rows] | None]:
    """Roles and row blocks of a local file; with `limit`, of its first `limit` bytes only, and
    blocks None when what was read cannot tell whether the file has data rows."""
    if kind is Format.PARQUET:
        files = _parquet_files(local, source)
        small = limit is None or sum(os.stat(f).st_size for f in files) <= limit
        roles, blocks = _read_parquet(local, arity, source, with_time, values=small)
        return roles, blocks if small else None
    what = "text" if kind is Format.TEXT else "CSV"
    with _decompressed(local, source, what) as handle:
        lines = _Lines(handle, source, what, limit)
        if kind is Format.TEXT:
            roles, blocks = [Role.DATA] * arity, list(_text_rows(lines, arity))
        else:
            roles, blocks = [Role.DATA] * arity, []
            for found, rows in _csv_rows(lines, arity, with_time):
                roles = found
                blocks.append(rows)
    return roles, blocks if lines.complete else None


def _stream(
    local: str, kind: Format, arity: int, source: str, with_time: bool
) -> Iterator[tuple[list[Role], Rows]]:
    """A local file's rows block by block, each with the roles of the file's columns (the
    file is opened when the first block is asked for and closed after the last)."""
    if kind is Format.PARQUET:
        roles, rows = _parquet_rows(local, arity, source, with_time)
        for block in rows:
            yield roles, block
        return
    what = "text" if kind is Format.TEXT else "CSV"
    with _decompressed(local, source, what) as handle:
        yield from _line_blocks(handle, kind, arity, source, with_time)


def _line_blocks(
    handle: io.BufferedIOBase | pa.BufferReader,
    kind: Format,
    arity: int,
    source: str,
    with_time: bool,
) -> Iterator[tuple[list[Role], Rows]]:
    """A text or CSV file's rows block by block, from its (decompressed) bytes."""
    lines = _Lines(handle, source, "text" if kind is Format.TEXT else "CSV", None)  # type: ignore[arg-type]
    if kind is Format.TEXT:
        data = [Role.DATA] * arity
        for block in _text_rows(lines, arity):
            yield data, block
    else:
        yield from _csv_rows(lines, arity, with_time)


def read_file_bytes(
    content: pa.Buffer, file: str, arity: int, source: str, *, with_time: bool = False
) -> Iterator[pa.RecordBatch]:
    """One file's rows from its bytes, as `read_local_batches` reads them from disk: what a
    Spark task is handed (`wcoj_core.input_spark` reads files Spark reaches through it). `file`
    names the file (its extension tells the format, ``.gz`` the compression); `source` is how
    messages name it. A bad line raises the `InputError` the local read raises; a file with no
    data row gives no batch (the caller tells a relation with none)."""
    kind = detect_format(file)
    names = [*relation_columns(arity), *([TIME] if with_time else []), DIFF]
    schema = pa.schema([pa.field(n, pa.int64()) for n in names])
    if kind is Format.PARQUET:
        opened = _checked_schema([_parquet_buffer(content, source)], [file], source)
        roles, rows = _parquet_blocks(
            opened, [source], arity, source, with_time, require_rows=False
        )
        blocks: Iterator[tuple[list[Role], Rows]] = ((roles, block) for block in rows)
    else:
        what = "text" if kind is Format.TEXT else "CSV"
        raw = pa.BufferReader(content)
        with _unreadable(source, what):
            handle = _gunzipped(raw) if file.lower().endswith(".gz") else raw
        blocks = _line_blocks(handle, kind, arity, source, with_time)  # type: ignore[arg-type]
    for roles, block in blocks:
        if len(block[0]):
            table = _relation([block], roles, arity)
            yield from table.cast(schema).combine_chunks().to_batches()


def _relation(blocks: Sequence[Rows], roles: Sequence[Role], arity: int) -> pa.Table:
    """The ``c0 .. c{k-1}, [time,] diff`` table of blocks of rows whose columns have `roles`."""

    def column(index: int) -> pa.ChunkedArray:
        return pa.chunked_array([c for b in blocks for c in b[index].chunks], pa.int64())

    data = [column(i) for i, role in enumerate(roles) if role is Role.DATA]
    names = relation_columns(arity)
    if Role.TIME in roles:
        data.append(column(roles.index(Role.TIME)))
        names.append(TIME)
    if Role.DIFF in roles:
        diff = column(roles.index(Role.DIFF))
    else:  # ones in memory Arrow owns (see `wcoj_core.arrow.long_array`)
        n = sum(len(b[0]) for b in blocks)
        ones = pa.allocate_buffer(8 * n)
        np.frombuffer(ones, dtype=np.int64)[:] = 1
        diff = pa.chunked_array([pa.Array.from_buffers(pa.int64(), n, [None, ones])])
    return pa.table([*data, diff], names=[*names, DIFF])


# --- shared checks ------------------------------------------------------------------------------


def assign_roles(
    header: Sequence[str], arity: int, source: str, with_time: bool, line: int | None
) -> list[Role]:
    """Give each file column a role, checking the counts and the required columns."""
    roles: list[Role] = []
    for index, name in enumerate(header, 1):
        key = name.strip().lower()
        column: int | str = index if line is not None else name
        if key == TIME and not with_time:
            raise InputError(
                "a relation file must not carry a 'time' column: times come from the epoch "
                "(use an update file to give explicit times)",
                source,
                line,
                column,
            )
        role = Role.TIME if key == TIME else Role.DIFF if key == DIFF else Role.DATA
        if role is not Role.DATA and role in roles:
            raise InputError(f"has more than one {key!r} column", source, line, column)
        roles.append(role)
    data = [name for name, role in zip(header, roles, strict=True) if role is Role.DATA]
    if len(data) != arity:
        raise InputError(
            f"has {len(data)} data columns {listed(data)}, expected {arity} (plus an optional "
            "'diff')",
            source,
            line,
        )
    for required in (Role.TIME, Role.DIFF) if with_time else ():
        if required not in roles:
            raise InputError(
                f"an update file needs a {required.value!r} column; found columns {listed(header)}",
                source,
                line,
            )
    return roles


def integer_problem(text: str) -> str | None:
    """Why `text` is not a signed 64-bit integer, or None when it is.

    >>> integer_problem("-12"), integer_problem("1.5"), integer_problem("9" * 20)
    (None, "is not an integer: '1.5'", "is out of the signed 64-bit range: '99999999999999999999'")
    """
    if text == "":
        return "is empty"
    if not _INT.fullmatch(text):
        return f"is not an integer: {_show(text)}"
    if not _MIN_LONG <= int(text) <= _MAX_LONG:
        return f"is out of the signed 64-bit range: {_show(text)}"
    return None


def _show(text: str, limit: int = 24) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def check_arity(arity: int, source: str) -> None:
    """Refuse an arity that is not a positive integer."""
    if isinstance(arity, bool) or not isinstance(arity, int) or arity < 1:
        raise InputError(f"arity must be a positive integer, got {arity!r}", source)


# --- undirected relations and signed multiplicities ---------------------------------------------


def canonical_undirected_local(table: pa.Table) -> tuple[pa.Table, int]:
    """The set of undirected edges of a binary relation, each ``(least, greatest)`` with diff 1
    when its multiplicity summed over both directions is positive; with the number of self-loop
    rows dropped (`wcoj_core.input_spark.canonical_undirected` does it in Spark).

    >>> t = pa.table({"c0": [2, 1, 3, 6, 7], "c1": [1, 2, 3, 7, 6], "diff": [1, 1, 1, 1, -1]})
    >>> out, loops = canonical_undirected_local(t)
    >>> out.to_pydict(), loops
    ({'c0': [1], 'c1': [2], 'diff': [1]}, 1)
    """
    edges = table.filter(pa.array(_ends(table, "c0") != _ends(table, "c1")))
    a, b = _ends(edges, "c0"), _ends(edges, "c1")
    least = pa.table({"c0": np.minimum(a, b), "c1": np.maximum(a, b), DIFF: edges.column(DIFF)})
    summed = least.group_by(["c0", "c1"]).aggregate([(DIFF, "sum")])
    present = summed.filter(pa.array(_ends(summed, f"{DIFF}_sum") > 0))
    present = present.sort_by([("c0", "ascending"), ("c1", "ascending")])
    ones = pa.array(np.ones(present.num_rows, dtype=np.int64))
    out = pa.table([present.column("c0"), present.column("c1"), ones], names=["c0", "c1", DIFF])
    return out, table.num_rows - edges.num_rows


def _ends(table: pa.Table, column: str) -> np.ndarray:
    """A column of a table as int64 numbers."""
    return _numbers(table.column(column))


def negative_rows(table: pa.Table) -> pa.Table:
    """The tuples of `table` (``c0 .. c{k-1}, [time,] diff``) whose summed multiplicity is
    negative, with it (``c0 .. c{k-1}, diff``), in tuple order (on a DataFrame,
    `wcoj_core.input_spark.negative_tuples` runs this in Spark's tasks)."""
    cols = [c for c in table.column_names if c not in (TIME, DIFF)]
    summed = table.select([*cols, DIFF]).group_by(cols).aggregate([(DIFF, "sum")])
    negative = summed.filter(pa.array(_ends(summed, f"{DIFF}_sum") < 0))
    negative = negative.sort_by([(c, "ascending") for c in cols])
    return pa.table(
        [*(negative.column(c) for c in cols), negative.column(f"{DIFF}_sum")], [*cols, DIFF]
    )
