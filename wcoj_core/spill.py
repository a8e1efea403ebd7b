"""Work beyond the memory budget, on disk: sorted runs, k-way merges and layers in mapped files.

What does not fit a stage's share (`wcoj_core.budget.Shares`) goes to the epoch's `Scratch`
folder (``<state>/scratch/<hex32>/``, removed when the epoch ends). `Sorter` sums rows added a
piece at a time into one sorted, consolidated layer through runs of `run_bytes` (none written
when all fit one); `merge` is the k-way merge of sorted layers, a round taking every row up to
the least last key of the blocks in hand; `LayerWriter` writes sorted chunks into a mapped
`Layer` beyond `layer_bytes`; `arranged` / `merged` are `wcoj_core.kernel.layer`'s functions for
layers of any size. A merge packs rows into ``uint64`` with one `Packing` over every input's box,
or order-preserving bytes (`encode`) beyond 64 bits.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wcoj_core.budget import Shares
from wcoj_core.errors import StateError
from wcoj_core.kernel.keys import I64, U64, Packing, encode
from wcoj_core.kernel.layer import Layer, summed_sorted
from wcoj_core.kernel.layer import arranged as arranged_in_memory
from wcoj_core.kernel.multiplicity import sums_at
from wcoj_core.query.plan import AtomView
from wcoj_core.store.names import scratch_name

# A merge reads each run this many rows at a time at most (fewer when many runs share its bytes).
MERGE_BLOCK_ROWS = 1 << 20
# A merge of more runs than this first merges groups of them into longer runs.
MAX_FAN_IN = 48
# Files are copied into place this many bytes at a time.
_COPY = 8 << 20
# What spilling always leaves free on the disk it writes to.
DISK_RESERVE = 1 << 30

Chunk = tuple[np.ndarray, np.ndarray]  # rows (any order of memory) and diffs


class Scratch:
    """The folder an epoch spills into (under the state's ``scratch/``, or the system's temporary
    folder for remote storage): made on first use, removed by `close`; counts what is written, by
    `stage`."""

    def __init__(
        self, root: str | os.PathLike[str] | None, on_spill: Callable[[int], None]
    ) -> None:
        self.root = None if root is None else Path(root)
        self._folder: Path | None = None
        self._on_spill = on_spill
        self.spilled = 0
        self.stage = ""  # what the epoch is doing (its phase), for `by_stage`
        self.by_stage: dict[str, int] = {}

    @property
    def folder(self) -> Path:
        if self._folder is None:
            with self.writing():
                if self.root is None:
                    self._folder = Path(tempfile.mkdtemp(prefix="wcoj-scratch-"))
                else:
                    (self.root / (name := scratch_name())).mkdir(parents=True, exist_ok=False)
                    self._folder = self.root / name
        return self._folder

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """What writes into the folder: an `OSError` there (a read-only folder, an I/O error;
        not memory running out) is a `StateError` naming the folder."""
        try:
            yield
        except OSError as e:
            if e.errno == errno.ENOMEM:
                raise
            where = self._folder or self.root or tempfile.gettempdir()
            raise StateError(
                f"cannot spill to {where} ({e.strerror or e}): the work stopped and nothing "
                "was applied (make the folder writable, or give more --memory to spill less)"
            ) from e

    @property
    def used(self) -> bool:
        return self._folder is not None

    def path(self, kind: str) -> Path:
        """A fresh file name in the folder (named as the state's pruning recognizes)."""
        return self.folder / f"part-{kind}-{uuid.uuid4().hex[:16]}"

    def counted(self, n: int) -> None:
        self.spilled += n
        self.by_stage[self.stage] = self.by_stage.get(self.stage, 0) + n
        self._on_spill(n)

    def _disk(self) -> tuple[Path, int, int]:
        """The scratch folder (or where it will be), its file system's free and total bytes."""
        where = self._folder or self.root or Path(tempfile.gettempdir())
        found = where
        while not found.exists():
            found = found.parent
        usage = shutil.disk_usage(found)
        return where, usage.free, usage.total

    def free_bytes(self) -> int:
        """Free space on the scratch folder's file system."""
        return self._disk()[1]

    def reserve(self) -> int:
        """What spilling leaves free: `DISK_RESERVE`, or a twentieth of a smaller disk."""
        return min(DISK_RESERVE, self._disk()[2] // 20)

    def check_room(self, more: int = 0) -> None:
        """Refuse, in one line, to write `more` bytes when they would leave less than the
        `reserve` free on the scratch folder's file system: an epoch stops before it fills the
        disk (nothing is applied; what it wrote is removed)."""
        where, free, total = self._disk()
        reserve = min(DISK_RESERVE, total // 20)
        if free - more < reserve:
            from wcoj_core.budget import BudgetError, format_size

            raise BudgetError(
                f"the epoch's work no longer fits the disk: {format_size(free)} free at {where}, "
                f"{format_size(reserve)} kept free; nothing was applied (free some space or "
                "apply smaller epochs)"
            )

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


# -- arrays in files -------------------------------------------------------------------------------


def _header(shape: tuple[int, ...], dtype: np.dtype, fortran: bool) -> bytes:
    import io

    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out,
        {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": fortran, "shape": shape},
    )
    return out.getvalue()


def save(path: Path, array: np.ndarray) -> int:
    """An array as an ``.npy`` file (a 2-d one in Fortran order), written a slice at a time;
    the bytes written."""
    fortran = array.ndim == 2
    header = _header(array.shape, array.dtype, fortran)
    data = array.T if fortran else array
    with open(path, "wb") as f:
        f.write(header)
        flat = np.ascontiguousarray(data).reshape(-1) if not data.flags.c_contiguous else data
        raw = flat.reshape(-1).view(np.uint8)
        for start in range(0, len(raw), _COPY):
            f.write(raw[start : start + _COPY].data)
    return len(header) + array.nbytes


def load(path: Path) -> np.ndarray:
    """An ``.npy`` file mapped read-only (pages read on first touch)."""
    return np.load(path, mmap_mode="r")


def _common_packing(layers: Sequence[Layer]) -> Packing | None:
    """One packing whose box holds every layer's rows, or None when it needs more than 64 bits
    (or a layer's rows do not pack)."""
    lows: list[int] | None = None
    highs: list[int] | None = None
    for layer in layers:
        if not len(layer):
            continue
        p = layer.packing
        if p is None:
            return None
        if lows is None or highs is None:
            lows, highs = list(p.lows), list(p.highs)
        else:
            lows = [min(a, b) for a, b in zip(lows, p.lows, strict=True)]
            highs = [max(a, b) for a, b in zip(highs, p.highs, strict=True)]
    if lows is None or highs is None:
        return None
    bits = tuple((h - lo).bit_length() for lo, h in zip(lows, highs, strict=True))
    return Packing(tuple(lows), tuple(highs), bits) if sum(bits) <= 64 else None


def _keys(rows: np.ndarray, packing: Packing | None) -> np.ndarray:
    """Search keys of rows (whose order is the rows' order): packed, or `encode` bytes."""
    if rows.shape[1] == 0:
        return np.zeros(len(rows), dtype=U64)
    if packing is not None:
        return packing.pack(rows)[0]
    return encode(rows)


# -- writing a layer a chunk at a time -------------------------------------------------------------


class LayerWriter:
    """Sorted, consolidated chunks, in the order of their keys' `packing` (None: bytes keys), as
    one `Layer`: in memory while within `limit` bytes, else in files of `folder`, mapped; with
    `sink` each finished file is handed over instead."""

    def __init__(self, scratch: Scratch, width: int, packing: Packing | None, limit: int) -> None:
        self.scratch = scratch
        self.width = width
        self.packing = packing
        self.limit = limit
        self.rows = 0
        self._held: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._held_bytes = 0
        self._files: list[Path] | None = None  # one per column, then diff, then keys
        self._handles: list[object] = []
        self._unit = True
        self._key_dtype: np.dtype | None = None

    def add(self, rows: np.ndarray, diff: np.ndarray, keys: np.ndarray | None = None) -> None:
        if len(diff) == 0:
            return
        if keys is None:
            keys = _keys(rows, self.packing)
        self._unit = self._unit and bool((diff == 1).all())
        self._key_dtype = keys.dtype
        self.rows += len(diff)
        if self._files is None:
            self._held.append((rows, diff, keys))
            self._held_bytes += rows.nbytes + diff.nbytes + keys.nbytes
            if self._held_bytes > self.limit:
                self._open()
                held, self._held = self._held, []
                for r, d, k in held:
                    self._write(r, d, k)
            return
        self._write(rows, diff, keys)

    def _open(self) -> None:
        self._files = [self.scratch.path(f"col{j}") for j in range(self.width)]
        self._files += [self.scratch.path("diff"), self.scratch.path("keys")]
        with self.scratch.writing():
            self._handles = [open(p, "wb") for p in self._files]  # noqa: SIM115 (closed in finish)

    def _write(self, rows: np.ndarray, diff: np.ndarray, keys: np.ndarray) -> None:
        self.scratch.check_room(rows.nbytes + diff.nbytes + keys.nbytes)
        arrays = [rows[:, j] for j in range(self.width)] + [diff, keys]
        n = 0
        with self.scratch.writing():
            for handle, a in zip(self._handles, arrays, strict=True):
                data = np.ascontiguousarray(a)
                handle.write(data.view(np.uint8).data)  # type: ignore[attr-defined]
                n += data.nbytes
        self.scratch.counted(n)

    def finish(self) -> Layer:
        """The layer of every chunk added (mapped when it was written)."""
        if self._files is None:
            return self._in_memory()
        for h in self._handles:
            h.close()  # type: ignore[attr-defined]
        n = self.rows
        key_dtype = self._key_dtype if self._key_dtype is not None else np.dtype(U64)
        cols, diff_file, key_file = self._files[: self.width], self._files[-2], self._files[-1]
        base = self.scratch.path("layer")
        rows_path = Path(f"{base}-rows.npy")
        diff_path = Path(f"{base}-diff.npy")
        keys_path = Path(f"{base}-keys.npy")
        with self.scratch.writing():
            _assemble(rows_path, _header((n, self.width), np.dtype(I64), True), cols)
            _assemble(diff_path, _header((n,), np.dtype(I64), False), [diff_file])
            _assemble(keys_path, _header((n,), key_dtype, False), [key_file])
        rows = load(rows_path) if n else np.zeros((0, self.width), dtype=I64)
        layer = Layer(rows, load(diff_path), self.packing, load(keys_path), self._unit)
        return layer

    def _in_memory(self) -> Layer:
        held, self._held = self._held, []
        if not held:
            return Layer.empty(self.width)
        if len(held) == 1:
            rows, diff, keys = held[0]
        else:
            rows = np.empty((self.rows, self.width), dtype=I64, order="F")
            for j in range(self.width):
                np.concatenate([r[:, j] for r, _, _ in held], out=rows[:, j])
            diff = np.concatenate([d for _, d, _ in held])
            keys = np.concatenate([k for _, _, k in held])
        layer = Layer(rows, diff, self.packing, keys, self._unit)
        return layer


def _assemble(target: Path, header: bytes, parts: Sequence[Path]) -> None:
    """An ``.npy`` file of a header and the raw parts one after another (the parts removed)."""
    with open(target, "wb") as out:
        out.write(header)
        out.flush()
        for part in parts:
            with open(part, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                done = 0
                while done < size:
                    try:
                        sent = os.copy_file_range(src.fileno(), out.fileno(), size - done)
                    except (OSError, AttributeError):
                        sent = 0
                    if sent <= 0:  # not supported here: copy through memory
                        src.seek(done)
                        shutil.copyfileobj(src, out, _COPY)
                        out.flush()
                        break
                    done += sent
            part.unlink()


# -- the k-way merge ------------------------------------------------------------------------------


@dataclass
class _Cursor:
    layer: Layer
    at: int = 0  # the next row not yet taken
    rows: np.ndarray | None = None  # the block loaded: rows [at, end)
    diff: np.ndarray | None = None
    keys: np.ndarray | None = None
    end: int = 0

    def load(self, block: int, packing: Packing | None) -> None:
        if self.keys is not None and self.at < self.end:
            return
        n = len(self.layer)
        self.end = min(self.at + block, n)
        rows, diff = self.layer.part(self.at, self.end)  # a mapped layer's made piece by piece
        self.rows = np.asfortranarray(rows, dtype=I64)
        self.diff = np.array(diff, dtype=I64)
        self.keys = _keys(self.rows, packing)

    @property
    def done(self) -> bool:
        return self.at >= len(self.layer)

    @property
    def short(self) -> bool:
        """Whether rows of the run lie beyond the block loaded."""
        return self.end < len(self.layer)


def merge(
    layers: Sequence[Layer],
    width: int,
    *,
    block_bytes: int,
    packing: Packing | None = None,
    what: str = "merging sorted runs",
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The layers (each sorted and consolidated) summed, as consolidated chunks in order:
    (rows in Fortran order, diffs, keys under `packing`, found when not given). Rows whose
    sum is 0 are dropped; a sum leaving int64 raises `MultiplicityOverflow`."""
    live = [layer for layer in layers if len(layer)]
    if not live:
        return
    if packing is None:
        packing = _common_packing(live)
    block = max(1 << 10, min(MERGE_BLOCK_ROWS, block_bytes // (2 * len(live) * 8 * (width + 2))))
    cursors = [_Cursor(layer) for layer in live]
    while cursors:
        for c in cursors:
            c.load(block, packing)
        bound: np.ndarray | None = None  # the least last key, as a one-element array
        least: int | bytes | None = None  # and as a value Python compares
        for c in cursors:
            if c.short:
                assert c.keys is not None
                last = c.keys[len(c.keys) - 1 :]
                value = int(last[0]) if packing is not None else last.tobytes()
                if least is None or value < least:  # type: ignore[operator]
                    bound, least = last, value
        rows_parts: list[np.ndarray] = []
        diff_parts: list[np.ndarray] = []
        key_parts: list[np.ndarray] = []
        for c in cursors:
            assert c.keys is not None and c.rows is not None and c.diff is not None
            take = len(c.keys) if bound is None else int(np.searchsorted(c.keys, bound, "right")[0])
            if take == 0:
                continue
            rows_parts.append(c.rows[:take])
            diff_parts.append(c.diff[:take])
            key_parts.append(c.keys[:take])
            c.rows, c.diff, c.keys = c.rows[take:], c.diff[take:], c.keys[take:]
            c.at += take
            if not len(c.keys):
                c.keys = None
        cursors = [c for c in cursors if not c.done]
        if key_parts:
            yield _consolidated(rows_parts, diff_parts, key_parts, width, packing, what)


def _consolidated(
    rows_parts: list[np.ndarray],
    diff_parts: list[np.ndarray],
    key_parts: list[np.ndarray],
    width: int,
    packing: Packing | None,
    what: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces of sorted runs as one consolidated, sorted chunk."""
    keys = np.concatenate(key_parts) if len(key_parts) > 1 else key_parts[0]
    diff = np.concatenate(diff_parts) if len(diff_parts) > 1 else diff_parts[0]
    n = len(keys)
    rows = np.empty((n, width), dtype=I64, order="F")
    for j in range(width):
        if len(rows_parts) > 1:
            np.concatenate([r[:, j] for r in rows_parts], out=rows[:, j])
        else:
            rows[:, j] = rows_parts[0][:, j]
    if len(key_parts) > 1:
        if packing is not None:
            order = np.argsort(keys, kind="stable")
        else:
            order = np.lexsort([rows[:, j] for j in reversed(range(width))])
        keys, diff = keys[order], diff[order]
        for j in range(width):
            rows[:, j] = rows[order, j]
    starts = np.ones(n, dtype=bool)
    starts[1:] = keys[1:] != keys[:-1]
    if starts.all():
        keep = diff != 0
        if keep.all():
            return rows, diff, keys
        picked = np.flatnonzero(keep)
        return rows[picked], diff[picked], keys[picked]
    first = np.flatnonzero(starts)
    sums = sums_at(diff, first, lambda i: tuple(int(v) for v in rows[i]), what)
    nonzero = sums != 0
    picked = first[nonzero]
    return np.asfortranarray(rows[picked]), sums[nonzero], keys[picked]


# -- sorting more than fits ------------------------------------------------------------------------


@dataclass
class Sorter:
    """Rows and diffs added a piece at a time, summed into one sorted, consolidated layer
    (see the module). Pieces are held by reference until a run is made of them: a caller
    must not change a piece it added."""

    scratch: Scratch
    width: int
    run_bytes: int
    layer_bytes: int
    merge_bytes: int
    what: str = "summing rows"
    pieces: list[Chunk] = field(default_factory=list)
    held: int = 0
    runs: list[Layer] = field(default_factory=list)
    added: int = 0

    def add(self, rows: np.ndarray, diff: np.ndarray) -> None:
        if len(diff) == 0:
            return
        self.pieces.append((rows, diff))
        self.held += rows.nbytes + diff.nbytes
        self.added += len(diff)
        if self.held >= self.run_bytes:
            self.spill()

    @property
    def spilled(self) -> bool:
        return bool(self.runs)

    def _sorted(self) -> Layer:
        pieces, self.pieces, self.held = self.pieces, [], 0
        if not pieces:
            return Layer.empty(self.width)
        if len(pieces) == 1:
            rows, diff = pieces[0]
        else:
            n = sum(len(d) for _, d in pieces)
            rows = np.empty((n, self.width), dtype=I64, order="F")
            for j in range(self.width):
                np.concatenate([r[:, j] for r, _ in pieces], out=rows[:, j])
            diff = np.concatenate([d for _, d in pieces])
        pieces.clear()
        return Layer.build(rows, diff, what=self.what)

    def spill(self) -> None:
        """Sort what is held and write it as a run; a run that summing shrank to at most half
        the run size is kept in memory as the first piece of the next one instead (a file of
        repeated tuples is never written out)."""
        layer = self._sorted()
        if not len(layer):
            return
        size = len(layer) * 8 * (self.width + 1)
        if 2 * size <= self.run_bytes:
            self.pieces.append((np.asarray(layer.rows), np.asarray(layer.diff)))
            self.held = size
            return
        self.runs.append(write_run(self.scratch, layer))

    def layer(self) -> Layer:
        """Everything added, summed: in memory when it all fit one run, else merged from the
        runs into a mapped layer (or an in-memory one, when the sum turns out small)."""
        if not self.runs:
            return self._sorted()
        runs = self.take_runs()
        return merge_into(
            self.scratch, runs, self.width, self.layer_bytes, self.merge_bytes, self.what
        )

    def take_runs(self) -> list[Layer]:
        """Every run, what is still held sorted as the last one (kept in memory)."""
        last = self._sorted()
        runs, self.runs = self.runs, []
        if len(last):
            runs.append(last)
        return runs


def write_run(scratch: Scratch, layer: Layer) -> Layer:
    """A sorted, consolidated layer written to the scratch folder and mapped back (rows and
    diffs only: a merge makes its own keys)."""
    scratch.check_room(len(layer) * 8 * (layer.width + 1))
    rows_path = Path(f"{scratch.path('run')}.npy")
    diff_path = Path(f"{scratch.path('run')}.npy")
    with scratch.writing():
        n = save(rows_path, np.asarray(layer.rows, dtype=I64))
        n += save(diff_path, np.asarray(layer.diff, dtype=I64))
    scratch.counted(n)
    run = Layer(load(rows_path), load(diff_path), layer.packing, None, None)
    return run


def merge_into(
    scratch: Scratch,
    layers: Sequence[Layer],
    width: int,
    layer_bytes: int,
    merge_bytes: int,
    what: str = "merging sorted runs",
) -> Layer:
    """Sorted, consolidated layers summed into one (`merge`, then `LayerWriter`)."""
    live = reduce_fan_in(scratch, [x for x in layers if len(x)], width, merge_bytes, what)
    if not live:
        return Layer.empty(width)
    packing = _common_packing(live)
    out = LayerWriter(scratch, width, packing, layer_bytes)
    for rows, diff, keys in merge(live, width, block_bytes=merge_bytes, packing=packing, what=what):
        out.add(rows, diff, keys)
    return out.finish()


def reduce_fan_in(
    scratch: Scratch, layers: list[Layer], width: int, merge_bytes: int, what: str
) -> list[Layer]:
    """Runs merged in groups until at most `MAX_FAN_IN` are left."""
    while len(layers) > MAX_FAN_IN:
        merged_runs: list[Layer] = []
        for start in range(0, len(layers), MAX_FAN_IN):
            group = layers[start : start + MAX_FAN_IN]
            if len(group) == 1:
                merged_runs.append(group[0])
                continue
            out = LayerWriter(scratch, width, _common_packing(group), 0)
            for rows, diff, keys in merge(group, width, block_bytes=merge_bytes, what=what):
                out.add(rows, diff, keys)
            merged_runs.append(out.finish())
        layers = merged_runs
    return layers


# -- what the kernel's layer functions do, for layers of any size ----------------------------------


@dataclass(frozen=True, slots=True)
class Spill:
    """An epoch's scratch folder and the shares that say when to use it."""

    scratch: Scratch
    run_bytes: int
    layer_bytes: int
    merge_bytes: int
    # Large layers arranged so far, by (the layer's id, view pattern, order): the rules and the
    # arrangements' writing read the same views of an epoch's change (the layer is kept too,
    # so that its id stays its own).
    memo: dict[tuple[int, object, tuple[int, ...]], tuple[Layer, Layer]] = field(
        default_factory=dict
    )

    @classmethod
    def of(cls, scratch: Scratch, shares: Shares) -> Spill:
        """Spilling into `scratch` at the sizes `shares` cut from a memory budget."""
        return cls(scratch, shares.run_bytes, shares.layer_bytes, shares.merge_bytes)

    def big(self, layer: Layer) -> bool:
        """Whether a layer is too large to be rearranged in memory at once."""
        return len(layer) * 8 * (layer.width + 2) > self.run_bytes

    def sorter(self, width: int, what: str = "summing rows") -> Sorter:
        return Sorter(self.scratch, width, self.run_bytes, self.layer_bytes, self.merge_bytes, what)

    def arranged(self, layer: Layer, view: AtomView | None, order: tuple[int, ...]) -> Layer:
        """`wcoj_core.kernel.layer.arranged` of a layer of any size: a large one a piece at a
        time, each piece arranged (sorted) in memory and the pieces merged. The layer itself
        when it is already so: as stored, or a `symmetric` layer's columns swapped."""
        if not self.big(layer):
            return arranged_in_memory(layer, view, order)
        if (view is None or view.is_identity) and (
            tuple(order) == tuple(range(layer.width))
            or (layer.symmetric and tuple(order) == (1, 0))
        ):
            return layer
        key = (id(layer), None if view is None or view.is_identity else view.pattern, tuple(order))
        found = self.memo.get(key)
        if found is not None and found[0] is layer:
            return found[1]
        runs: list[Layer] = []
        step = max(1, self.run_bytes // (8 * (layer.width + 2)))
        width = len(order)
        for lo in range(0, len(layer), step):
            piece = slice_layer(layer, lo, min(lo + step, len(layer)))
            got = arranged_in_memory(piece, view, order)
            if len(got):
                runs.append(write_run(self.scratch, got))
        out = merge_into(self.scratch, runs, width, self.layer_bytes, self.merge_bytes)
        self.memo[key] = (layer, out)
        return out

    def merged(self, layers: Sequence[Layer], width: int, what: str = "merging layers") -> Layer:
        """Sorted, consolidated layers of one width summed into one, in memory when they are
        small together, else by a k-way merge into a mapped layer."""
        live = [x for x in layers if len(x)]
        if not live:
            return Layer.empty(width)
        if len(live) == 1:
            return live[0]
        total = sum(len(x) for x in live) * 8 * (width + 2)
        if total <= self.run_bytes:
            return summed_sorted(live, what=what)  # sorted runs merged, not sorted again
        return merge_into(self.scratch, live, width, self.layer_bytes, self.merge_bytes, what)

    def chunk_rows(self, width: int) -> int:
        """Rows of a layer a chunked pass takes at once."""
        return max(1 << 12, self.run_bytes // (8 * 8 * (width + 2)))


def slice_layer(layer: Layer, lo: int, hi: int) -> Layer:
    """Rows ``lo:hi`` of a layer as a layer (views of its arrays, its search keys included:
    still sorted and consolidated)."""
    if lo == 0 and hi == len(layer):
        return layer
    keys = layer._keys  # pyright: ignore[reportPrivateUsage]
    rows, diff = layer.part(lo, hi)
    out = Layer(
        rows,
        diff,
        layer.packing,
        None if keys is None else keys[lo:hi],
        layer._unit,  # pyright: ignore[reportPrivateUsage]
    )
    return out


def chunks(layer: Layer, rows: int) -> Iterator[Layer]:
    """A layer `rows` rows at a time (views: nothing copied)."""
    n = len(layer)
    if n <= rows:
        yield layer
        return
    for lo in range(0, n, rows):
        yield slice_layer(layer, lo, min(lo + rows, n))
