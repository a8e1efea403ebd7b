"""Persisted kernel layers: a trace's index segments as one file each, memory-mapped on open.

A segment (`wcoj_core.store.manifest.Segment`) is one sorted, consolidated `Layer` written once
as one new uncompressed file, ``arrangements/<trace dir>/s-<hex16>.seg``, in no folder of its
own: a 64-byte header (`_seg_header`: a magic, the rows, the width, the search keys' type and
the first column's directory), then the layer's arrays one after another, each at an offset the
header fixes — the rows column by column (each column contiguous), the diffs (int64), the search
keys (packed ``uint64``, or order-preserving bytes: `Layer.search_keys`) and, for a segment of
many rows whose first column is dense enough, that column's directory (`Layer.directory`), so
that a cold search reads one page of it instead of a page per halving of the column.
`write_segment` hashes the bytes as it writes them, makes the file read-only and records its
size, sha256 and stamp (inode, mtime, ctime).

`open_segment` maps the file (one ``mmap``): it reads the header, never the data, so opening
costs O(1) and a lookup touches only the pages it searches. It checks the file against the
manifest first — present, the recorded size, the header the segment's shape gives, the same
stamp — and reads it whole to check its digest only when the stamp differs (the file was
rewritten in place, copied or restored) or when asked. Any mismatch raises `DamagedFile` naming
the file: the caller rebuilds the segment from the trace's batches and warns. So does a segment
an earlier wcoj wrote (state formats 2 and 3: a folder of three ``.npy`` files, or a file of
layout 1 without a directory), which this one does not read.
"""

from __future__ import annotations

import functools
import mmap
import os
import stat
import struct
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from wcoj_core.errors import DamagedFile, StateError
from wcoj_core.kernel.keys import I64, U64
from wcoj_core.kernel.layer import DIRECTORY_SPAN, Layer, directory_of
from wcoj_core.store import names
from wcoj_core.store.files import (
    CHUNK,
    HashingWriter,
    sha256_file,
    stamp_of,
    write_sealed,
)
from wcoj_core.store.location import Location
from wcoj_core.store.manifest import FileRef, Level, Pattern, Segment, Stamp


def _write_layer(out: HashingWriter, header: bytes, arrays: Sequence[np.ndarray]) -> None:
    """A segment file: its header, then each array's bytes (C order), written straight from
    the arrays."""
    out.write(header)
    for array in arrays:
        flat = array.reshape(-1).view(np.uint8)
        for start in range(0, len(flat), CHUNK):
            out.write(flat[start : start + CHUNK].data)


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
    keys = np.ascontiguousarray(layer.search_keys())
    rows = np.asarray(layer.rows, dtype=I64)
    columns = np.ascontiguousarray(rows.T)  # (w, n): column after column
    diff = np.ascontiguousarray(layer.diff, dtype=I64)
    arrays = [columns, diff, keys]
    low, entries = 0, 0
    if n >= DIRECTORY_MIN_ROWS and layer.width:
        found = directory_of(columns[0])
        if found is not None:
            arrays.append(found[0])
            low, entries = found[1], len(found[0])
    header = _seg_header(n, layer.width, keys.dtype.str, low, entries)
    try:
        write = functools.partial(_write_layer, header=header, arrays=arrays)
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


# The header of a segment file: a magic, the layout's version, the width, the rows, the search
# keys' item size and kind (``u``: packed uint64, ``V``: bytes), padded to 64 bytes (so every
# array after it starts at a multiple of 8), with the directory of the first column that follows
# the search keys (`Layer.directory`: ``dir[k - low]`` is the first row at or after ``k``): its
# ``low`` and its entries, 0 for none. A cold search then reads a page of the directory where a
# binary search of the column reads a page per halving. Layout 2 is state format 4's; layout 1
# (format 3, no directory) is not read.
_SEG_MAGIC = b"\x93WCOJSEG"
_SEG = struct.Struct("<8sIIQQc")
_SEG_DIR = struct.Struct("<qQ")  # the directory's low and entries, at byte 40
_SEG_DIR_AT = 40
SEG_HEADER_BYTES = 64
SEG_LAYOUT = 2
# Segments of fewer rows keep no directory: small ones are summed in memory before a search.
DIRECTORY_MIN_ROWS = 1 << 16


