"""Helpers for the reliability tests: the ``wcoj`` command run as a user runs it, small epoch
histories with their naive answers, and what a state holds, read back without Spark.

Imported by the test modules of this folder (``from reliability_support import ...``).

* **Commands.** `run_wcoj` runs the installed ``wcoj`` script in a subprocess (what a user
  types), `start_wcoj` starts one to kill or interrupt; `wcoj_here` runs the same `main` in this
  process (to build states quickly). `Done` holds the exit status, stdout and stderr.
* **Histories.** `History` is a list of epochs of ``(a, b, diff)`` changes of relation ``edge``
  with the naive answer of ``triangles`` after any epoch, for an undirected set (``--undirected
  edge``) or a bag (the default for a relation that is not undirected).
* **State contents** are what a state means, independent of how it is laid out (batch and
  segment folders carry random names): for every trace of the current manifest, the multiset of
  ``(data..., time)`` with its summed multiplicity, and for every indexed trace, what its index
  holds per view key (every segment of a key summed). Every file is checked against its digest
  on the way (`Batches.read_verified`, `open_segment(verify=True)`).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from oracle import fold_epoch, naive_eval

from wcoj_core import cli
from wcoj_core.query.builtins import builtin
from wcoj_core.store import names
from wcoj_core.store.batches import Batches
from wcoj_core.store.manifest import digest_of
from wcoj_core.store.segments import open_segment
from wcoj_core.store.store import Store

WCOJ = Path(sys.executable).with_name("wcoj")
WCOJ_BENCH = Path(sys.executable).with_name("wcoj-bench")
TRIANGLES = builtin("triangles")
Rows = list[tuple[int, int, int]]
Multiset = Counter[tuple[int, ...]]


# -- commands ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Done:
    """A finished command: exit status, stdout and stderr (as text)."""

    code: int
    out: str
    err: str

    @property
    def errors(self) -> list[str]:
        return errors(self.err)

    @property
    def payload(self) -> dict:
        """The JSON line a ``--json`` command ends with."""
        return json.loads(last_line(self.out))


def wcoj_command(*argv: str | os.PathLike[str]) -> list[str]:
    return [str(WCOJ), *map(str, argv)]


def run_wcoj(
    *argv: str | os.PathLike[str],
    timeout: float = 900,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> Done:
    """Run the installed ``wcoj`` script to the end."""
    done = subprocess.run(
        wcoj_command(*argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env=env,
    )
    return Done(done.returncode, done.stdout, done.stderr)


def run_wcoj_bench(*argv: str | os.PathLike[str], timeout: float = 900) -> Done:
    """Run the installed ``wcoj-bench`` script (its ``cluster`` command) to the end."""
    done = subprocess.run(
        [str(WCOJ_BENCH), *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Done(done.returncode, done.stdout, done.stderr)


def wcoj_here(*argv: str | os.PathLike[str]) -> Done:
    """`wcoj_core.cli.main` in this process, its output captured (no Spark for local files)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return Done(code, out.getvalue(), err.getvalue())


def start_wcoj(*argv: str | os.PathLike[str], cwd: Path | None = None) -> subprocess.Popen[str]:
    """Start the ``wcoj`` script in its own process group (so a JVM it starts dies with it)."""
    return subprocess.Popen(
        wcoj_command(*argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,
    )


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a process started by `start_wcoj` together with its children (a driver JVM)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)


def wait_for(
    ready: Callable[[], bool], what: str, timeout: float = 600, poll: float = 0.001
) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)


