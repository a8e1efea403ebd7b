"""Reading a whole state back against its manifests: which files are damaged, and what that
affects (the primitives of ``wcoj verify``).

`verify_state` reads every kept manifest and every file they name, once: batch files (size,
sha256, rows) and segment files (size, header, sha256). Each damaged file comes with its trace,
the first epoch it affects and whether it can be rebuilt (a segment can, a batch cannot). A file
in a batch folder that no manifest lists is named too (`Damage.foreign`), but not Spark's own
by-products (``_SUCCESS``, a listed file's ``.crc``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from wcoj_core.arrow import longs
from wcoj_core.budget import MemoryBudget, Shares, default_budget
from wcoj_core.errors import StateError, out_of_memory, read_failure
from wcoj_core.spill import Scratch, Spill, merge
from wcoj_core.store import names
from wcoj_core.store.batches import Batches
from wcoj_core.store.manifest import Batch, FileRef, Manifest, Segment
from wcoj_core.store.segments import check_segment, segment_bytes
from wcoj_core.store.store import Store


@dataclass(frozen=True, slots=True)
class Damage:
    """One damaged file (or manifest): `since` the first epoch affected (None: a manifest),
    `generations` the kept generations naming it, `current` whether the current one does."""

    path: str
    trace: str
    what: str
    since: int | None
    rebuildable: bool
    generations: tuple[int, ...]
    current: bool
    foreign: bool = False  # a file no manifest lists, inside a batch folder

    def describe(self) -> str:
        """One line for a person."""
        if self.foreign:
            return f"{self.path} (trace {self.trace}): {self.what}"
        affects = f"epochs {self.since} and later" if self.since is not None else "its generation"
        fix = "rebuildable from the batches" if self.rebuildable else "not rebuildable"
        where = f" (trace {self.trace})" if self.trace else ""
        old = "" if self.current else ", named by older generations only"
        return f"{self.path}{where}: {self.what}; affects {affects}{old}; {fix}"


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What `verify_state` read and what it found."""

    generation: int  # the current generation (0: a state with no commit)
    generations: tuple[int, ...]
    files: int
    bytes: int
    damaged: tuple[Damage, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """Nothing the current generation names is damaged (damage named only by older kept
        generations is reported, and goes once they are pruned)."""
        return not any(d.current for d in self.damaged)


@dataclass
class _Seen:
    trace: str
    since: int
    generations: list[int]
    segment: bool


def verify_state(
    store: Store,
    progress: Callable[[str], None] | None = None,
    memory: MemoryBudget | None = None,
) -> VerifyReport:
    """Check every file the kept generations of `store` name, each read once, a record batch at a
    time, within `memory` (default: `default_budget`)."""
    gens = store.generations()
    current = gens[-1] if gens else 0
    damaged: list[Damage] = []
    manifests: list[Manifest] = []
    for g in gens:
        try:
            manifests.append(store.generation(g, fresh=True))
        except StateError as e:
            rel = f"{names.MANIFESTS}/{names.manifest_name(g)}"
            damaged.append(Damage(rel, "", str(e), None, False, (g,), g == current))
    batches: dict[tuple[str, str], _Seen] = {}  # (folder, file name) -> where it is used
    refs: dict[tuple[str, str], FileRef] = {}
    # (folder, rows, epoch, files a batch entry lists) -> where
    counted: dict[tuple[str, int, int, tuple[str, ...]], _Seen] = {}
    listed: dict[str, set[str]] = {}  # folder -> the names of the files a manifest lists
    segments: dict[str, _Seen] = {}
    # A file's segment records, each distinct one once: an undirected relation's views and
    # counts name one file in several records, and each record's sizes and digests are checked.
    segment_of: dict[str, dict[tuple[object, ...], Segment]] = {}
    for m in manifests:
        for t in m.traces.values():
            for b in t.batches:
                key = (b.path, b.rows, b.time, tuple(f.name for f in b.files))
                seen = counted.setdefault(key, _Seen(t.name, b.time, [], False))
                seen.since = min(seen.since, b.time)
                seen.generations.append(m.generation)
                listed.setdefault(b.path, set()).update(f.name for f in b.files)
                for f in b.files:
                    key = (b.path, f.name)
                    seen = batches.setdefault(key, _Seen(t.name, b.time, [], False))
                    seen.since = min(seen.since, b.time)
                    seen.generations.append(m.generation)
                    refs[key] = f
            if t.index is not None:
                for s in t.index.segments:
                    if s.rows == 0:
                        continue
                    seen = segments.setdefault(s.path, _Seen(t.name, t.index.time, [], True))
                    seen.since = min(seen.since, t.index.time)
                    seen.generations.append(m.generation)
                    record = (tuple(sorted(s.files.items())), s.rows, s.width, s.unit, s.packing)
                    segment_of.setdefault(s.path, {}).setdefault(record, s)
    files = 0
    size = 0
    for (folder, name), seen in sorted(batches.items()):
        rel = f"{folder}/{name}"
        if progress is not None:
            progress(rel)
        ref = refs[(folder, name)]
        files += 1
        size += ref.size
        what = store.files.verify(rel, ref)
        if what is not None:
            damaged.append(_damage(rel, seen, what, current))
    damaged += _row_damage(store, counted, refs, {d.path for d in damaged}, current)
    damaged += _foreign(store, listed, counted, current)
    if manifests and manifests[-1].generation == current:
        broken = {d.path.rsplit("/", 1)[0] for d in damaged} | {d.path for d in damaged}
        damaged += _figures(store, manifests[-1], broken, memory or default_budget())
    seg_files, seg_size, seg_damage = _segment_damage(
        store, segments, segment_of, current, progress
    )
    damaged += seg_damage
    return VerifyReport(current, tuple(gens), files + seg_files, size + seg_size, tuple(damaged))


def _row_damage(
    store: Store,
    counted: dict[tuple[str, int, int, tuple[str, ...]], _Seen],
    refs: dict[tuple[str, str], FileRef],
    bad: set[str],
    current: int,
) -> list[Damage]:
    """Each batch entry whose files are sound but hold other rows or epochs than it says."""
    damaged: list[Damage] = []
    entries = {
        (folder, listed_names)
        for folder, _, _, listed_names in counted
        if not any(f"{folder}/{n}" in bad for n in listed_names)
    }
    held = _held_rows(store, {e: [refs[(e[0], n)] for n in e[1]] for e in entries})
    for (folder, rows, time, listed_names), seen in sorted(counted.items()):
        if (folder, listed_names) not in held:
            continue
        n, epochs = held[(folder, listed_names)]
        if n != rows:
            what = f"its files hold {n:,} rows, the manifest says {rows:,}"
            damaged.append(_damage(folder, seen, what, current))
        if epochs and epochs != {time}:
            found = ", ".join(map(str, sorted(epochs)))
            what = f"its files hold rows of epoch(s) {found}, the manifest says epoch {time}"
            damaged.append(_damage(folder, seen, what, current))
    return damaged


def _segment_damage(
    store: Store,
    segments: dict[str, _Seen],
    segment_of: dict[str, dict[tuple[object, ...], Segment]],
    current: int,
    progress: Callable[[str], None] | None,
) -> tuple[int, int, list[Damage]]:
    """Every distinct record of every segment checked (whole on this machine, by size and
    digest elsewhere): the files, their bytes and the damage found."""
    files = size = 0
    damaged: list[Damage] = []
    local = store.local_root
    for path, seen in sorted(segments.items()):
        records = list(segment_of[path].values())
        if progress is not None:
            progress(path)
        files += len(records[0].files)
        size += segment_bytes(records[0])
        problems_of: list[tuple[str, str]] = []
        for segment in records:
            if local is not None:
                problems = [
                    (_relative(e.path, str(local)), e.what) for e in check_segment(local, segment)
                ]
            else:  # not on this machine: size and digest only
                problems = []
                for role, ref in segment.files.items():
                    rel = segment.file_path(role)
                    what = store.files.verify(rel, ref)
                    if what is not None:
                        problems.append((rel, what))
            problems_of += [p for p in problems if p not in problems_of]
        damaged.extend(_damage(rel, seen, what, current) for rel, what in problems_of)
    return files, size, damaged


def _held_rows(
    store: Store, folders: dict[tuple[str, tuple[str, ...]], list[FileRef]]
) -> dict[tuple[str, tuple[str, ...]], tuple[int, set[int]]]:
    """The rows each batch folder's listed files hold and the epochs of those rows, from their
    Parquet footers (a folder whose footers cannot be read is left out: its files are reported
    already or next)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wcoj_core.traces import TIME

    files = store.files
    out: dict[tuple[str, tuple[str, ...]], tuple[int, set[int]]] = {}
    for (folder, listed_names), refs in sorted(folders.items()):
        rows, epochs = 0, set()
        path = files.full(folder)
        try:
            for r in refs:
                path = files.full(f"{folder}/{r.name}")
                parquet = pq.ParquetFile(path, filesystem=files.fs)
                rows += parquet.metadata.num_rows
                for chunk in parquet.iter_batches(columns=[TIME]):  # a record batch at a time
                    epochs |= {int(v) for v in np.unique(longs(chunk.column(TIME)))}
        except (OSError, MemoryError, pa.ArrowException, KeyError) as e:
            if out_of_memory(e):  # no sign of damage, and nothing checked
                raise read_failure(path, e, "not a readable batch") from e
            continue
        out[(folder, listed_names)] = (rows, epochs)
    return out


def _figures(
    store: Store, manifest: Manifest, broken: set[str], memory: MemoryBudget
) -> list[Damage]:
    """Each trace's latest recorded figures against its batches summed through sorted runs within
    `memory` (traces with a damaged batch left out: reported already)."""
    from wcoj_core.errors import OutOfMemory, WcojError

    files = Batches(store.files)
    shares = Shares.of(memory)
    scratch = state_scratch(store)
    spill = Spill.of(scratch, shares)
    out = []
    try:
        for name, trace in sorted(manifest.traces.items()):
            if not name.startswith(("rel/", "counts/", "out/")):
                continue  # a set's ignored changes and a rule's outputs keep no figures of their own
            recorded = [b for b in trace.batches if b.figures is not None]
            if not recorded or any(b.path in broken for b in trace.batches):
                continue
            last = recorded[-1]
            figures = last.figures
            assert figures is not None
            try:
                held = _summed_figures(files, trace.columns, trace.visible(last.time), spill)
            except OutOfMemory:
                raise
            except WcojError:
                continue
            if held != tuple(figures):
                what = (
                    f"its figures (rows, count, negative) as of epoch {last.time} are "
                    f"{tuple(figures)}, its batches summed give {held}"
                )
                out.append(
                    Damage(last.path, name, what, last.time, False, (manifest.generation,), True)
                )
    finally:
        scratch.close()
    return out


def _nothing(_spilled: int) -> None:
    return None


def state_scratch(store: Store) -> Scratch:
    """The scratch folder a check or a repair of `store` spills into: under the state's
    ``scratch/`` folder (the system's temporary folder for a state on remote storage)."""
    return Scratch(store.local_root / names.SCRATCH if store.local_root else None, _nothing)


def _summed_figures(
    files: Batches, columns: Sequence[str], batches: Iterable[Batch], spill: Spill
) -> tuple[int, int, int]:
    """(distinct tuples, count, negative tuples) of `batches` summed: a record batch at a
    time into sorted runs, then merged a block at a time."""
    import numpy as np

    from wcoj_core.kernel.changes import data_rows
    from wcoj_core.traces import DIFF

    sorter = spill.sorter(len(columns), "checking a trace's figures")
    for b in batches:
        for chunk in files.iter_chunks(b, columns):
            sorter.add(data_rows(chunk, columns), longs(chunk.column(DIFF)))
    if not sorter.spilled:
        pieces: Iterable[np.ndarray] = [np.asarray(sorter.layer().diff)]
    else:
        runs = sorter.take_runs()
        pieces = (diff for _, diff, _ in merge(runs, len(columns), block_bytes=spill.merge_bytes))
    rows = count = negative = 0
    for diff in pieces:
        rows += len(diff)
        count += int(diff.sum(dtype=np.int64)) if len(diff) else 0
        negative += int((diff < 0).sum())
    return rows, count, negative


def _foreign(
    store: Store,
    listed: dict[str, set[str]],
    counted: dict[tuple[str, int, int, tuple[str, ...]], _Seen],
    current: int,
) -> list[Damage]:
    """Files inside batch folders that no kept manifest lists (Spark's by-products aside)."""
    where: dict[str, _Seen] = {}
    for (folder, _, _, _), seen in counted.items():
        where.setdefault(folder, seen)
    out = []
    for folder, names_listed in sorted(listed.items()):
        for entry in sorted(store.files.entries(folder), key=lambda e: e.name):
            if entry.name in names_listed or _by_product(entry.name, names_listed):
                continue
            seen = where[folder]
            gens = tuple(sorted(set(seen.generations)))
            what = (
                "a file the manifest does not list: no reader reads it, and wcoj never deletes "
                "a file it did not write; move it out of the state"
            )
            out.append(
                Damage(
                    f"{folder}/{entry.name}",
                    seen.trace,
                    what,
                    seen.since,
                    False,
                    gens,
                    current in gens,
                    foreign=True,
                )
            )
    return out


def _by_product(name: str, listed: set[str]) -> bool:
    """Whether a file in a batch folder is what Spark writes beside the files it lists.

    >>> _by_product("_SUCCESS", set()), _by_product(".part-0.parquet.crc", {"part-0.parquet"})
    (True, True)
    >>> _by_product(".part-9.parquet.crc", {"part-0.parquet"}), _by_product("x.parquet", set())
    (False, False)
    """
    if name in ("_SUCCESS", "._SUCCESS.crc"):
        return True
    return name.startswith(".") and name.endswith(".crc") and name[1:-4] in listed


def _damage(rel: str, seen: _Seen, what: str, current: int) -> Damage:
    gens = tuple(sorted(set(seen.generations)))
    return Damage(rel, seen.trace, what, seen.since, seen.segment, gens, current in gens)


def _relative(path: str, root: str) -> str:
    prefix = root.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path
