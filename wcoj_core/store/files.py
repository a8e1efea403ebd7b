"""The files of a state, on this machine's disk or on remote storage: the one file interface.

The store, the batch codec (`wcoj_core.store.batches`) and the checks reach every file through
`Files`, by '/'-separated paths relative to the state's root: on this machine with Python's file
API (exclusive creation by a hard link of a fsynced temporary file; never listing or deleting
through a symbolic link), remotely through its pyarrow file system (`Files.fs`; exclusive creation
by a move that refuses a target: atomic on HDFS, one writer at a time on object stores). Also: a
`FileRef` (size, sha256, stamp), `check_stamp`, `verify_ref`, `write_sealed` (hashed while
written, read-only) and the syncs of an epoch's writes (`sync_soon`, `Files.sync_many`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import hashlib
import os
import queue
import shutil
import stat
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wcoj_core.errors import out_of_memory
from wcoj_core.knobs import knob
from wcoj_core.store.location import Location
from wcoj_core.store.manifest import FileRef, Stamp
from wcoj_core.store.names import temp_name

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

CHUNK = 1 << 20  # files are hashed 1 MiB at a time


class Kind(Enum):
    FILE = "file"
    DIR = "dir"
    LINK = "link"  # a symbolic link: never followed, never deleted through
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a folder: its name, modification time (seconds) and kind."""

    name: str
    mtime: float
    kind: Kind


def dangling(shown: str, link: Path) -> str:
    """What to say of a state path that is a symbolic link to nothing.

    >>> dangling("s", Path("/nonexistent-link")).split(";")[0]
    's is a symbolic link to a path that does not exist (cannot be read: ...)'
    """
    try:
        target = f"{os.readlink(link)}, which does not exist"
    except OSError:
        target = "a path that does not exist (cannot be read: ...)"
    return (
        f"{shown} is a symbolic link to {target}; create it as an empty directory, or pass "
        "another path"
    )


def _kind_of(mode: int) -> Kind:
    if stat.S_ISLNK(mode):
        return Kind.LINK
    if stat.S_ISDIR(mode):
        return Kind.DIR
    if stat.S_ISREG(mode):
        return Kind.FILE
    return Kind.OTHER