def command_started(pid: int) -> bool:
    """Whether the process `pid` runs the command's own code: it has mapped an extension module
    (``lib-dynload``, ``site-packages``). Before that the interpreter is still starting (its
    ``site`` import: the ``.pth`` files), where a Ctrl-C is the interpreter's, not the command's:
    neither the interpreter's start-up nor ``import wcoj_core.cli`` maps one, and the first the
    command maps is imported inside `wcoj_core.cli.main`, which reports an interruption."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # ended already
        return True
    return any(
        line.endswith(".so") and ("/lib-dynload/" in line or "/site-packages/" in line)
        for line in (entry.rstrip().split(" ")[-1] for entry in maps.splitlines())
    )


class Watcher:
    """Names created in some folders, reported by the kernel as they appear (inotify), so that
    a test can act within microseconds of a file or folder appearing."""

    IN_CREATE = 0x100
    IN_MOVED_TO = 0x80

    def __init__(self, folders: Iterable[Path]) -> None:
        import ctypes
        import ctypes.util

        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, "inotify is not available"
        self.folders: dict[int, Path] = {}
        for folder in folders:
            wd = self._libc.inotify_add_watch(
                self.fd, str(folder).encode(), self.IN_CREATE | self.IN_MOVED_TO
            )
            assert wd >= 0, f"cannot watch {folder}"
            self.folders[wd] = folder
        self.created: list[Path] = []

    def wait(
        self, ready: Callable[[list[Path]], bool], done: Callable[[], bool], timeout: float
    ) -> bool:
        """Wait until `ready(created so far)` or `done()`; whether `ready` was met."""
        import select
        import struct

        # poll, not select: select refuses a descriptor past 1024, which a long test worker's
        # inotify descriptor can be.
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if poller.poll(20):
                data = os.read(self.fd, 1 << 16)
                at = 0
                while at < len(data):
                    wd, _mask, _cookie, size = struct.unpack_from("iIII", data, at)
                    name = data[at + 16 : at + 16 + size].rstrip(b"\0").decode()
                    self.created.append(self.folders[wd] / name)
                    at += 16 + size
                if ready(self.created):
                    return True
            elif done():
                return False
        raise AssertionError("timed out waiting for a file to appear")

    def close(self) -> None:
        os.close(self.fd)


def _staged(area: str) -> Callable[[Path, Path], bool]:
    def own(name: str) -> bool:
        if area == names.TRACES:
            return names.is_own_batch(name)
        return names.is_own_segment_file(name)

    return lambda state, p: p.parent.parent == state / area and own(p.name)


# Moments of an epoch, as what has just appeared in the state and how many of them.
MOMENTS: dict[str, tuple[Callable[[Path, Path], bool], int]] = {
    "first-batch-staged": (_staged(names.TRACES), 1),
    "first-segment-staged": (_staged(names.ARRANGEMENTS), 1),
    # The third of an epoch's batch folders and segments (a triangle epoch of an undirected
    # relation stages six: four batches and two segments, the reversed view and the second
    # counts sharing the others'; the third leaves half of them, and the commit, still to come).
    "third-staged": (
        lambda state, p: _staged(names.TRACES)(state, p) or _staged(names.ARRANGEMENTS)(state, p),
        3,
    ),
    "compaction-staged": (
        lambda state, p: _staged(names.TRACES)(state, p) and p.name.startswith("b-c-"),
        1,
    ),
    "manifest-being-committed": (
        lambda state, p: p.parent == state / names.MANIFESTS and names.is_manifest_temp(p.name),
        1,
    ),
    "manifest-committed": (
        lambda state, p: (
            p.parent == state / names.MANIFESTS and names.generation_of(p.name) is not None
        ),
        1,
    ),
}


def watched(state: Path) -> Watcher:
    """A `Watcher` of every folder of a state where an epoch creates something."""
    folders = [state / names.MANIFESTS, state / names.TRACES, state / names.ARRANGEMENTS]
    folders += [p for area in folders[1:] for p in area.iterdir() if p.is_dir()]
    return Watcher(folders)


def signal_when(
    state: Path, argv: list[str], moment: str, sig: int, timeout: float = 300
) -> tuple[subprocess.Popen[str], str, str]:
    """Start ``wcoj`` on an existing state and send it `sig` as soon as `moment` happens
    (SIGKILL to its whole process group, any other signal to the process); the process,
    its stdout and stderr once it ended."""
    match, count = MOMENTS[moment]
    watcher = watched(state)
    try:
        proc = start_wcoj(*argv)
        met = watcher.wait(
            lambda created: sum(match(state, p) for p in created) >= count,
            lambda: proc.poll() is not None,
            timeout,
        )
        if met:
            with contextlib.suppress(ProcessLookupError):
                if sig == signal.SIGKILL:
                    os.killpg(proc.pid, sig)
                else:
                    proc.send_signal(sig)
    finally:
        watcher.close()
    out, err = proc.communicate(timeout=300)
    assert met, f"the epoch ended before {moment}: {proc.returncode} {out} {err}"
    return proc, out, err


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def errors(text: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if line.startswith(("wcoj: error:", "wcoj-bench: error:"))
    ]


# An epoch's progress line (`wcoj_core.engine.Engine.report`): printed to a stderr that is not a
# terminal once the epoch has run a few seconds, which a loaded machine reaches.
PROGRESS = re.compile(r"epoch \d+: .+; spilled .+, memory .+ of .+")


def stderr_lines(text: str) -> list[str]:
    """The non-blank lines of a command's stderr but its progress lines (`PROGRESS`)."""
    return [line for line in text.splitlines() if line.strip() and not PROGRESS.fullmatch(line)]


