"""Persisted kernel layers: a trace's index segments as ``.npy`` files, memory-mapped on open.

A segment (`wcoj_core.store.manifest.Segment`) is one sorted, consolidated `Layer` written once
into its own folder as three uncompressed ``.npy`` files: ``rows`` (n x w int64, Fortran order,
so a column is contiguous), ``diff`` (n int64) and ``keys`` (the layer's full-width search keys:
packed ``uint64``, or order-preserving bytes: `Layer.search_keys`). `write_segment` hashes the bytes
as it writes them, makes the files read-only and records each file's size, sha256 and
stamp (inode, mtime, ctime).

`open_segment` maps the files (``mmap``): it reads their headers, never their data, so opening
costs O(files) and a lookup touches only the pages it searches. It checks each file against the
manifest first — present, the recorded size, a header that agrees with the segment, the same
stamp — and reads a file whole to check its digest only when the stamp differs (the file was
rewritten in place, copied or restored) or when asked. Any mismatch raises `DamagedFile` naming
the file: the caller rebuilds the segment from the trace's batches and warns.
"""

from __future__ import annotations

import functools
import io
import math
import mmap
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wcoj_core.errors import DamagedFile, StateError
from wcoj_core.kernel.keys import I64, U64
from wcoj_core.kernel.layer import Layer
from wcoj_core.store import names
from wcoj_core.store.files import (
    CHUNK,
    HashingWriter,
    local_path,
    sha256_file,
    stamp_of,
    write_sealed,
)
from wcoj_core.store.manifest import FileRef, Level, Pattern, Segment


def _write_npy(out: HashingWriter, array: np.ndarray) -> None:
    """An array as a version 1.0 ``.npy`` file, its bytes written straight from the array
    (the header numpy writes for it, made once per shape and type: `_npy_header`)."""
    fortran = bool(array.flags.f_contiguous and not array.flags.c_contiguous)
    if array.dtype.fields is None:
        out.write(_npy_header(array.shape, array.dtype.str, fortran))
    else:  # a structured type: its full description, by numpy
        header = np.lib.format.header_data_from_array_1_0(array)
        np.lib.format.write_array_header_1_0(out, header)
    data = array.T if fortran else np.ascontiguousarray(array)
    flat = data.reshape(-1).view(np.uint8)
    for start in range(0, len(flat), CHUNK):
        out.write(flat[start : start + CHUNK].data)


def write_segment(
    root: str | os.PathLike[str],
    rel_folder: str,
    layer: Layer,
    *,
    level: Level,
    view: Pattern | None,
    order: tuple[int, ...],
) -> Segment:
    """Write `layer` (sorted, consolidated) as the segment in `rel_folder` of the local state
    `root` (a new folder, see `wcoj_core.store.names.new_segment_path`). An empty layer is
    written as no file at all."""
    order = tuple(order)
    if len(order) != layer.width:
        raise ValueError(f"order {order} for a layer of width {layer.width}")
    n = len(layer)
    if n == 0:
        return Segment(level, view, order, 0, None, True, rel_folder, {})
    folder = os.path.join(_local_root(root), rel_folder)
    arrays = {
        "rows": np.asfortranarray(layer.rows, dtype=I64),
        "diff": np.ascontiguousarray(layer.diff, dtype=I64),
        "keys": np.ascontiguousarray(layer.search_keys()),
    }
    files: dict[str, FileRef] = {}
    try:
        try:
            os.mkdir(folder)  # new; its trace's folder is there but for its first segment
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
        except FileExistsError:
            pass  # its files are created exclusively: none is ever written over
        for role, array in arrays.items():
            files[role] = write_sealed(
                f"{folder}/{names.segment_file(role)}", lambda out, a=array: _write_npy(out, a)
            )
    except OSError as e:
        raise StateError(
            f"state {root}: cannot write arrangement files ({e.strerror or e}); nothing was applied"
        ) from e
    return Segment(level, view, order, n, layer.packing, layer.unit, rel_folder, files)


