"""Reading a whole state back against its manifests: which files are damaged, and what that
affects (the primitives of ``wcoj verify``).

`verify_state` reads every kept generation's manifest and every file they name, once each:
batch files (size and sha256) and segment files (size, ``.npy`` header, sha256). Each damaged
file is reported with its trace, the first epoch it affects — a batch at time ``t`` every epoch
from ``t`` on (through the traces and arrangements built from it), a segment every epoch from its
index's time on — and whether it can be rebuilt: a segment can (from the batches), a batch
cannot (it is the source of truth).
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

    def describe(self) -> str:
        """One line for a person."""
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
    segments: dict[str, _Seen] = {}
    segment_of: dict[str, Segment] = {}
    for m in manifests:
        for t in m.traces.values():
            for b in t.batches:
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


def _damage(rel: str, seen: _Seen, what: str, current: int) -> Damage:
    gens = tuple(sorted(set(seen.generations)))
    return Damage(rel, seen.trace, what, seen.since, seen.segment, gens, current in gens)


def _relative(path: str, root: str) -> str:
    prefix = root.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path