def one_line_error(done: Done, *fragments: str, code: int = 2) -> str:
    """Assert `done` failed with exit status `code`, one line on stderr naming every fragment
    (besides progress lines) and no traceback; the line."""
    assert done.code == code, (done.code, done.out[-2000:], done.err[-3000:])
    lines = stderr_lines(done.err)
    assert "Traceback" not in done.err, done.err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("wcoj: error: "), done.err[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


# -- histories and their naive answers ------------------------------------------------------------


def write_changes(path: Path, rows: Iterable[tuple[int, ...]]) -> Path:
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["c0", "c1", "diff"])
        writer.writerows(rows)
    return path


@dataclass
class History:
    """Epochs of changes of ``edge`` (one list of ``(a, b, diff)`` per epoch) and, for
    ``triangles``, the naive answer after any of them.

    `undirected`: ``edge`` is an undirected set (``--undirected edge``); else a bag.
    """

    epochs: list[Rows]
    undirected: bool = True
    files: list[Path] = field(default_factory=list)

    @property
    def flags(self) -> list[str]:
        return ["--undirected", "edge"] if self.undirected else []

    def write(self, folder: Path, prefix: str = "e") -> History:
        folder.mkdir(parents=True, exist_ok=True)
        self.files = [
            write_changes(folder / f"{prefix}{t}.csv", rows) for t, rows in enumerate(self.epochs)
        ]
        return self

    def graph(self, upto: int, epochs: Sequence[Rows] | None = None) -> Multiset:
        """``edge`` as the relation holds it after epoch `upto`."""
        chosen = list(epochs if epochs is not None else self.epochs)
        held: Multiset = Counter()
        for rows in chosen[: upto + 1]:
            if self.undirected:
                landed = [x for a, b, d in rows if a != b for x in (((a, b), d), ((b, a), d))]
            else:
                landed = [((a, b), d) for a, b, d in rows]
            held = fold_epoch(held, landed, as_set=self.undirected)
        return held

    def answer(self, upto: int, epochs: Sequence[Rows] | None = None) -> Multiset:
        """The naive output of ``triangles`` after epoch `upto`."""
        return naive_eval(TRIANGLES, {"edge": self.graph(upto, epochs)})

    def count(self, upto: int, epochs: Sequence[Rows] | None = None) -> int:
        return sum(self.answer(upto, epochs).values())

    def apply_args(self, state: Path, epoch: int, *extra: str) -> list[str]:
        return [
            *["apply", "--query", "triangles", "--state", str(state), "--epoch", str(epoch)],
            *["--changes", f"edge={self.files[epoch]}", *self.flags, *extra],
        ]


def small_history(seed: int = 7, epochs: int = 4, undirected: bool = True) -> History:
    """A small random graph on 24 vertices: 90 edges at epoch 0, then per epoch 14 insertions,
    6 deletions of held edges, 2 deletions of absent ones and a repeated insertion (so a set
    ignores some changes), and a self-loop."""
    rng = random.Random(seed)
    n = 24
    held: set[tuple[int, int]] = set()
    out: list[Rows] = []
    while len(held) < 90:
        a, b = rng.randrange(n), rng.randrange(n)
        if a != b:
            held.add((min(a, b), max(a, b)))
    out.append([(a, b, 1) for a, b in sorted(held)])
    for _ in range(1, epochs):
        rows: Rows = []
        fresh = set()
        while len(fresh) < 14:
            a, b = rng.randrange(n), rng.randrange(n)
            e = (min(a, b), max(a, b))
            if a != b and e not in held:
                fresh.add(e)
        rows += [(a, b, 1) for a, b in sorted(fresh)]
        gone = rng.sample(sorted(held), 6)
        rows += [(b, a, -1) for a, b in gone]  # named in the other direction
        absent = 0
        while absent < 2:
            a, b = rng.randrange(n), rng.randrange(n)
            e = (min(a, b), max(a, b))
            if a != b and e not in held and e not in fresh:
                rows.append((a, b, -1))
                absent += 1
        again = rng.choice(sorted(held - set(gone)))
        rows.append((*again, 1))
        loop = rng.randrange(n)
        rows.append((loop, loop, 1))
        held = (held | fresh) - set(gone)
        out.append(rows)
    return History(out, undirected)