@dataclass(frozen=True, slots=True)
class _Expect:
    """What a segment file's header must say."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    fortran: bool


def _expect(segment: Segment, role: str) -> _Expect:
    n, w = segment.rows, segment.width
    if role == "rows":
        return _Expect((n, w), np.dtype(I64), n > 1 and w > 1)
    if role == "diff":
        return _Expect((n,), np.dtype(I64), False)
    packed = segment.packing is not None or w == 0  # no column: uint64 zeros
    dtype = np.dtype(U64) if packed else np.dtype(f"V{8 * w}")
    return _Expect((n,), dtype, False)


def _header(expect: _Expect) -> bytes:
    """The exact ``.npy`` (1.0) header `write_segment` writes for an array of this shape."""
    return _npy_header(expect.shape, expect.dtype.str, expect.fortran)


@functools.lru_cache(maxsize=4096)
def _npy_header(shape: tuple[int, ...], dtype: str, fortran: bool) -> bytes:
    out = io.BytesIO()
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
        "fortran_order": fortran,
        "shape": shape,
    }
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue()


def _check(path: Path, ref: FileRef, expect: _Expect, *, digest: bool | None) -> int:
    """Check a segment file against its ref and what its header must say; its data offset.

    The header must be byte for byte the one `write_segment` writes for the segment's shape
    (read, never parsed). `digest`: True reads the file whole to check its sha256, False never
    does (a copy checked when made), None does when the stamp differs from the ref's.
    """
    where = str(path)
    header = _header(expect)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise DamagedFile(where, "is not a file")
            if st.st_size != ref.size:
                raise DamagedFile(where, f"is {st.st_size} bytes, the manifest says {ref.size}")
            found = f.read(len(header))
    except FileNotFoundError:
        raise DamagedFile(where, "missing (the manifest names it)") from None
    except IsADirectoryError:
        raise DamagedFile(where, "is not a file") from None
    except OSError as e:
        raise DamagedFile(where, f"cannot be read ({e.strerror or e})") from None
    if found != header:
        raise DamagedFile(where, _header_problem(found, expect))
    offset = len(header)
    if offset + math.prod(expect.shape) * expect.dtype.itemsize != st.st_size:
        raise DamagedFile(where, "its size does not match its header (truncated or padded)")
    if digest or (digest is None and stamp_of(st) != ref.stamp):
        _, sha = sha256_file(path)
        if sha != ref.sha256:
            raise DamagedFile(
                where,
                f"its sha256 {sha[:12]}... differs from the manifest's {ref.sha256[:12]}... "
                f"(its bytes changed since it was written)",
            )
    return offset


def _header_problem(found: bytes, expect: _Expect) -> str:
    """What is wrong with a header that is not the expected one (parsed only now)."""
    try:
        f = io.BytesIO(found + b"\n" * 64)
        version = np.lib.format.read_magic(f)
        if version != (1, 0):
            raise ValueError(f"version {version[0]}.{version[1]}, not 1.0")
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    except Exception as e:  # a damaged header fails in many ways (tokenize errors among them)
        return f"its .npy header is damaged ({e})"
    return (
        f"its header says shape {tuple(shape)} of {dtype}"
        f"{' (Fortran order)' if fortran else ''}, the manifest shape {expect.shape} of "
        f"{expect.dtype}{' (Fortran order)' if expect.fortran else ''}"
    )


def _map(path: Path, expect: _Expect, offset: int) -> np.ndarray:
    """The file's array, mapped read-only (pages read on first touch)."""
    count = math.prod(expect.shape)
    if count == 0:
        return np.empty(expect.shape, dtype=expect.dtype)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    flat = np.frombuffer(mapped, dtype=expect.dtype, count=count, offset=offset)
    if len(expect.shape) == 1:
        return flat
    rows, width = expect.shape
    return flat.reshape((width, rows)).T if expect.fortran else flat.reshape(expect.shape)


def _layer(segment: Segment, arrays: Mapping[str, np.ndarray]) -> Layer:
    """The layer of mapped arrays, given everything it would otherwise find by a pass over
    them (packing, keys, unit flag)."""
    return Layer(arrays["rows"], arrays["diff"], segment.packing, arrays["keys"], segment.unit)


def _open_files(segment: Segment, paths: Mapping[str, Path], *, digest: bool | None) -> Layer:
    arrays: dict[str, np.ndarray] = {}
    for role, ref in segment.files.items():
        expect = _expect(segment, role)
        offset = _check(paths[role], ref, expect, digest=digest)
        arrays[role] = _map(paths[role], expect, offset)
    return _layer(segment, arrays)


def segment_paths(root: str | os.PathLike[str], segment: Segment) -> dict[str, Path]:
    """The local path of each file of a segment, by role."""
    folder = local_path(os.fspath(root)) / segment.path
    return {role: folder / ref.name for role, ref in segment.files.items()}


def segment_files(root: str | os.PathLike[str], segment: Segment) -> list[str]:
    """`segment_paths`' paths, as strings (what a warm open checks the stamps of, every
    segment every epoch: no `Path` made)."""
    folder = os.path.join(_local_root(root), segment.path)
    return [f"{folder}/{ref.name}" for ref in segment.files.values()]


def _local_root(root: str | os.PathLike[str]) -> str:
    """A local state root (a path or a ``file://`` URI) as an absolute path string."""
    return os.path.abspath(os.fspath(root).removeprefix("file://"))


def open_segment(root: str | os.PathLike[str], segment: Segment, *, verify: bool = False) -> Layer:
    """The layer of a segment of the local state `root`, its files memory-mapped.

    Raises `DamagedFile` for a file that is missing, of another size, with a header that
    disagrees with the segment, or — checked when its stamp changed, or always with `verify` —
    whose bytes differ from the manifest's sha256.
    """
    if segment.rows == 0:
        return Layer.empty(segment.width)
    return _open_files(segment, segment_paths(root, segment), digest=True if verify else None)


def check_segment(root: str | os.PathLike[str], segment: Segment) -> list[DamagedFile]:
    """Every damaged file of a segment (each file read whole), without mapping any."""
    found: list[DamagedFile] = []
    for role, path in segment_paths(root, segment).items():
        try:
            _check(path, segment.files[role], _expect(segment, role), digest=True)
        except DamagedFile as e:
            found.append(e)
    return found


def segment_bytes(segment: Segment) -> int:
    """The bytes of a segment's files."""
    return sum(ref.size for ref in segment.files.values())
