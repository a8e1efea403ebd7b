"""Persisted kernel layers: a trace's index segments as one file each, memory-mapped on open.

A segment (`wcoj_core.store.manifest.Segment`) is one sorted, consolidated `Layer` written once
as ``arrangements/<trace dir>/s-<hex16>.seg`` (layout 3, state format 5; docs/state.md says what
each byte is): a 64-byte header (`_HEAD`), the first column's directory, the columns (``uint32``
where they fit), the diffs (none in a set's layer), and a CRC-32 per block of
``2^BLOCK_SHIFT`` bytes with the CRC of that table. `write_segment` writes it a piece at a time
and records its size, sha256 and stamp. `open_segment` maps it and checks the size, the header
against the manifest and the block table; every other block is checked by the kernel when a
search first touches it (`wcoj_core.kernel.stored`). A mismatch raises `DamagedFile` naming the
file; the caller rebuilds the segment from the trace's batches.
"""

from __future__ import annotations

import functools
import mmap
import os
import stat
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from wcoj_core.errors import DamagedFile, StateError
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import DIRECTORY_SPAN, Layer, directory_span
from wcoj_core.kernel.stored import DAMAGED, DAMAGED_FILES, Stored
from wcoj_core.store import names
from wcoj_core.store.files import HashingWriter, sha256_file, write_sealed
from wcoj_core.store.location import Location
from wcoj_core.store.manifest import Level, Pattern, Segment