def build_state(history: History, state: Path, upto: int, *extra: str) -> None:
    """Apply epochs 0..`upto` of `history` to `state`, in this process."""
    build_state_from(history, state, 0, upto, *extra)


def build_state_from(history: History, state: Path, first: int, upto: int, *extra: str) -> None:
    """Apply epochs `first`..`upto` of `history` to `state`, in this process."""
    for t in range(first, upto + 1):
        done = wcoj_here(*history.apply_args(state, t, *extra))
        assert done.code == 0, done.err


# -- what a state holds ---------------------------------------------------------------------------

Contents = tuple[int | None, dict[str, Multiset]]


def open_store(state: Path) -> Store:
    return Store.open(state, create=False)


def contents(state: Path, only: Iterable[str] | None = None) -> Contents:
    """The state's epoch and, per trace (those in `only`, default all), its consolidated
    ``(data..., time) -> diff`` (every batch file read whole and checked against its digest)."""
    store = open_store(state)
    manifest = store.current()
    files = Batches(store.root)
    traces: dict[str, Multiset] = {}
    chosen = None if only is None else set(only)
    for name, trace in sorted(manifest.traces.items()):
        if chosen is not None and name not in chosen:
            continue
        total: Multiset = Counter()
        for b in trace.batches:
            layer = files.read_verified(b.path, trace.columns, b.files)
            for row, d in zip(layer.rows.tolist(), layer.diff.tolist(), strict=True):
                total[(*row, b.time)] += d
        traces[name] = Counter({k: v for k, v in total.items() if v})
    return manifest.epoch, traces


def indexes(state: Path) -> dict[str, dict[str, Multiset]]:
    """Per indexed trace of the current manifest, per view key, what its segments hold summed
    (every segment file read whole and checked against its digest)."""
    store = open_store(state)
    root = store.local_root
    assert root is not None
    out: dict[str, dict[str, Multiset]] = {}
    for name, trace in sorted(store.current().traces.items()):
        if trace.index is None:
            continue
        keys: dict[str, Multiset] = {}
        for s in trace.index.segments:
            layer = open_segment(root, s, verify=True)
            total = keys.setdefault(f"{s.view}/{s.order}", Counter())
            for row, d in zip(layer.rows.tolist(), layer.diff.tolist(), strict=True):
                total[tuple(row)] += d
        out[name] = {k: Counter({r: d for r, d in v.items() if d}) for k, v in keys.items()}
    return out


def _consolidated(rows: np.ndarray, diff: np.ndarray) -> bytes:
    """The canonical bytes of a multiset of rows: sorted distinct rows and their summed
    multiplicities (zeros dropped)."""
    if len(diff) == 0:
        return b""
    unique, inverse = np.unique(rows, axis=0, return_inverse=True)
    sums = np.zeros(len(unique), dtype=np.int64)
    np.add.at(sums, inverse.reshape(-1), diff)
    keep = sums != 0
    return np.ascontiguousarray(unique[keep]).tobytes() + sums[keep].tobytes()