class Files:
    """The files under a state's root (see the module).

    `over` reaches the root through a given pyarrow file system and path instead of its own
    (a local root through one that is not the local one behaves as remote storage: tests)."""

    def __init__(
        self, root: str | os.PathLike[str], over: tuple[pafs.FileSystem, str] | None = None
    ) -> None:
        self.location = Location.of(root)
        self.root = self.location.absolute()
        self.path = Path(self.root)  # on this machine (when `local`)
        self.local = self.location.local and over is None
        self._fs, self.base = over or (
            (None, self.root) if self.local else self.location.file_system()
        )

    @property
    def fs(self) -> pafs.FileSystem:
        """The pyarrow file system the state is on (what Parquet is read and written through)."""
        if self._fs is None:
            import pyarrow.fs as pafs

            self._fs = pafs.LocalFileSystem()
        return self._fs

    def full(self, rel: str) -> str:
        """The path of `rel` in `fs`."""
        return f"{self.base}/{rel}" if self.base else rel

    def uri(self, rel: str) -> str:
        """How `rel` is named to a user: a local path, or a URI as the root was given."""
        return f"{self.root}/{rel}" if rel else self.root

    def spark_uri(self, rel: str) -> str:
        """`rel` as a URI Spark reads and writes (`Location.spark_uri`)."""
        return self.location.spark_uri(rel)

    def entries(self, rel: str) -> list[Entry]:
        """The entries of a folder (none when it is not a folder, or is a link to one). An
        entry whose storage keeps no modification time (a folder of an object store) is new."""
        if self.kind(rel) is not Kind.DIR:
            return []
        if not self.local:
            import pyarrow.fs as pafs

            found = self.fs.get_file_info(pafs.FileSelector(self.full(rel), allow_not_found=True))
            now = time.time()
            return [
                Entry(i.base_name, i.mtime_ns / 1e9 if i.mtime_ns else now, kind)
                for i in found
                if (kind := _arrow_kind(i.type)) is not None
            ]
        out = []
        with os.scandir(self.path / rel) as found:
            for e in found:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:  # deleted meanwhile
                    continue
                out.append(Entry(e.name, st.st_mtime, _kind_of(st.st_mode)))
        return out

    def names(self, rel: str) -> list[str]:
        """The names in a folder, as `entries` finds them, without each one's status (what
        listing the manifests needs, several times an epoch)."""
        if not self.local or self.kind(rel) is not Kind.DIR:
            return [e.name for e in self.entries(rel)]
        try:
            return os.listdir(self.path / rel)
        except (FileNotFoundError, NotADirectoryError):  # removed meanwhile
            return []

    def kind(self, rel: str) -> Kind | None:
        """What is at `rel` (not following a link), None when nothing is; the root itself
        may be a link to a directory."""
        if not self.local:
            return _arrow_kind(self.fs.get_file_info(self.full(rel)).type)
        try:
            st = os.stat(self.path) if rel in ("", ".") else os.lstat(self.path / rel)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return _kind_of(st.st_mode)

    def read_text(self, rel: str) -> str:
        """A text file; bytes that are not UTF-8 read as replacement characters (a damaged
        manifest then fails its digest check, one line, rather than decoding)."""
        if self.local:
            data = (self.path / rel).read_bytes()
        else:
            with self.fs.open_input_stream(self.full(rel)) as f:
                data = f.read()
        return data.decode("utf-8", errors="replace")

    def create_exclusive(
        self, rel: str, text: str, *, after: Sequence[str] = (), durable: Collection[str] = ()
    ) -> bool:
        """Create `rel` holding `text`, or return False when it exists: a fsynced temporary file
        hard-linked as `rel`, the folder fsynced; `after` (and `durable`, as `sync_many` takes
        them) is made durable in the same wait, before the link."""
        folder, _, name = rel.rpartition("/")
        self.mkdirs(folder)
        tmp = f"{folder}/{temp_name(name)}" if folder else temp_name(name)
        if not self.local:
            try:
                self.put(tmp, text.encode())
                if self.kind(rel) is not None:
                    return False
                self.fs.move(self.full(tmp), self.full(rel))
                return True
            finally:
                self.delete(tmp)
        target, temp = self.path / rel, self.path / tmp
        try:
            with open(temp, "x") as out:  # mode 0666 less the umask
                out.write(text)
                out.flush()
                if after:
                    self.sync_many(after, durable, also=(temp,))
                else:
                    os.fsync(out.fileno())  # durable before it becomes visible
            os.link(temp, target)  # fails if the target exists: atomic create-exclusive
            fsync_dir(target.parent)
            return True
        except FileExistsError:
            return False
        finally:
            temp.unlink(missing_ok=True)

    def mkdirs(self, rel: str) -> None:
        """Make a folder and those above it (one ``mkdir`` when its parent is there)."""
        if self.local:
            (self.path / rel).mkdir(parents=True, exist_ok=True)
        else:
            self.fs.create_dir(self.full(rel), recursive=True)

    def put(self, rel: str, data: pa.Buffer | bytes) -> FileRef:
        """Write a new whole file (created exclusively on this machine); its reference (with
        its stamp on this machine). The commit naming it makes it durable (`sync_many`)."""
        digest = hashlib.sha256(memoryview(data)).hexdigest()
        name = rel.rpartition("/")[2]
        if not self.local:
            with self.fs.open_output_stream(self.full(rel)) as out:
                out.write(data)
            return FileRef(name, len(memoryview(data)), digest, None)
        path = self.path / rel
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        st = os.stat(path)
        return FileRef(name, st.st_size, digest, stamp_of(st))

    def delete(self, rel: str) -> None:
        """Delete a file or a folder with everything in it; a symbolic link is left alone (and
        a link inside the folder is removed as a link: its target stays)."""
        kind = self.kind(rel)
        if not self.local:
            with contextlib.suppress(FileNotFoundError):
                if kind is Kind.DIR:
                    self.fs.delete_dir(self.full(rel))
                elif kind is Kind.FILE:
                    self.fs.delete_file(self.full(rel))
        elif kind is Kind.DIR:
            shutil.rmtree(self.path / rel, ignore_errors=True)
        elif kind is Kind.FILE:
            with contextlib.suppress(FileNotFoundError):
                (self.path / rel).unlink()

    def remove_dir(self, rel: str) -> bool:
        """Remove an empty folder; False (and nothing removed) when it holds anything."""
        if not self.local:
            if self.entries(rel):
                return False
            self.delete(rel)
            return True
        try:
            os.rmdir(self.path / rel)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def sync_many(
        self, rels: Sequence[str], durable: Collection[str] = (), also: Sequence[Path] = ()
    ) -> None:
        """Make files and folders durable with their entries, on a few threads; `durable` names
        folders whose own entries are durable already (their parents are not synced).
        ``WCOJ_SYNCFS=1``: one ``syncfs`` instead. `also`: more files to fsync meanwhile. Nothing
        to do on remote storage."""
        if not self.local or (not rels and not also):
            return
        if knob("WCOJ_SYNCFS") == "1" and _syncfs(self.path):
            drop_early([f"{self.root}/{rel}" for rel in rels])
            return
        early: list[_Pending] = []
        files, folders = self._durable(rels, durable, early)
        # Every file and every folder once (folders share their parents), all at once; then
        # the folders whose syncs started when they were written (`sync_soon`).
        failure: BaseException | None = None
        try:
            _syncers().sync([*also, *files, *sorted(folders)])
        except BaseException as e:
            failure = e
        for pending in early:
            try:
                pending.wait()
            except BaseException as e:
                failure = failure or e
        if failure is not None:
            raise failure

    def _durable(
        self,
        rels: Sequence[str],
        durable: Collection[str] = (),
        early: list[_Pending] | None = None,
    ) -> tuple[list[str], set[str]]:
        """What `sync_many` fsyncs of `rels`: the files in them and every folder up to the root
        (or to a folder of `durable`), each once. With `early`, a folder whose syncs started when
        written (`sync_soon`) adds them to `early` instead."""
        root = self.root
        files: list[str] = []
        folders: set[str] = set()
        for rel in rels:
            top = f"{root}/{rel}"
            started = _take_early(top) if early is not None else None
            if started is not None and early is not None:
                early.append(started)
            elif not self._inside(top, files, folders):
                continue  # nothing there (an empty segment has no file): nothing to sync
            parent = rel.rpartition("/")[0]
            while True:
                folders.add(f"{root}/{parent}" if parent else root)
                if not parent or parent in durable:
                    break
                parent = parent.rpartition("/")[0]
        return files, folders

    @staticmethod
    def _inside(top: str, files: list[str], folders: set[str]) -> bool:
        """A file, or a folder with every file and folder in it (links not followed); False
        when nothing is there."""
        try:
            mode = os.lstat(top).st_mode
        except FileNotFoundError:
            return False
        if stat.S_ISREG(mode):
            files.append(top)
        elif stat.S_ISDIR(mode):
            for folder, _, names in os.walk(top):
                folders.add(folder)
                for name in names:
                    p = f"{folder}/{name}"
                    if stat.S_ISREG(os.lstat(p).st_mode):
                        files.append(p)
        return True

    def digest(self, rel: str) -> tuple[int, str]:
        """The size and sha256 of a file, read a block at a time."""
        if self.local:
            return sha256_file(self.path / rel)
        h = hashlib.sha256()
        size = 0
        with self.fs.open_input_stream(self.full(rel)) as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
                size += len(chunk)
        return size, h.hexdigest()

    def ref(self, rel: str) -> FileRef:
        """A file's name, size and sha256 (no stamp)."""
        return FileRef(rel.rpartition("/")[2], *self.digest(rel))

    def verify(self, rel: str, ref: FileRef, *, digest: bool = True) -> str | None:
        """None when a file has `ref`'s size (and, with `digest`, its sha256), else what is
        wrong (`verify_ref`)."""
        if self.local:
            return verify_ref(self.path / rel, ref, digest=digest)
        import pyarrow as pa

        try:
            info = self.fs.get_file_info(self.full(rel))
            kind = _arrow_kind(info.type)
            if kind is not Kind.FILE:
                return "missing" if kind is None else "is not a file"
            return _mismatch(info.size, ref, (lambda: self.digest(rel)[1]) if digest else None)
        except (OSError, pa.ArrowException) as e:
            if out_of_memory(e):
                raise  # no sign of damage (`wcoj_core.errors.read_failure`)
            return f"cannot be read ({e})"


def _arrow_kind(kind: Any) -> Kind | None:
    """A pyarrow `FileType` as a `Kind` (None: not found)."""
    return {0: None, 2: Kind.FILE, 3: Kind.DIR}.get(int(kind), Kind.OTHER)


def _mismatch(size: int, ref: FileRef, sha256: Callable[[], str] | None) -> str | None:
    """What differs between a file of `size` bytes (and `sha256`, read only when the sizes
    agree) and `ref`; None when nothing does.

    >>> _mismatch(3, FileRef("f", 4, "ab"), None)
    'is 3 bytes, the manifest says 4'
    """
    if size != ref.size:
        return f"is {size} bytes, the manifest says {ref.size}"
    found = sha256() if sha256 is not None else ref.sha256
    if found != ref.sha256:
        return f"its sha256 {found[:12]}... differs from the manifest's {ref.sha256[:12]}..."
    return None


# -- local files: refs, stamps, sealed writes, syncing ----------------------------------------------


def stamp_of(st: os.stat_result) -> Stamp:
    """What tells that a file is still the one written: inode, mtime and ctime (ns)."""
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def sha256_file(path: str | os.PathLike[str]) -> tuple[int, str]:
    """The size and sha256 of a file, read 1 MiB at a time."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def file_ref(path: str | os.PathLike[str], *, stamped: bool = True) -> FileRef:
    """The `FileRef` of a local file: its size, sha256 and (when `stamped`) its stamp."""
    before = os.stat(path)
    size, sha = sha256_file(path)
    return FileRef(Path(path).name, size, sha, stamp_of(before) if stamped else None)


def check_stamp(path: str | os.PathLike[str], ref: FileRef) -> bool:
    """Whether a file is still the one `ref` describes, by its stamp and size (no reading)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return ref.stamp is not None and st.st_size == ref.size and stamp_of(st) == ref.stamp


def verify_ref(path: str | os.PathLike[str], ref: FileRef, *, digest: bool = True) -> str | None:
    """None when a file has `ref`'s size and (with `digest`: read whole) its sha256, else what
    is wrong."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a file"
    try:
        return _mismatch(st.st_size, ref, (lambda: sha256_file(path)[1]) if digest else None)
    except OSError as e:
        if out_of_memory(e):
            raise  # no sign of damage (`wcoj_core.errors.read_failure`)
        return f"cannot be read ({e.strerror or e})"


class HashingWriter:
    """A binary file being written, hashed (sha256) and counted as the bytes go by."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data)
        self._hash.update(view)
        self.size += view.nbytes
        self._raw.write(view)
        return view.nbytes

    def flush(self) -> None:
        self._raw.flush()

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


def write_sealed(
    path: str | os.PathLike[str], write: Callable[[HashingWriter], None], *, sync: bool = False
) -> FileRef:
    """Write a new file that is never changed again, and its `FileRef` (stamp included): created
    exclusively in a folder nothing reads before a manifest names it, hashed as written, made
    read-only. A failure removes it; a crash leaves an orphan folder the pruning removes. The
    commit makes it durable (`Files.sync_many`), unless `sync`."""
    target = os.fspath(path)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # less the umask
    try:
        with os.fdopen(fd, "wb") as raw:
            out = HashingWriter(raw)
            write(out)
            raw.flush()
            if sync:
                os.fsync(raw.fileno())
            os.fchmod(raw.fileno(), stat.S_IMODE(os.fstat(raw.fileno()).st_mode) & ~0o222)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
        raise
    st = os.stat(target)  # after the chmod, which changes the ctime
    return FileRef(os.path.basename(target), out.size, out.sha256, stamp_of(st))


# Threads syncing files at once where `syncfs` is missing.
SYNC_THREADS = 8


def _syncfs(path: Path) -> bool:
    """``syncfs(2)`` on the file system holding `path`: every dirty page of it written and
    its journal committed, in one call; False where the call is not available."""
    libc = _libc()
    if libc is None:
        return False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
        return True
    finally:
        os.close(fd)


@functools.cache
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.syncfs.argtypes = [ctypes.c_int]
        libc.syncfs.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


class _Syncers:
    """Daemon threads that fsync paths for `sync_many`. Daemons, not a thread pool: Python
    joins a pool's threads at exit, and a Ctrl-C that lands while the pool's locks are held
    (inside ``submit``) leaves the process waiting on them at exit forever. A daemon is never
    waited for; an interrupted caller leaves at most a few fsyncs running, which are harmless."""

    def __init__(self, threads: int) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[str | Path, queue.SimpleQueue[BaseException | None]]
        ] = queue.SimpleQueue()
        for i in range(threads):
            threading.Thread(target=self._work, name=f"wcoj-sync-{i}", daemon=True).start()

    def _work(self) -> None:
        while True:
            path, done = self._jobs.get()
            try:
                _fsync_path(path)
            except BaseException as exc:  # handed to the caller, which raises it
                done.put(exc)
            else:
                done.put(None)

    def submit(self, paths: Sequence[str | Path]) -> _Pending:
        """Start fsyncing every one of `paths` on the threads; what to wait for."""
        done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        for path in paths:
            self._jobs.put((path, done))
        return _Pending(done, len(paths))

    def sync(self, paths: Sequence[str | Path]) -> None:
        """fsync every one of `paths` on the threads; raise the first failure after all ran."""
        self.submit(paths).wait()


class _Pending:
    """fsyncs started on the sync threads: `wait` returns once all ran, raising the first
    failure."""

    def __init__(self, done: queue.SimpleQueue[BaseException | None], count: int) -> None:
        self._done = done
        self._count = count

    def wait(self) -> None:
        failures = [exc for exc in (self._done.get() for _ in range(self._count)) if exc]
        self._count = 0
        if failures:
            raise failures[0]


# Folders whose fsyncs started as soon as they were written (`sync_soon`), by absolute path:
# the commit naming one waits for them rather than starting them (`Files.sync_many`).
_EARLY: dict[str, _Pending] = {}
_EARLY_LOCK = threading.Lock()


def sync_soon(root: str, rel: str) -> None:
    """Start making a file or a folder `rel` of the local state `root`, just written whole,
    durable — the file, or every file in the folder and its entries — on the sync threads,
    while the epoch goes on; the commit that names it waits for them before its manifest
    exists (and syncs the folders above it then). Only for what nothing more is written into
    (a segment, a batch)."""
    top = f"{Location.of(root).absolute()}/{rel}"
    try:
        if stat.S_ISDIR(os.lstat(top).st_mode):
            paths = [*(f"{top}/{name}" for name in os.listdir(top)), top]
        else:
            paths = [top]
    except OSError:
        return  # the commit syncs it (or reports why it cannot)
    pending = _syncers().submit(paths)
    with _EARLY_LOCK:
        _EARLY[top] = pending


def _take_early(folder: str) -> _Pending | None:
    with _EARLY_LOCK:
        return _EARLY.pop(folder, None)


def drop_early(folders: Collection[str]) -> None:
    """Forget the early syncs of folders that will not be committed (discarded)."""
    with _EARLY_LOCK:
        for folder in folders:
            _EARLY.pop(folder, None)


_SYNCERS: dict[int, _Syncers] = {}


def _syncers() -> _Syncers:
    """The sync threads, started once per process (a forked child starts its own)."""
    pid = os.getpid()
    if pid not in _SYNCERS:
        _SYNCERS.clear()
        _SYNCERS[pid] = _Syncers(SYNC_THREADS)
    return _SYNCERS[pid]


def _fsync_path(path: str | Path) -> None:
    """fsync a file, or a folder's entries (a folder opens read-only as a file does)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a folder's entries durable (new, renamed or removed names in it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