# magic, layout, width, rows, directory low, directory entries, uint32 columns (bits),
# diff item size, directory item size, first column stored, block shift
_HEAD = struct.Struct("<8sIIQqQIBBBB")
_MAGIC = b"\x93WCOJSEG"
HEADER_BYTES = 64
SEG_LAYOUT = 3
BLOCK_SHIFT = 12  # 4 KiB blocks: a cold search reads a page and checks that page
# A segment of fewer rows keeps no directory unless it holds no more entries than rows.
DIRECTORY_MIN_ROWS = 1 << 16
# Rows made at once while writing a mapped layer.
_PIECE = 1 << 20
_U32 = 1 << 32


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a segment's header says: the arrays' item sizes and where they lie."""

    rows: int
    width: int
    low: int
    entries: int
    narrow: int  # bit j: column j is uint32
    diff: int  # 0, 4 or 8
    dirsize: int  # 4 or 8 (when entries)
    first: bool  # the first column stored

    def arrays(self) -> Iterator[tuple[str, int, str, int]]:
        """Each array: (role, its offset, its dtype, its items), in file order."""
        at = HEADER_BYTES
        parts = [("dir", "u4" if self.dirsize == 4 else "i8", self.entries)] if self.entries else []
        for j in range(self.width):
            if j or self.first:
                parts.append((f"c{j}", "u4" if self.narrow >> j & 1 else "i8", self.rows))
        if self.diff:
            parts.append(("diff", "i4" if self.diff == 4 else "i8", self.rows))
        for role, dtype, count in parts:
            yield role, at, dtype, count
            at += -(-count * int(dtype[1]) // 8) * 8

    @property
    def data_bytes(self) -> int:
        end = HEADER_BYTES
        for _, at, dtype, count in self.arrays():
            end = at + -(-count * int(dtype[1]) // 8) * 8
        return end

    @property
    def blocks(self) -> int:
        return -(-self.data_bytes >> BLOCK_SHIFT)

    @property
    def size(self) -> int:
        return self.data_bytes + 4 * self.blocks + 8

    def header(self) -> bytes:
        packed = _HEAD.pack(
            _MAGIC, SEG_LAYOUT, self.width, self.rows, self.low, self.entries, self.narrow,
            self.diff, self.dirsize, int(self.first), BLOCK_SHIFT,
        )  # fmt: skip
        return packed.ljust(HEADER_BYTES, b"\0")


def _pieces(layer: Layer) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for lo in range(0, len(layer), _PIECE):
        yield layer.part(lo, lo + _PIECE)


def _shape(layer: Layer) -> tuple[_Shape, np.ndarray | None]:
    """A layer's segment shape, and its first column's directory when it keeps one."""
    n, w = len(layer), layer.width
    lows, highs = [np.iinfo(I64).max] * w, [np.iinfo(I64).min] * w
    dlow, dhigh = 0, 0
    for rows, diff in _pieces(layer):
        for j in range(w):
            lows[j], highs[j] = (
                min(lows[j], int(rows[:, j].min())),
                max(highs[j], int(rows[:, j].max())),
            )
        dlow, dhigh = min(dlow, int(diff.min())), max(dhigh, int(diff.max()))
    narrow = sum(1 << j for j in range(w) if lows[j] >= 0 and highs[j] < _U32)
    unit = layer.unit
    dsize = 0 if unit else 4 if dlow >= -(1 << 31) and dhigh < 1 << 31 else 8
    span = directory_span(n, lows[0], highs[0]) if w else None
    table = None
    if span is not None and (n >= DIRECTORY_MIN_ROWS or (w >= 2 and span <= n)):
        counts = np.zeros(span + 1, dtype=I64)
        for rows, _ in _pieces(layer):
            counts[1:] += np.bincount(rows[:, 0] - lows[0], minlength=span)
        table = np.cumsum(counts)
        table = table.astype(np.uint32) if n < _U32 else table
    entries = 0 if table is None else len(table)
    dirsize = 0 if table is None else table.itemsize
    low = lows[0] if table is not None else 0
    shape = _Shape(n, w, low, entries, narrow, dsize, dirsize, table is None)
    return shape, table


class _Blocks:
    """A segment file being written: every byte hashed (sha256, by `out`) and each block's
    CRC-32 kept."""

    def __init__(self, out: HashingWriter) -> None:
        self.out = out
        self.sums: list[int] = []
        self.crc, self.filled = 0, 0

    def write(self, data: bytes | memoryview) -> None:
        view, size = memoryview(data).cast("B"), 1 << BLOCK_SHIFT
        self.out.write(view)
        while len(view):
            take = min(size - self.filled, len(view))
            self.crc = zlib.crc32(view[:take], self.crc)
            self.filled += take
            view = view[take:]
            if self.filled == size:
                self.sums.append(self.crc)
                self.crc, self.filled = 0, 0

    def pad(self) -> None:
        if self.out.size % 8:
            self.write(bytes(8 - self.out.size % 8))

    def close(self) -> None:
        if self.filled:
            self.sums.append(self.crc)
        table = np.array(self.sums, dtype="<u4").tobytes()
        self.out.write(table)
        self.out.write(struct.pack("<II", zlib.crc32(table), len(self.sums)))


def _write_layer(out: HashingWriter, layer: Layer, shape: _Shape, table: np.ndarray | None) -> None:
    blocks = _Blocks(out)
    blocks.write(shape.header())
    for role, _, dtype, _ in shape.arrays():
        if role == "dir":
            assert table is not None
            blocks.write(table.astype("<" + dtype).data)
        for rows, diff in _pieces(layer) if role != "dir" else ():
            values = diff if role == "diff" else rows[:, int(role[1:])]
            blocks.write(np.ascontiguousarray(values, dtype="<" + dtype).data)
        blocks.pad()
    blocks.close()


def write_segment(
    root: str | os.PathLike[str],
    rel: str,
    layer: Layer,
    *,
    level: Level,
    view: Pattern | None,
    order: tuple[int, ...],
) -> Segment:
    """Write `layer` (sorted, consolidated) as the segment `rel` of the local state
    `root`: one new file (`wcoj_core.store.names.new_segment_path`), created exclusively,
    which nothing reads before a manifest names it. An empty layer is written as no file at
    all."""
    order = tuple(order)
    if len(order) != layer.width:
        raise ValueError(f"order {order} for a layer of width {layer.width}")
    n = len(layer)
    if n == 0:
        return Segment(level, view, order, 0, None, True, rel, {})
    target = os.path.join(_local_root(root), rel)
    shape, table = _shape(layer)
    try:
        write = functools.partial(_write_layer, layer=layer, shape=shape, table=table)
        try:
            ref = write_sealed(target, write)
        except FileNotFoundError:  # its trace's first segment: the trace's folder is new
            os.makedirs(os.path.dirname(target), exist_ok=True)
            ref = write_sealed(target, write)
    except OSError as e:
        raise StateError(
            f"state {root}: cannot write arrangement files ({e.strerror or e}); nothing was applied"
        ) from e
    return Segment(
        level, view, order, n, layer.packing, layer.unit, rel, {names.SEGMENT_LAYER: ref}
    )


def _read_shape(where: str, found: bytes, segment: Segment) -> _Shape:
    """The shape a segment file's header gives, checked against the manifest's segment."""
    if len(found) < HEADER_BYTES or not found.startswith(_MAGIC):
        raise DamagedFile(where, "its header is damaged (not a wcoj segment file)")
    fields = _HEAD.unpack_from(found)
    if fields[1] != SEG_LAYOUT:
        raise DamagedFile(where, f"its header is of another layout ({fields[1]}), not read here")
    _, _, width, rows, low, entries, narrow, dsize, dirsize, first, shift = fields
    shape = _Shape(rows, width, low, entries, narrow, dsize, dirsize, bool(first))
    most = DIRECTORY_SPAN * rows + 1025 if width else 0  # what a directory can be
    sane = (
        (rows, width) == (segment.rows, segment.width)
        and shift == BLOCK_SHIFT
        and dsize in ((0,) if segment.unit else (4, 8))
        and narrow < 1 << width
        and (entries == 0 or (dirsize in (4, 8) and 2 <= entries <= most))
        and (first or entries)
        and found == shape.header()
    )
    if not sane:
        raise DamagedFile(
            where,
            f"its header says {rows} rows of {width} columns, which is not the manifest's segment",
        )
    return shape


def _map(path: str, segment: Segment) -> tuple[mmap.mmap, _Shape]:
    """A segment's file mapped, its size, header and block table checked (see the module)."""
    ref = segment.files[names.SEGMENT_LAYER]
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise DamagedFile(path, "is not a file")
            if st.st_size != ref.size:
                raise DamagedFile(path, f"is {st.st_size} bytes, the manifest says {ref.size}")
            shape = _read_shape(path, f.read(HEADER_BYTES), segment)
            if shape.size != st.st_size:
                raise DamagedFile(path, "its size does not match its header (truncated or padded)")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), shape
    except FileNotFoundError:
        raise DamagedFile(path, "missing (the manifest names it)") from None
    except IsADirectoryError:
        raise DamagedFile(path, "is not a file") from None
    except OSError as e:
        raise DamagedFile(path, f"cannot be read ({e.strerror or e})") from None