@functools.lru_cache(maxsize=4096)
def _seg_header(rows: int, width: int, keys: str, low: int = 0, entries: int = 0) -> bytes:
    dtype = np.dtype(keys)
    packed = _SEG.pack(_SEG_MAGIC, SEG_LAYOUT, width, rows, dtype.itemsize, dtype.kind.encode())
    header = bytearray(packed.ljust(SEG_HEADER_BYTES, b"\0"))
    _SEG_DIR.pack_into(header, _SEG_DIR_AT, low, entries)
    return bytes(header)


def _directory_fields(header: bytes) -> tuple[int, int]:
    """A segment file's directory (``low``, entries) as its header says; (0, 0) for none."""
    low, entries = _SEG_DIR.unpack_from(header, _SEG_DIR_AT)
    return low, entries


def _key_dtype(segment: Segment) -> np.dtype[Any]:
    """The search keys' type of a segment: uint64 when it packs (or has no column), else
    bytes of 8 per column."""
    w = segment.width
    packed = segment.packing is not None or w == 0  # no column: uint64 zeros
    return np.dtype(U64) if packed else np.dtype(f"V{8 * w}")


# Segment files whose stamp differed from their ref's but whose bytes matched its sha256 when
# this process hashed them (a state copied, moved or restored keeps its bytes but not its
# inodes and times): path -> (the sha256, the stamp then seen). `restamped` gives the segment
# with those stamps, for the next commit to record, so that only the first epoch after a copy
# reads its segments whole, not every epoch until a `wcoj verify --repair`.
_VERIFIED: dict[str, tuple[str, Stamp]] = {}


def restamped(root: str | os.PathLike[str], segment: Segment) -> Segment:
    """`segment` with the stamps of its files this process verified by their digest since their
    stamps changed (see `_VERIFIED`); the same object when there are none."""
    if not _VERIFIED:
        return segment
    refs = dict(segment.files)
    for role, path in zip(segment.files, segment_files(root, segment), strict=True):
        seen = _VERIFIED.get(path)
        ref = refs[role]
        if seen is not None and seen[0] == ref.sha256 and seen[1] != ref.stamp:
            refs[role] = replace(ref, stamp=seen[1])
    if refs == segment.files:
        return segment
    return replace(segment, files=refs)


