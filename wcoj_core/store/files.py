"""The file operations a state needs, on a local disk or any Hadoop file system.

A `Store` keeps its manifests in small JSON files and its data in folders of files; it lists,
reads, creates exclusively, syncs and deletes them through the `Files` interface:

* `LocalFiles` — plain paths and ``file://`` URIs, with Python's file API. Creating a file
  exclusively is a hard link of a fully written, fsynced temporary file: atomic on POSIX file
  systems. Listing never follows a symbolic link; deleting never deletes through one.
* `HadoopFiles` — ``hdfs://``, ``s3a://``, ``abfs://``, ... through the Hadoop ``FileSystem`` of
  a Spark session (same credentials and settings as Spark's own reads and writes). Creating
  exclusively writes a temporary file and renames it; the rename is atomic and refuses an
  existing target on HDFS; on object stores without atomic rename, run one writer at a time.

And what a state needs of local files: a `FileRef` of a written file (size, sha256, stamp),
the cheap check that a file is still the one written (`check_stamp`), the full one
(`verify_ref`), files written sealed (`write_sealed`: hashed while written, read-only, in a
folder nothing reads before the commit) and `sync_tree` for folders written by others (pyarrow,
Spark) before the manifest naming them is committed. Every file created here honours the umask.
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
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from wcoj_core.errors import out_of_memory
from wcoj_core.store.manifest import FileRef, Stamp
from wcoj_core.store.names import temp_name

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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


class Files(Protocol):
    """File operations relative to a root; names are '/'-separated relative paths."""

    root: str

    def uri(self, rel: str) -> str: ...

    def entries(self, rel: str) -> list[Entry]: ...

    def names(self, rel: str) -> list[str]: ...

    def kind(self, rel: str) -> Kind | None: ...

    def read_text(self, rel: str) -> str: ...

    def create_exclusive(
        self, rel: str, text: str, *, after: Sequence[str] = (), durable: Collection[str] = ()
    ) -> bool: ...

    def mkdirs(self, rel: str) -> None: ...

    def delete(self, rel: str) -> None: ...

    def sync(self, rel: str) -> None: ...

    def sync_many(
        self, rels: Sequence[str], durable: Collection[str] = (), also: Sequence[Path] = ()
    ) -> None: ...

    def remove_dir(self, rel: str) -> bool: ...

    def ref(self, rel: str) -> FileRef: ...

    def verify(self, rel: str, ref: FileRef) -> str | None: ...

    def list(self, rel: str) -> list[tuple[str, float]]: ...


def has_scheme(root: str) -> bool:
    """True for a URI with a scheme other than ``file``.

    >>> has_scheme("s3a://bucket/state"), has_scheme("file:///tmp/x"), has_scheme("/tmp/x")
    (True, False, False)
    """
    scheme, sep, _ = root.partition("://")
    return bool(sep) and scheme != "file"


def local_path(root: str) -> Path:
    """The absolute local path of a root given as a path or a ``file://`` URI.

    >>> str(local_path("file:///tmp/x")), str(local_path("/tmp/x/"))
    ('/tmp/x', '/tmp/x')
    """
    return Path(root.removeprefix("file://")).absolute()


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


class LocalFiles:
    """A local directory."""

    def __init__(self, root: str) -> None:
        self.path = local_path(root)
        self.root = str(self.path)

    def uri(self, rel: str) -> str:
        return str(self.path / rel)

    def entries(self, rel: str) -> list[Entry]:
        """The entries of a folder (none when it is not a folder, or is a link to one)."""
        if self.kind(rel) is not Kind.DIR:
            return []
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
        if self.kind(rel) is not Kind.DIR:
            return []
        try:
            return os.listdir(self.path / rel)
        except (FileNotFoundError, NotADirectoryError):  # removed meanwhile
            return []

    def kind(self, rel: str) -> Kind | None:
        """What is at `rel` (not following a link), None when nothing is; the root itself
        may be a link to a directory."""
        try:
            st = os.stat(self.path) if rel in ("", ".") else os.lstat(self.path / rel)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return _kind_of(st.st_mode)

    def read_text(self, rel: str) -> str:
        """A text file; bytes that are not UTF-8 read as replacement characters (a damaged
        manifest then fails its digest check, one line, rather than decoding)."""
        return (self.path / rel).read_bytes().decode("utf-8", errors="replace")

    def create_exclusive(
        self, rel: str, text: str, *, after: Sequence[str] = (), durable: Collection[str] = ()
    ) -> bool:
        """Create `rel` holding `text`, or return False when it exists: a temporary file,
        fsynced, hard-linked as `rel` (atomic: the link fails on an existing name), the folder
        fsynced. `after` (with `durable`, as `sync_many` takes them) is made durable before the
        link too, its fsyncs and the temporary file's all at once: what a commit point names
        is durable before it exists, at the cost of one wait rather than two."""
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(temp_name(target.name))
        try:
            with open(tmp, "x") as out:  # mode 0666 less the umask
                out.write(text)
                out.flush()
                if after:
                    self.sync_many(after, durable, also=(tmp,))
                else:
                    os.fsync(out.fileno())  # durable before it becomes visible
            os.link(tmp, target)  # fails if the target exists: atomic create-exclusive
            fsync_dir(target.parent)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def mkdirs(self, rel: str) -> None:
        (self.path / rel).mkdir(parents=True, exist_ok=True)

    def delete(self, rel: str) -> None:
        """Delete a file or a folder with everything in it; a symbolic link is left alone (and
        a link inside the folder is removed as a link: its target stays)."""
        target = self.path / rel
        kind = self.kind(rel)
        if kind is Kind.DIR:
            shutil.rmtree(target, ignore_errors=True)
        elif kind is Kind.FILE:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()

    def remove_dir(self, rel: str) -> bool:
        """Remove an empty folder; False (and nothing removed) when it holds anything."""
        try:
            os.rmdir(self.path / rel)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def sync(self, rel: str) -> None:
        """Make a file or folder durable, and its entry in each folder up to the root."""
        if self.kind(rel) is None:
            return
        sync_tree(self.path / rel)
        parent = (self.path / rel).parent
        while parent != self.path and self.path in parent.parents:
            parent = parent.parent
            fsync_dir(parent)

    def sync_many(
        self, rels: Sequence[str], durable: Collection[str] = (), also: Sequence[Path] = ()
    ) -> None:
        """Make files and folders durable, with their entries: each of them, on a few threads
        (the file system batches concurrent syncs into few journal commits, where one after
        another each waits for its own). `durable` names folders (relative) whose own entries
        are durable already (they held what a committed generation names): a new entry in one
        is synced with it, but its parents are not. With ``WCOJ_SYNCFS=1`` one
        ``syncfs`` of the whole file system instead (fewer calls, but it also waits for every
        other process's dirty pages). `also` are more files to fsync at the same time (their
        entries not)."""
        if not rels and not also:
            return
        if os.environ.get("WCOJ_SYNCFS") == "1" and _syncfs(self.path):
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
        """What `sync` of each of `rels` fsyncs: the files in them, and the folders in them
        with every folder up to the root, each once; the climb stops at a folder of `durable`
        (synced for its new entry, its own entry durable already). Paths made as strings.
        With `early`, a folder whose syncs started when it was written (`sync_soon`) adds
        them to `early` instead of its files and itself (the folders above it still count)."""
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

    def ref(self, rel: str) -> FileRef:
        return file_ref(self.path / rel, stamped=False)

    def verify(self, rel: str, ref: FileRef) -> str | None:
        return verify_ref(self.path / rel, ref)

    def list(self, rel: str) -> list[tuple[str, float]]:
        """Names and modification times in a folder (the old interface of the state's files)."""
        return [(e.name, e.mtime) for e in self.entries(rel)]


class HadoopFiles:
    """A directory on any file system Hadoop (and so Spark) can reach."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.root = root.rstrip("/")
        # py4j is the only way to Hadoop's FileSystem from Python.
        jvm: Any = spark._jvm
        jsc: Any = spark.sparkContext._jsc
        self._Path = jvm.org.apache.hadoop.fs.Path
        self._jvm = jvm
        conf = jsc.hadoopConfiguration()
        self._fs = self._Path(self.root).getFileSystem(conf)

    def _p(self, rel: str) -> Any:
        return self._Path(f"{self.root}/{rel}")

    def uri(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def entries(self, rel: str) -> list[Entry]:
        folder = self._p(rel)
        if not self._fs.exists(folder) or not self._fs.getFileStatus(folder).isDirectory():
            return []
        return [
            Entry(s.getPath().getName(), s.getModificationTime() / 1000.0, self._kind(s))
            for s in self._fs.listStatus(folder)
        ]

    def names(self, rel: str) -> list[str]:
        return [e.name for e in self.entries(rel)]

    @staticmethod
    def _kind(status: Any) -> Kind:
        if status.isSymlink():
            return Kind.LINK
        if status.isDirectory():
            return Kind.DIR
        return Kind.FILE if status.isFile() else Kind.OTHER

    def kind(self, rel: str) -> Kind | None:
        path = self._p(rel)
        if not self._fs.exists(path):
            return None
        return self._kind(self._fs.getFileStatus(path))

    def read_text(self, rel: str) -> str:
        stream = self._fs.open(self._p(rel))
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def create_exclusive(
        self, rel: str, text: str, *, after: Sequence[str] = (), durable: Collection[str] = ()
    ) -> bool:
        """Create `rel` exclusively (see the class); `after` needs nothing here (`sync`)."""
        target = self._p(rel)
        folder, _, name = rel.rpartition("/")
        tmp = self._p(f"{folder}/{temp_name(name)}" if folder else temp_name(name))
        out = self._fs.create(tmp, False)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        try:
            if self._fs.exists(target):
                return False
            return bool(self._fs.rename(tmp, target))
        finally:
            self._fs.delete(tmp, False)

    def mkdirs(self, rel: str) -> None:
        self._fs.mkdirs(self._p(rel))

    def delete(self, rel: str) -> None:
        if self.kind(rel) in (Kind.FILE, Kind.DIR):
            self._fs.delete(self._p(rel), True)

    def remove_dir(self, rel: str) -> bool:
        """Remove an empty folder (a non-recursive delete refuses a folder holding anything)."""
        try:
            return bool(self._fs.delete(self._p(rel), False)) or self.kind(rel) is None
        except Exception:  # a Java IOException: the folder is not empty
            return False

    def sync(self, rel: str) -> None:
        """Nothing to do: a Hadoop file is durable once its writer closed it."""

    def sync_many(
        self, rels: Sequence[str], durable: Collection[str] = (), also: Sequence[Path] = ()
    ) -> None:
        """Nothing to do (see `sync`)."""

    def ref(self, rel: str) -> FileRef:
        """Size and sha256 of a file, hashed inside the JVM (no bytes cross py4j)."""
        jvm = self._jvm
        digest = jvm.java.security.MessageDigest.getInstance("SHA-256")
        stream = jvm.java.security.DigestInputStream(self._fs.open(self._p(rel)), digest)
        try:
            size = int(
                jvm.org.apache.commons.io.IOUtils.copyLarge(
                    stream, jvm.java.io.OutputStream.nullOutputStream()
                )
            )
        finally:
            stream.close()
        sha = bytes(b & 0xFF for b in digest.digest()).hex()
        return FileRef(rel.rpartition("/")[2], size, sha)

    def verify(self, rel: str, ref: FileRef) -> str | None:
        if self.kind(rel) is not Kind.FILE:
            return "missing"
        got = self.ref(rel)
        if got.size != ref.size:
            return f"is {got.size} bytes, the manifest says {ref.size}"
        if got.sha256 != ref.sha256:
            return (
                f"its sha256 {got.sha256[:12]}... differs from the manifest's {ref.sha256[:12]}..."
            )
        return None

    def list(self, rel: str) -> list[tuple[str, float]]:
        """Names and modification times in a folder (the old interface of the state's files)."""
        return [(e.name, e.mtime) for e in self.entries(rel)]


def files_for(root: str, spark_factory: Callable[[], SparkSession] | None = None) -> Files:
    """The file operations for a state root: local for paths, Hadoop for other URIs (which
    need a Spark session: `spark_factory` is called then, and only then)."""
    if not has_scheme(root):
        return LocalFiles(root)
    if spark_factory is None:
        from wcoj_core.errors import StateError

        raise StateError(f"state {root}: a state on {root.partition('://')[0]}:// needs Spark")
    return HadoopFiles(spark_factory(), root)


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


def verify_ref(path: str | os.PathLike[str], ref: FileRef) -> str | None:
    """None when a file has `ref`'s size and sha256, else what is wrong (reads it whole)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a file"
    if st.st_size != ref.size:
        return f"is {st.st_size} bytes, the manifest says {ref.size}"
    try:
        _, sha = sha256_file(path)
    except OSError as e:
        if out_of_memory(e):
            raise  # no sign of damage (`wcoj_core.errors.read_failure`)
        return f"cannot be read ({e.strerror or e})"
    if sha != ref.sha256:
        return f"its sha256 {sha[:12]}... differs from the manifest's {ref.sha256[:12]}..."
    return None


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
    """Write a new file that is never changed again, and its `FileRef` (stamp included).

    `path` must not exist (it is created exclusively) and lie in a folder this writer has just
    made, which nothing reads before a manifest names it: `write` writes the content straight
    there (hashed as it goes: the file is not read back), then the file is made read-only and
    its stamp read last. A failure removes the file; a crash leaves a folder no manifest names
    (the pruning's orphan, `wcoj_core.store.store`), so no temporary name and no link are
    needed. It is not made durable here (unless `sync`): the commit that names it does that
    for everything the epoch wrote at once (`Files.sync_many`).
    """
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
# the commit naming one waits for them rather than starting them (`LocalFiles.sync_many`).
_EARLY: dict[str, _Pending] = {}
_EARLY_LOCK = threading.Lock()


def sync_soon(root: str, rel: str) -> None:
    """Start making a file or a folder `rel` of the local state `root`, just written whole,
    durable — the file, or every file in the folder and its entries — on the sync threads,
    while the epoch goes on; the commit that names it waits for them before its manifest
    exists (and syncs the folders above it then). Only for what nothing more is written into
    (a segment, a batch)."""
    top = f"{local_path(root)}/{rel}"
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


def sync_tree(path: str | os.PathLike[str]) -> None:
    """Make a file or a folder written by someone else durable: every file in it, every
    folder in it, and its own entry in its parent. Links are not followed."""
    top = Path(path)
    try:
        mode = os.lstat(top).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        _fsync_file(top)
    elif stat.S_ISDIR(mode):
        for folder, _, files in os.walk(top):
            for name in files:
                p = Path(folder, name)
                if stat.S_ISREG(os.lstat(p).st_mode):
                    _fsync_file(p)
            fsync_dir(folder)
    fsync_dir(top.parent)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
