"""Reading a whole state back against its manifests: which files are damaged, and what that
affects (the primitives of ``wcoj verify``).

`verify_state` reads every kept generation's manifest and every file they name, once each:
batch files (size and sha256, and their rows against the batch's row count) and segment files
(size, ``.npy`` header, sha256). Each damaged file is reported with its trace, the first epoch
it affects — a batch at time ``t`` every epoch from ``t`` on (through the traces and
arrangements built from it), a segment every epoch from its index's time on — and whether it
can be rebuilt: a segment can (from the batches), a batch cannot (it is the source of truth).

A file inside a batch folder that no kept manifest lists is named too (`Damage.foreign`): no
reader reads it (they read exactly the files a manifest lists), and wcoj never deletes a file
it did not write, so it stays until someone moves it out. Spark's own by-products of a batch it
wrote (``_SUCCESS``, a listed file's ``.crc``) are not named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from wcoj_core.errors import StateError
from wcoj_core.segments import check_segment, segment_bytes
from wcoj_core.store import names
from wcoj_core.store.manifest import FileRef, Manifest, Segment
from wcoj_core.store.store import Store


@dataclass(frozen=True, slots=True)
class Damage:
    """One damaged file (or manifest) and what it affects.

    `since` is the first epoch affected (None: a manifest, which affects its generation);
    `generations` the kept generations that name the file, `current` whether the current one
    does.
    """

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


def verify_state(store: Store, progress: Callable[[str], None] | None = None) -> VerifyReport:
    """Check every file the kept generations of `store` name (each read whole, once)."""
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
    counted: dict[tuple[str, int], _Seen] = {}  # (folder, rows the manifest says) -> where
    listed: dict[str, set[str]] = {}  # folder -> the names of the files a manifest lists
    segments: dict[str, _Seen] = {}
    segment_of: dict[str, Segment] = {}
    for m in manifests:
        for t in m.traces.values():
            for b in t.batches:
                seen = counted.setdefault((b.path, b.rows), _Seen(t.name, b.time, [], False))
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
                    segment_of[s.path] = s
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
    whole = {folder for folder in listed} - {d.path.rsplit("/", 1)[0] for d in damaged}
    held = _held_rows(store, {f: refs_of(refs, f) for f in whole})
    for (folder, rows), seen in sorted(counted.items()):
        if folder in held and held[folder] != rows:
            what = f"its files hold {held[folder]:,} rows, the manifest says {rows:,}"
            damaged.append(_damage(folder, seen, what, current))
    damaged += _foreign(store, listed, counted, current)
    local = store.local_root
    for path, seen in sorted(segments.items()):
        segment = segment_of[path]
        if progress is not None:
            progress(path)
        files += len(segment.files)
        size += segment_bytes(segment)
        if local is not None:
            found = [(_relative(e.path, str(local)), e.what) for e in check_segment(local, segment)]
        else:  # not on this machine: size and digest only
            found = []
            for ref in segment.files.values():
                rel = f"{path}/{ref.name}"
                what = store.files.verify(rel, ref)
                if what is not None:
                    found.append((rel, what))
        damaged.extend(_damage(rel, seen, what, current) for rel, what in found)
    return VerifyReport(current, tuple(gens), files, size, tuple(damaged))


def refs_of(refs: dict[tuple[str, str], FileRef], folder: str) -> list[FileRef]:
    return [ref for (f, _), ref in sorted(refs.items()) if f == folder]


def _held_rows(store: Store, folders: dict[str, list[FileRef]]) -> dict[str, int]:
    """The rows each batch folder's listed files hold, from their Parquet footers (a folder
    whose footers cannot be read is left out: its files are reported already or next)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wcoj_core.deploy.batches import BatchFiles

    files = BatchFiles(store.root)
    out: dict[str, int] = {}
    for folder, refs in sorted(folders.items()):
        try:
            out[folder] = sum(
                pq.ParquetFile(
                    files.full(f"{folder}/{r.name}"), filesystem=files.fs
                ).metadata.num_rows
                for r in refs
            )
        except (OSError, pa.ArrowException):
            continue
    return out


def _foreign(
    store: Store, listed: dict[str, set[str]], counted: dict[tuple[str, int], _Seen], current: int
) -> list[Damage]:
    """Files inside batch folders that no kept manifest lists (Spark's by-products aside)."""
    where: dict[str, _Seen] = {}
    for (folder, _), seen in counted.items():
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
