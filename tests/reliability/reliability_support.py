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
  on the way (`BatchFiles.read_verified`, `open_segment(verify=True)`).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from wcoj_core import cli
from wcoj_core.deploy.batches import BatchFiles
from wcoj_core.naive import fold_epoch, naive_eval
from wcoj_core.query.builtins import builtin
from wcoj_core.segments import open_segment
from wcoj_core.store import names
from wcoj_core.store.manifest import digest_of
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


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def errors(text: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if line.startswith(("wcoj: error:", "wcoj-bench: error:"))
    ]


def one_line_error(done: Done, *fragments: str, code: int = 2) -> str:
    """Assert `done` failed with exit status `code`, one line on stderr naming every fragment
    and no traceback; the line."""
    assert done.code == code, (done.code, done.out[-2000:], done.err[-3000:])
    lines = [line for line in done.err.splitlines() if line.strip()]
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
                landed = [
                    x for a, b, d in rows if a != b for x in (((a, b), d), ((b, a), d))
                ]
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


# -- what a state holds ----------------------------------------------------------------------------

Contents = tuple[int | None, dict[str, Multiset]]


def open_store(state: Path) -> Store:
    return Store.open(state, create=False)


def contents(state: Path, only: Iterable[str] | None = None) -> Contents:
    """The state's epoch and, per trace (those in `only`, default all), its consolidated
    ``(data..., time) -> diff`` (every batch file read whole and checked against its digest)."""
    store = open_store(state)
    manifest = store.current()
    files = BatchFiles(store.root)
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
    """Every batch and segment folder under the state (relative paths), committed or not."""
    found = [
        *(state / names.TRACES).glob("*/b-*"),
        *(state / names.ARRANGEMENTS).glob("*/s-*"),
    ]
    return sorted(str(p.relative_to(state)) for p in found)


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