def _stored(path: str, mapped: mmap.mmap, shape: _Shape) -> Stored:
    """The mapped file's arrays and their guard, the block table and the header's block
    checked."""
    whole = np.frombuffer(mapped, dtype=np.uint8)
    at = shape.data_bytes
    crc, blocks = struct.unpack_from("<II", mapped, at + 4 * shape.blocks)
    if zlib.crc32(memoryview(mapped)[at : at + 4 * shape.blocks]) != crc or blocks != shape.blocks:
        raise DamagedFile(path, "its table of block checksums is damaged")
    sums = whole[at : at + 4 * shape.blocks].view("<u4")
    seen = np.zeros(shape.blocks + 1, dtype=np.uint8)
    guard = (whole[: shape.data_bytes], sums, seen, BLOCK_SHIFT, path)
    arrays = {
        role: np.frombuffer(mapped, dtype="<" + dtype, count=count, offset=at)
        for role, at, dtype, count in shape.arrays()
    }
    stored = Stored(
        tuple(arrays.get(f"c{j}") for j in range(shape.width)),
        arrays.get("diff"),
        arrays.get("dir"),
        shape.low,
        guard,
    )
    stored.checked(whole, 0, HEADER_BYTES)
    return stored


def open_segment(root: str | os.PathLike[str], segment: Segment, *, verify: bool = False) -> Layer:
    """The layer of a segment of the local state `root`, its file mapped once and checked (see
    the module; with `verify`, read whole against its sha256). `DamagedFile` for a file missing,
    of another size, or whose header or block table disagrees."""
    if segment.rows == 0:
        return Layer.empty(segment.width)
    path = segment_path(root, segment)
    if path in DAMAGED_FILES:
        raise DamagedFile(path, DAMAGED)
    if verify:
        _digest(path, segment)
    mapped, shape = _map(path, segment)
    stored = _stored(path, mapped, shape)
    return Layer.mapped(segment.rows, segment.width, stored, segment.packing, segment.unit)


def _digest(path: str, segment: Segment) -> None:
    ref = segment.files[names.SEGMENT_LAYER]
    try:
        _, sha = sha256_file(path)
    except OSError as e:
        raise DamagedFile(path, f"cannot be read ({e.strerror or e})") from None
    if sha != ref.sha256:
        raise DamagedFile(
            path,
            f"its sha256 {sha[:12]}... differs from the manifest's {ref.sha256[:12]}... "
            "(its bytes changed since it was written)",
        )


def segment_path(root: str | os.PathLike[str], segment: Segment) -> str:
    """The local path of a segment's file."""
    return f"{_local_root(root)}/{segment.path}"


def _local_root(root: str | os.PathLike[str]) -> str:
    """A local state root (a path or a ``file:`` URI) as an absolute path string."""
    return Location.of(root).absolute()


def segment_files(root: str | os.PathLike[str], segment: Segment) -> list[str]:
    """The local paths of a segment's files: its one file, none when it has no rows (what a
    warm open checks the stamps of, every segment every epoch)."""
    return [segment_path(root, segment)] if segment.files else []


def check_segment(root: str | os.PathLike[str], segment: Segment) -> list[DamagedFile]:
    """A segment's file's damage (read whole: its sha256, header and every block), without
    keeping it mapped."""
    if segment.rows == 0:
        return []
    path = segment_path(root, segment)
    try:
        mapped, shape = _map(path, segment)
        stored = _stored(path, mapped, shape)
        stored.checked(stored.guard[0], 0, shape.data_bytes)
        _digest(path, segment)
    except DamagedFile as e:
        return [e]
    return []


def segment_bytes(segment: Segment) -> int:
    """The bytes of a segment's files."""
    return sum(ref.size for ref in segment.files.values())