def fingerprint(state: Path) -> dict[str, str]:
    """`contents` and `indexes` of a large state as digests: per trace, the sha256 of its
    consolidated ``(data..., time) -> diff``; per index view key, of what its segments hold
    summed. Every file is read whole and checked against its digest."""
    store = open_store(state)
    root = store.local_root
    assert root is not None
    manifest = store.current()
    files = Batches(store.root)
    out: dict[str, str] = {"epoch": str(manifest.epoch)}
    for name, trace in sorted(manifest.traces.items()):
        rows, diffs = [], []
        for b in trace.batches:
            layer = files.read_verified(b.path, trace.columns, b.files)
            r = np.asarray(layer.rows, dtype=np.int64).reshape(len(layer), len(trace.columns))
            rows.append(np.column_stack([r, np.full(len(layer), b.time, dtype=np.int64)]))
            diffs.append(np.asarray(layer.diff, dtype=np.int64))
        width = len(trace.columns) + 1
        data = _consolidated(
            np.concatenate(rows) if rows else np.zeros((0, width), np.int64),
            np.concatenate(diffs) if diffs else np.zeros(0, np.int64),
        )
        out[f"trace {name}"] = hashlib.sha256(data).hexdigest()
        if trace.index is None:
            continue
        by_key: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        for seg in trace.index.segments:
            layer = open_segment(root, seg, verify=True)
            got = by_key.setdefault(f"{seg.view}/{seg.order}", ([], []))
            got[0].append(np.asarray(layer.rows, dtype=np.int64).reshape(len(layer), seg.width))
            got[1].append(np.asarray(layer.diff, dtype=np.int64))
        for key, (r, d) in sorted(by_key.items()):
            data = _consolidated(np.concatenate(r), np.concatenate(d))
            out[f"index {name} {key}"] = hashlib.sha256(data).hexdigest()
    return out


def figures(state: Path, trace: str) -> tuple[int, int, int] | None:
    """A trace's figures (distinct tuples, count, negative) as the current manifest says."""
    t = open_store(state).current().trace(trace)
    found = [b.figures for b in t.batches if b.figures is not None] if t is not None else []
    return found[-1] if found else None


def summed(contents: Contents, trace: str) -> Multiset:
    """A trace's accumulated contents (times summed away)."""
    total: Multiset = Counter()
    for (*data, _time), diff in contents[1].get(trace, Counter()).items():
        total[tuple(data)] += diff
    return Counter({k: v for k, v in total.items() if v})


def manifest_files(state: Path) -> dict[str, bytes]:
    """The committed manifests of a state, name -> bytes."""
    folder = state / names.MANIFESTS
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.json"))}


def committed_epoch(state: Path) -> int | None:
    """The epoch of the highest committed generation, read from its file."""
    found = manifest_files(state)
    return json.loads(found[max(found)])["epoch"] if found else None


