"""A state directory: its marker, its manifests, the commit and the pruning of what is unused.

`Store.open` checks the marker (``wcoj-state.json``) and creates a state only in a missing or
empty directory; a state whose manifests were lost (data folders older than ``manifests/``) is
refused, never taken for a new one. `Store.commit` creates the next manifest exclusively: of two
racing writers one wins, the other gets `ConcurrentCommit`. `Store.prune` keeps the last
`KEEP_MANIFESTS` manifests and deletes what none references: only names wcoj makes
(`wcoj_core.store.names`), inside the trace directories the manifests name, never through a link;
a folder only a dropped manifest named at once, anything else only after `ORPHAN_AGE`; nothing
at all when a manifest cannot be read.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from wcoj_core.errors import ConcurrentCommit, DamagedState, StateError
from wcoj_core.store import names
from wcoj_core.store.files import Files, Kind, dangling, drop_early
from wcoj_core.store.location import Location
from wcoj_core.store.manifest import FORMAT, FileRef, Manifest, incompatible, referenced

KEEP_MANIFESTS = 8
ORPHAN_AGE = 3600.0
# A store's commits look for orphans (`ORPHAN_AGE`) at its first commit, then at most this often.
SWEEP_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one pruning removed (paths relative to the state), or why it removed nothing."""

    manifests: tuple[str, ...] = ()
    folders: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    skipped: str = ""


def marker_text() -> str:
    """The content of a new state's marker (the version from the package itself, not
    `importlib.metadata`'s imports and lookups)."""
    from wcoj_core import __version__

    by = f"wcoj {__version__}"
    created = datetime.now(UTC).isoformat(timespec="seconds")
    return json.dumps({"wcoj_state": FORMAT, "created": created, "by": by}) + "\n"


class Store:
    """A state directory (a local path, or a URI of remote storage: see `Files`)."""

    def __init__(self, files: Files) -> None:
        self.files = files
        self.root = files.root
        self._parsed: dict[int, Manifest] = {}  # generations read (a file is never rewritten)
        self._swept: float | None = None  # when a commit's pruning last looked for orphans

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        *,
        create: bool,
    ) -> Store:
        """The state at `root`; with `create`, a new one when `root` is new or empty.
        `StateError` for anything else but a state, or storage pyarrow cannot reach;
        `IncompatibleState` for another format."""
        text = os.fspath(root)
        if not Location.of(text).path.strip():
            raise StateError("the state path is empty: pass a directory")
        try:
            store = cls(Files(text))
            store._check_root(text, create)
        except OSError as e:
            raise StateError(f"state {text}: cannot open ({e.strerror or e})") from e
        return store

    def _check_root(self, shown: str, create: bool) -> None:
        files = self.files
        kind = files.kind("")
        if kind is None:
            if files.local and files.path.is_symlink():
                raise StateError(dangling(shown, files.path))
            if not create:
                raise StateError(f"no wcoj state at {shown}")
            files.mkdirs(names.MANIFESTS)
            self._create_marker()
        elif kind is not Kind.DIR:
            raise StateError(
                f"{shown} exists and is not a directory: pass a new or empty directory"
            )
        elif files.kind(names.MARKER) is None:
            if files.entries(""):
                self._refuse_earlier_format()
                self._refuse_lost_marker(shown)
                if create:
                    raise StateError(
                        f"{shown} is not a wcoj state (no {names.MARKER}) and is not empty: "
                        f"pass a new or empty directory"
                    )
                raise StateError(f"no wcoj state at {shown} (no {names.MARKER})")
            if not create:
                raise StateError(f"no wcoj state at {shown}")
            files.mkdirs(names.MANIFESTS)
            self._create_marker()
        self._check_marker()
        if not self.generations():
            self._refuse_lost_manifests()

    def _create_marker(self) -> None:
        self.files.create_exclusive(names.MARKER, marker_text())  # a racing creator wins too

    def _check_marker(self) -> None:
        source = self.files.uri(names.MARKER)
        if self.files.kind(names.MARKER) is not Kind.FILE:
            raise StateError(f"{source} is not a file: not a wcoj state")
        try:
            raw = json.loads(self.files.read_text(names.MARKER))
        except (ValueError, UnicodeDecodeError) as e:
            raise DamagedState(f"{source}: damaged state marker ({e})") from None
        found = raw.get("wcoj_state") if isinstance(raw, dict) else None
        if type(found) is not int:
            raise DamagedState(f'{source}: damaged state marker (no "wcoj_state" number)')
        if found != FORMAT:
            raise incompatible(self.root, found)

    def _refuse_earlier_format(self) -> None:
        """A directory without a marker but with manifests of format 1 (wcoj before the
        marker): say so rather than "not a state"."""
        gens = self.generations()
        if not gens:
            return
        try:
            raw = json.loads(
                self.files.read_text(f"{names.MANIFESTS}/{names.manifest_name(gens[-1])}")
            )
        except (OSError, ValueError, UnicodeDecodeError):
            return
        if isinstance(raw, dict) and raw.get("format") == 1:
            raise incompatible(self.root, 1)

    def _refuse_lost_marker(self, shown: str) -> None:
        """A directory without a marker but with manifests of this format: a state that lost
        its marker (deleted, or copied without it). Say so, and how to restore it."""
        gens = self.generations()
        if not gens:
            return
        raise StateError(
            f"{shown} holds a wcoj state's manifests (generations {gens[0]}..{gens[-1]}) but not "
            f"its marker {names.MARKER} (deleted, or copied without it); if it is a state, "
            f"restore the marker: echo '{{\"wcoj_state\": {FORMAT}}}' > {shown}/{names.MARKER}"
            "; else pass a new or empty directory"
        )

    def _refuse_lost_manifests(self) -> None:
        """A state without a manifest whose traces or arrangements hold a folder made before
        its ``manifests/`` was last changed (or that has no ``manifests/``): its manifests were
        deleted or not copied. A folder made since was staged by a first epoch that never
        committed, as is anything while a commit's temporary manifest is there."""
        made = next((e for e in self.files.entries("") if e.name == names.MANIFESTS), None)
        if made is not None and any(map(names.is_manifest_temp, self.files.names(names.MANIFESTS))):
            return  # a first commit at work (or killed at work): its temporary manifest
        since = made.mtime if made is not None and made.kind is Kind.DIR else float("inf")
        for area in (names.TRACES, names.ARRANGEMENTS):
            for tdir in self.files.entries(area):
                if any(e.mtime < since for e in self.files.entries(f"{area}/{tdir.name}")):
                    raise StateError(
                        f"{self.root} holds {area}/ but no manifest ({names.MANIFESTS}/ was "
                        f"deleted, emptied or not copied): its history cannot be read without "
                        f"one, so nothing was read or changed; restore {names.MANIFESTS}/ from "
                        f"a backup, or pass a new directory"
                    )

    # -- paths -------------------------------------------------------------------------------
    def uri(self, rel: str) -> str:
        """The full path (or URI) of something in the state."""
        return self.files.uri(rel)

    @property
    def local_root(self) -> Path | None:
        """The state's directory when it is on the local file system (None for a URI)."""
        return self.files.path if self.files.local else None

    def batch_files(self, rel: str) -> tuple[FileRef, ...]:
        """The `FileRef`s of a written batch folder's data files (not ``_``/``.`` names)."""
        found = sorted(
            e.name
            for e in self.files.entries(rel)
            if e.kind is Kind.FILE and not e.name.startswith(("_", "."))
        )
        return tuple(self.files.ref(f"{rel}/{name}") for name in found)

    # -- manifests ---------------------------------------------------------------------------
    def generations(self) -> list[int]:
        """The committed generations kept, oldest first."""
        found = (names.generation_of(name) for name in self.files.names(names.MANIFESTS))
        return sorted(g for g in found if g is not None)

    def _manifest_rel(self, generation: int) -> str:
        return f"{names.MANIFESTS}/{names.manifest_name(generation)}"

    def _read(self, generation: int, previous: int | None, fresh: bool = False) -> Manifest:
        found = None if fresh else self._parsed.get(generation)
        if found is None:
            rel = self._manifest_rel(generation)
            back = self.uri(self._manifest_rel(previous)) if previous is not None else None
            found = Manifest.from_json(self.files.read_text(rel), self.uri(rel), back)
            if found.generation != generation:
                raise DamagedState(
                    f"{self.uri(rel)}: damaged manifest: it holds generation "
                    f"{found.generation}"
                    + (f"; the previous generation {back} is the way back" if back else "")
                )
            self._parsed[generation] = found
            while len(self._parsed) > 2 * KEEP_MANIFESTS:
                self._parsed.pop(min(self._parsed))
        return found

    def current(self) -> Manifest:
        """The manifest of the highest committed generation (an empty one for a new state)."""
        try:
            gens = self.generations()
            if not gens:
                self._refuse_lost_manifests()
                return Manifest()
            return self._read(gens[-1], gens[-2] if len(gens) > 1 else None)
        except OSError as e:
            raise StateError(f"state {self.root}: cannot read ({e.strerror or e})") from e

    def generation(self, n: int, *, fresh: bool = False) -> Manifest:
        """A kept generation (0: the empty state before the first commit); with `fresh`, read
        from its file again even when read before."""
        try:
            gens = self.generations()
        except OSError as e:
            raise StateError(f"state {self.root}: cannot read ({e.strerror or e})") from e
        if n == 0 and 0 not in gens:
            return Manifest()
        if n not in gens:
            kept = f"{gens[0]} to {gens[-1]}" if gens else "none"
            raise StateError(f"state {self.root}: generation {n} is not kept (kept: {kept})")
        at = gens.index(n)
        try:
            return self._read(n, gens[at - 1] if at else None, fresh)
        except OSError as e:
            raise StateError(f"state {self.root}: cannot read ({e.strerror or e})") from e

    def commit(self, manifest: Manifest, expected: Manifest) -> Manifest:
        """Commit `manifest` as the generation after `expected` (else `ConcurrentCommit`), the
        folders it adds made durable first; then prune."""
        new = replace(manifest, generation=expected.generation + 1)
        text = new.to_json()
        rel = self._manifest_rel(new.generation)
        held = expected.paths()
        try:
            gens = self.generations()
            if expected.generation not in (0, *gens) and not (gens and gens[-1] >= new.generation):
                raise StateError(
                    f"state {self.root}: generation {expected.generation}, which this writer "
                    f"built on, is gone from {names.MANIFESTS}/ (deleted meanwhile); nothing "
                    f"was applied: restore {names.MANIFESTS}/ from a backup"
                )
            # The new folders made durable with the manifest's own content, then it is linked.
            created = (not gens or gens[-1] < new.generation) and self.files.create_exclusive(
                rel, text, after=sorted(new.paths() - held), durable=_folders_above(held)
            )
        except OSError as e:
            why = e.strerror or (str(e).strip().splitlines() or [type(e).__name__])[0]
            if self._holds(rel, text):  # linked: only making it durable failed
                raise StateError(
                    f"state {self.root}: generation {new.generation} was committed, but "
                    f"making it durable failed ({why}): a crash may lose it"
                ) from e
            raise StateError(
                f"state {self.root}: cannot commit ({why}); nothing was applied"
            ) from e
        if not created:
            raise ConcurrentCommit(
                f"state {self.root}: generation {new.generation} was committed by another "
                f"writer while this one was working; nothing was applied, reload and retry"
            )
        self._parsed[new.generation] = new
        # The commit stands whatever pruning meets (the next commit prunes again): nothing may
        # raise now, or a caller would take its committed folders for staged ones.
        with contextlib.suppress(Exception):
            now = time.time()
            sweep = self._swept is None or now - self._swept >= SWEEP_SECONDS
            self.prune(now, orphans=sweep)
            if sweep:
                self._swept = now
        return new

    def _holds(self, rel: str, text: str) -> bool:
        """Whether the file `rel` holds `text` (False when it cannot be read)."""
        try:
            return self.files.read_text(rel) == text
        except Exception:
            return False

    # -- pruning -----------------------------------------------------------------------------
    def _real_dir(self, rel: str) -> bool:
        """Whether every component of `rel` is a directory (no symbolic link on the way)."""
        parts = rel.split("/")
        return all(self.files.kind("/".join(parts[: i + 1])) is Kind.DIR for i in range(len(parts)))

    def _referenced(self, generation: int) -> tuple[set[str], set[str]]:
        """The traces and folders a generation names (from its parsed manifest when this store
        read it already, else by the light read of `referenced`)."""
        parsed = self._parsed.get(generation)
        if parsed is not None:
            return set(parsed.traces), parsed.paths()
        rel = self._manifest_rel(generation)
        return referenced(self.files.read_text(rel), self.uri(rel))

    def prune(self, now: float | None = None, *, orphans: bool = True) -> Pruned:
        """Drop manifests beyond the last `KEEP_MANIFESTS` and what no kept one references (see
        the module); with `orphans` False only what dropped manifests retired, no search for
        orphans."""
        now = time.time() if now is None else now
        gens = self.generations()
        if not gens:
            return Pruned(skipped="no manifest: nothing is deleted without one")
        kept, dropped = gens[-KEEP_MANIFESTS:], gens[:-KEEP_MANIFESTS]
        live: set[str] = set()
        retired: set[str] = set()
        trace_dirs: set[str] = set()
        for found, chosen in ((live, kept), (retired, dropped)):
            for g in chosen:
                try:
                    traces, paths = self._referenced(g)
                except (StateError, OSError) as e:
                    return Pruned(skipped=f"never delete on a doubt: {e}")
                found.update(paths)
                if chosen is kept:
                    trace_dirs.update(names.trace_dir(t) for t in traces)
        retired -= live
        out_manifests = []
        for g in dropped:
            rel = self._manifest_rel(g)
            self.files.delete(rel)
            self._parsed.pop(g, None)
            out_manifests.append(rel)
        out_folders: list[str] = []
        for path in sorted(retired):  # paths wcoj made (checked when the manifest was read)
            if self._remove_made(path):
                out_folders.append(path)
        if not orphans:
            return Pruned(tuple(out_manifests), tuple(out_folders))
        for area in (names.TRACES, names.ARRANGEMENTS):
            for tdir in sorted(trace_dirs):
                folder = f"{area}/{tdir}"
                if not self._real_dir(folder):
                    continue
                for e in self.files.entries(folder):
                    path = f"{folder}/{e.name}"
                    if path in live or now - e.mtime <= ORPHAN_AGE:
                        continue
                    if area == names.TRACES:
                        if (
                            e.kind is Kind.DIR
                            and names.is_own_batch(e.name)
                            and self._remove_own(path)
                        ):
                            out_folders.append(path)
                    elif e.kind is Kind.FILE and names.is_own_segment_file(e.name):
                        self.files.delete(path)
                        out_folders.append(path)
        if self._real_dir(names.SCRATCH):
            for e in self.files.entries(names.SCRATCH):
                if (
                    e.kind is Kind.DIR
                    and names.is_own_scratch(e.name)
                    and now - e.mtime > ORPHAN_AGE
                ):
                    path = f"{names.SCRATCH}/{e.name}"
                    if self._remove_own(path):
                        out_folders.append(path)
        out_files: list[str] = []
        if self._real_dir(names.MANIFESTS):
            for e in self.files.entries(names.MANIFESTS):
                if (
                    e.kind is Kind.FILE
                    and names.is_manifest_temp(e.name)
                    and now - e.mtime > ORPHAN_AGE
                ):
                    path = f"{names.MANIFESTS}/{e.name}"
                    self.files.delete(path)
                    out_files.append(path)
        return Pruned(tuple(out_manifests), tuple(out_folders), tuple(out_files))

    def discard(self, paths: Iterable[str]) -> list[str]:
        """Remove staged folders that will never be committed, never raising: a path that is not
        a name wcoj makes, or that the current generation references, is left alone and returned;
        nothing is deleted when the current manifest cannot be read."""
        chosen = list(paths)
        if self.files.local:
            drop_early([f"{self.root}/{p}" for p in chosen])
        try:
            live = self.current().paths()
        except Exception:
            return chosen
        kept: list[str] = []
        for p in chosen:
            own = names.is_batch_path(p) or names.is_segment_path(p) or _is_scratch_path(p)
            if not own or p in live:
                kept.append(p)
                continue
            try:
                made = self._real_dir(p) or self.files.kind(p) is Kind.FILE
                if made and not self._remove_made(p):
                    kept.append(p)
            except Exception:
                kept.append(p)
        return kept

    def _remove_made(self, path: str) -> bool:
        """Remove a batch or segment wcoj made: a folder of its files (`_remove_own`), or a
        segment's one file; True when it is gone (never through a symbolic link)."""
        if names.is_segment_path(path):
            if not self._real_dir(path.rpartition("/")[0]):
                return False
            if self.files.kind(path) is Kind.FILE:
                self.files.delete(path)
                return True
            return False
        return self._real_dir(path) and self._remove_own(path)

    def _remove_own(self, path: str) -> bool:
        """Remove a folder wcoj made: the files it writes there (Parquet parts, spilled runs
        and what Spark leaves beside them), then the folder if nothing else is left in it. A
        file of anyone else's keeps the folder and itself; True when the folder is gone."""
        for e in self.files.entries(path):
            if not names.is_batch_file(e.name):
                continue
            if e.kind is Kind.FILE or (e.kind is Kind.DIR and e.name == "_temporary"):
                self.files.delete(f"{path}/{e.name}")
        return self.files.remove_dir(path)


def _folders_above(paths: Iterable[str]) -> set[str]:
    """Every folder above the given paths (relative; the root, "", left out).

    >>> sorted(_folders_above(["traces/t/b-1", "traces/u/b-2"]))
    ['traces', 'traces/t', 'traces/u']
    """
    out: set[str] = set()
    for p in paths:
        parent = p.rpartition("/")[0]
        while parent and parent not in out:
            out.add(parent)
            parent = parent.rpartition("/")[0]
    return out


def _is_scratch_path(path: str) -> bool:
    area, sep, name = path.partition("/")
    return bool(sep) and area == names.SCRATCH and names.is_own_scratch(name)