def _check(
    path: str | os.PathLike[str],
    ref: FileRef,
    size: Callable[[bytes], int | None],
    *,
    digest: bool | None,
    keep: bool = False,
) -> mmap.mmap | None:
    """Check a segment file against its ref, its header and the size that header implies
    (`size`: None for a header that is not the segment's, `_seg_problem` says why); with
    `keep`, the file mapped read-only.

    `digest`: True reads the file whole to check its sha256, False never does (a copy checked
    when made), None does when the stamp differs from the ref's.
    """
    where = os.fspath(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise DamagedFile(where, "is not a file")
            if st.st_size != ref.size:
                raise DamagedFile(where, f"is {st.st_size} bytes, the manifest says {ref.size}")
            found = f.read(SEG_HEADER_BYTES)
            expected = size(found)
            if expected is None:
                raise DamagedFile(where, _seg_problem(found))
            if expected != st.st_size:
                raise DamagedFile(where, "its size does not match its header (truncated or padded)")
            if digest or (digest is None and stamp_of(st) != ref.stamp):
                _, sha = sha256_file(path)
                if sha != ref.sha256:
                    raise DamagedFile(
                        where,
                        f"its sha256 {sha[:12]}... differs from the manifest's "
                        f"{ref.sha256[:12]}... (its bytes changed since it was written)",
                    )
                if ref.stamp is not None and stamp_of(st) != ref.stamp:
                    _VERIFIED[where] = (sha, stamp_of(st))  # stat before the hash: no race
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if keep else None
    except FileNotFoundError:
        raise DamagedFile(where, "missing (the manifest names it)") from None
    except IsADirectoryError:
        raise DamagedFile(where, "is not a file") from None
    except OSError as e:
        raise DamagedFile(where, f"cannot be read ({e.strerror or e})") from None


def _layer_expect(segment: Segment) -> tuple[Callable[[bytes], int | None], np.dtype[Any]]:
    """The file's size for the header found (None for one that is not the segment's), and the
    segment's search keys' type.

    A header is the segment's when it is byte for byte what `write_segment` writes for the
    segment's shape, with any directory a first column of `segment.rows` rows can have
    (`DIRECTORY_SPAN`; whatever the writer's `DIRECTORY_MIN_ROWS`): the directory's bytes are
    the digest's to check."""
    n, w = segment.rows, segment.width
    keys = _key_dtype(segment)
    size = SEG_HEADER_BYTES + n * 8 * (w + 1) + n * keys.itemsize

    def sized(found: bytes) -> int | None:
        if len(found) != SEG_HEADER_BYTES or not found.startswith(_SEG_MAGIC):
            return None
        low, entries = _directory_fields(found)
        most = DIRECTORY_SPAN * n + 1025 if w else 0  # what `directory_of` can make
        if entries > most or found != _seg_header(n, w, keys.str, low, entries):
            return None
        return size + 8 * entries

    return sized, keys


def _seg_problem(found: bytes) -> str:
    """What is wrong with a segment file's header that is not the expected one."""
    if len(found) < _SEG.size or not found.startswith(_SEG_MAGIC):
        return "its header is damaged (not a wcoj segment file)"
    _, version, width, rows, itemsize, kind = _SEG.unpack_from(found)
    if version != SEG_LAYOUT:
        return f"{EARLIER} (layout {version}), which this one does not read"
    return (
        f"its header says {rows} rows of {width} columns (layout {version}, keys "
        f"{kind.decode(errors='replace')}{itemsize}), which is not the manifest's segment"
    )


# What a segment of state format 2 or 3 is, to a reader that does not read it.
EARLIER = "a segment file of an earlier wcoj"


def segment_path(root: str | os.PathLike[str], segment: Segment) -> str:
    """The local path of a segment's file (or of an earlier wcoj's folder of three)."""
    return f"{_local_root(root)}/{segment.path}"


def _local_root(root: str | os.PathLike[str]) -> str:
    """A local state root (a path or a ``file:`` URI) as an absolute path string."""
    return Location.of(root).absolute()


def segment_files(root: str | os.PathLike[str], segment: Segment) -> list[str]:
    """The local paths of a segment's files: its one file, none when it has no rows or is an
    earlier wcoj's (what a warm open checks the stamps of, every segment every epoch)."""
    return [segment_path(root, segment)] if segment.files else []


def _unread(path: str) -> DamagedFile:
    return DamagedFile(path, f"{EARLIER} (state format 2: three .npy files), not read by this one")


def open_segment(root: str | os.PathLike[str], segment: Segment, *, verify: bool = False) -> Layer:
    """The layer of a segment of the local state `root`, its file memory-mapped: checked,
    mapped once, its arrays views at their offsets.

    Raises `DamagedFile` for a file that is missing, of another size, with a header that
    disagrees with the segment (an earlier wcoj's included), or — checked when its stamp
    changed, or always with `verify` — whose bytes differ from the manifest's sha256.
    """
    if segment.rows == 0:
        return Layer.empty(segment.width)
    path = segment_path(root, segment)
    if not segment.files:
        raise _unread(path)
    sized, keys = _layer_expect(segment)
    ref = segment.files[names.SEGMENT_LAYER]
    mapped = _check(path, ref, sized, digest=True if verify else None, keep=True)
    assert mapped is not None
    n, w = segment.rows, segment.width
    at = SEG_HEADER_BYTES
    rows = np.frombuffer(mapped, dtype=I64, count=n * w, offset=at).reshape((w, n)).T
    at += n * w * 8
    diff = np.frombuffer(mapped, dtype=I64, count=n, offset=at)
    at += n * 8
    packed = np.frombuffer(mapped, dtype=keys, count=n, offset=at)
    layer = Layer(rows, diff, segment.packing, packed, segment.unit)
    low, entries = _directory_fields(mapped[:SEG_HEADER_BYTES])
    if entries:
        at += n * keys.itemsize
        layer.given_directory(np.frombuffer(mapped, dtype=I64, count=entries, offset=at), low)
    return layer


def check_segment(root: str | os.PathLike[str], segment: Segment) -> list[DamagedFile]:
    """A segment's file's damage (read whole), without mapping it."""
    if segment.rows == 0:
        return []
    path = segment_path(root, segment)
    if not segment.files:
        return [_unread(path)]
    try:
        _check(path, segment.files[names.SEGMENT_LAYER], _layer_expect(segment)[0], digest=True)
    except DamagedFile as e:
        return [e]
    return []


def segment_bytes(segment: Segment) -> int:
    """The bytes of a segment's files."""
    return sum(ref.size for ref in segment.files.values())