def hashes(root: Path) -> dict[str, str]:
    """Every file under `root` (links as their targets' names, not followed) -> its sha256."""
    out: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in [*files, *dirs]:
            p = Path(folder, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = f"-> {os.readlink(p)}"
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def referenced_files(state: Path) -> dict[str, str]:
    """Every file the current manifest names (batch and segment files) -> its sha256, plus the
    manifests and the marker."""
    store = open_store(state)
    m = store.current()
    rels = [f"{names.MANIFESTS}/{p}" for p in manifest_files(state)] + [names.MARKER]
    for trace in m.traces.values():
        for b in trace.batches:
            rels += [f"{b.path}/{f.name}" for f in b.files]
        if trace.index is not None:
            for s in trace.index.segments:
                rels += [s.file_path(role) for role in s.files]
    return {rel: hashlib.sha256((state / rel).read_bytes()).hexdigest() for rel in sorted(rels)}


def new_folders(state: Path, before: set[str]) -> list[str]:
    """Batch and segment folders under the state that are not in `before` (relative paths)."""
    return sorted(set(staged_folders(state)) - before)


def staged_folders(state: Path) -> list[str]:
    """Every batch folder and segment (a file; a folder in state format 2) under the state
    (relative paths), committed or not."""
    found = [
        *(state / names.TRACES).glob("*/b-*"),
        *(state / names.ARRANGEMENTS).glob("*/s-*"),
    ]
    return sorted(str(p.relative_to(state)) for p in found)


# -- finding and damaging files -------------------------------------------------------------------

HOUR = 3600.0


def age(path: Path, seconds: float = 2 * HOUR) -> None:
    """Make a file or folder look `seconds` old (not following links)."""
    when = time.time() - seconds
    os.utime(path, (when, when), follow_symlinks=False)


def stats(root: Path) -> dict[str, tuple[str, int]]:
    """Every file and folder under `root` with its sha256 (files) and mtime."""
    found = hashes(root)
    return {rel: (h, os.lstat(root / rel).st_mtime_ns) for rel, h in found.items()} | {
        str(p.relative_to(root)): ("dir", p.lstat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_dir()
    }


def flip(path: Path, offset: int, mask: int = 0xFF) -> None:
    """XOR one byte of a file with `mask`, in place: the same inode, a new mtime and ctime."""
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.chmod(0o644)
    with open(path, "r+b") as f:
        f.write(bytes(data))


def same_size_segment(data: bytes) -> bytes:
    """Another segment file of the same size and the same header (`wcoj_core.store.segments`:
    64 header bytes, then 8-byte values): its values in reverse order, or (when that changes
    nothing) one value bumped."""
    head, values = data[:64], bytearray(data[64:])
    words = [bytes(values[i : i + 8]) for i in range(0, len(values), 8)]
    out = head + b"".join(reversed(words))
    if out == data:
        values[0] ^= 1
        out = head + bytes(values)
    assert len(out) == len(data) and out != data
    return out


def batch_file(state: Path, trace: str, time_: int) -> Path:
    """The (first) data file of a trace's batch at `time_`."""
    t = open_store(state).current().trace(trace)
    assert t is not None
    (b,) = [b for b in t.batches if b.time == time_]
    return state / b.path / b.files[0].name


def segment_file(state: Path, trace: str, role: str = "layer", level: str = "recent") -> Path:
    """A file (by default its one file) of the newest segment of a trace's index at `level` (``base``, ``recent``)."""
    t = open_store(state).current().trace(trace)
    assert t is not None and t.index is not None
    chosen = [s for s in t.index.segments if s.level.value == level and s.rows]
    return state / chosen[-1].file_path(role)


def apply_json(history: History, state: Path, t: int, *extra: str) -> Done:
    """``wcoj apply`` of epoch `t` of `history`, in a subprocess, with ``--json``."""
    return run_wcoj(*history.apply_args(state, t, "--json", *extra))


def exact(done: Done, history: History, t: int, state: Path) -> None:
    """`done` succeeded with the naive answer after epoch `t`: the JSON count, the manifest's
    figures and the output's batches."""
    assert done.code == 0, done.err[-3000:]
    assert done.payload["count"] == history.count(t), (done.payload["count"], history.count(t))
    assert figures(state, "out/triangles")[1] == history.count(t)
    assert summed(contents(state, ["out/triangles"]), "out/triangles") == history.answer(t)


def nothing_committed(state: Path, before: dict[str, bytes]) -> None:
    assert manifest_files(state) == before


# -- editing manifests ---------------------------------------------------------------------------


def current_manifest(state: Path) -> Path:
    found = sorted((state / names.MANIFESTS).glob("*.json"))
    return found[-1]


def edit_manifest(path: Path, edit: Callable[[dict], object], *, redigest: bool) -> None:
    """Rewrite a manifest through `edit` (which changes the parsed JSON in place, or returns a
    value to write instead); with `redigest`, its digest recomputed so only the edit is wrong."""
    raw = json.loads(path.read_text())
    replaced = edit(raw)
    value = raw if replaced is None else replaced
    if redigest and isinstance(value, dict):
        value["digest"] = digest_of(value)
    path.chmod(0o644)
    path.write_text(json.dumps(value, sort_keys=True, separators=(",", ":")) + "\n")


# -- small file systems ---------------------------------------------------------------------------


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """Make a folder tree unwritable: immutable for root (who ignores modes), else read-only."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-R", "+i", str(folder)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-R", "-i", str(folder)], check=True)
        return
    modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")]}
    for p in modes:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        yield
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


@contextmanager
def small_file_system(where: Path, size: str = "64m") -> Iterator[Path]:
    """A tmpfs mounted at `where` (root only), unmounted afterwards."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path, leave: int = 0) -> Path:
    """Write a file until the file system has `leave` bytes free (or fewer); return it."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12):
            try:
                while free(folder) - size >= leave:
                    os.write(fd, b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    return filler


def free(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize
