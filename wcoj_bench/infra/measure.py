"""What the benchmarks measure with, and how they check that methods agree.

* `SparkMeter` — join output rows and shuffle bytes of the Spark work done since a mark, from
  Spark's own status stores;
* `MemoryWatch` — peak resident memory of this process tree and of the largest Spark Python
  worker on the machine, per label;
* `run_process` — one whole process, exec to exit: wall seconds, its own peak RSS (its
  ``VmHWM``, read until it exits), the sampled peaks of its process tree (a Spark driver's JVM is
  its child): resident memory, anonymous memory (``RssAnon``, what a memory budget bounds) and
  the largest ``VmHWM``, and its last JSON line; a cap on the tree's anonymous memory kills it
  before it takes a shared machine's memory;
* `evict` — ask the kernel to drop the page-cache pages of a folder's files
  (``posix_fadvise(DONTNEED)``: no root needed), so the next process reads them from disk;
* `compare_changes` — two output changes as exact multisets (consolidated, then compared tuple
  by tuple), with a few differing tuples to name.

Importing this module imports no pyspark: the process benchmarks' helpers stay light.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time as clock
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from wcoj_core.deploy.daemon import DAEMON_MODULE
from wcoj_core.errors import WcojError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

JOIN_NODE = re.compile(r"Join|CartesianProduct")


class BenchError(WcojError):
    """A benchmark that cannot run (too small an input) or whose methods disagree."""


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# -- Spark's metrics --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    seconds: float
    intermediate_rows: int
    shuffle_bytes: int


class SparkMeter:
    """Join output rows and shuffle bytes of the Spark work done since a mark.

    Reads Spark's own status stores (the data behind its UI, kept whether or not the UI runs):
    every SQL execution's plan graph and metric values, every stage's shuffle write bytes.
    """

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._sql = spark._jsparkSession.sharedState().statusStore()  # type: ignore[attr-defined]
        self._app = spark.sparkContext._jsc.sc().statusStore()  # type: ignore[union-attr]

    def mark(self) -> tuple[int, int]:
        return self._last_execution(), self._last_stage()

    def since(self, mark: tuple[int, int]) -> tuple[int, int]:
        execution, stage = mark
        return self._join_rows(execution), self._shuffle_bytes(stage)

    def _executions(self) -> Iterator[Any]:
        found = self._sql.executionsList()
        for i in range(found.size()):
            yield found.apply(i)

    def _last_execution(self) -> int:
        return max((int(e.executionId()) for e in self._executions()), default=-1)

    def _join_rows(self, after: int) -> int:
        total = 0
        for e in self._executions():
            eid = e.executionId()
            if int(eid) <= after:
                continue
            values = self._sql.executionMetrics(eid)
            nodes = self._sql.planGraph(eid).allNodes()
            for j in range(nodes.size()):
                node = nodes.apply(j)
                if not JOIN_NODE.search(str(node.name())):
                    continue
                metrics = node.metrics()
                for k in range(metrics.size()):
                    metric = metrics.apply(k)
                    if str(metric.name()) == "number of output rows":
                        value = values.get(metric.accumulatorId())
                        if value.isDefined():
                            total += int(re.sub(r"[^0-9]", "", str(value.get())) or 0)
        return total

    def _stages(self) -> Iterator[Any]:
        gateway: Any = self.spark.sparkContext._gateway
        jvm: Any = gateway.jvm
        no_quantiles = gateway.new_array(jvm.double, 0)
        found = self._app.stageList(
            jvm.java.util.ArrayList(), False, False, no_quantiles, jvm.java.util.ArrayList()
        )
        for i in range(found.size()):
            yield found.apply(i)

    def _last_stage(self) -> int:
        return max((int(s.stageId()) for s in self._stages()), default=-1)

    def _shuffle_bytes(self, after: int) -> int:
        return sum(int(s.shuffleWriteBytes()) for s in self._stages() if int(s.stageId()) > after)


# -- memory -----------------------------------------------------------------------------------


# The daemons Spark starts Python workers from: the stock one, and wcoj's preloading one.
DAEMONS = ("pyspark.daemon", DAEMON_MODULE)


def spark_workers() -> dict[int, int]:
    """Every Spark Python worker process on this machine (a daemon of `DAEMONS`, run as
    ``python -m DAEMON``, and the workers it forks, which share its command line): pid to
    resident bytes. Empty without psutil."""
    try:
        import psutil  # pyright: ignore[reportMissingModuleSource]
    except ImportError:
        return {}
    found: dict[int, int] = {}
    for p in psutil.process_iter(["cmdline", "memory_info"]):
        try:
            argv = p.info["cmdline"] or []
            # `python -m DAEMON ...` (not the driver's JVM, whose settings name the daemon too)
            if any(a == "-m" and b in DAEMONS for a, b in pairwise(argv)):
                found[p.pid] = int(p.info["memory_info"].rss)
        except Exception:  # a process that just ended
            continue
    return found


class MemoryWatch:
    """Peak resident memory of this process and its children (Spark's JVM), per label; and of
    the largest Spark Python worker on this machine (a local cluster's executors are not this
    process's children), per label too."""

    def __init__(self, interval: float = 0.2) -> None:
        self.peaks: dict[str, int] = {}
        self.worker_peaks: dict[str, int] = {}
        self._label: str | None = None
        self._stop = threading.Event()
        self._interval = interval
        try:
            import psutil  # pyright: ignore[reportMissingModuleSource]
        except ImportError:  # the bench extra is not installed: no memory figures
            self._process = None
            return
        self._process = psutil.Process()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self, label: str) -> None:
        assert self._process is not None
        self.peaks[label] = max(self.peaks.get(label, 0), tree_rss(self._process.pid))
        largest = max(spark_workers().values(), default=0)
        self.worker_peaks[label] = max(self.worker_peaks.get(label, 0), largest)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            label = self._label
            if label is not None:
                self._sample(label)

    @contextmanager
    def watching(self, label: str) -> Iterator[None]:
        self._label = label
        try:
            yield
        finally:
            if self._process is not None:
                self._sample(label)
            self._label = None

    def close(self) -> None:
        self._stop.set()


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (0 when it is gone or without
    psutil)."""
    try:
        import psutil  # pyright: ignore[reportMissingModuleSource]

        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except Exception:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except Exception:  # a child that just ended
            continue
    return total


# -- whole processes --------------------------------------------------------------------------


def tree_memory(pid: int, pids: Sequence[int] | None = None) -> tuple[int, int, int, int]:
    """A process tree's anonymous resident bytes (``RssAnon`` summed over the process and all
    its descendants, or over `pids` when the caller knows them), the largest ``VmHWM`` among
    them, their resident bytes (``VmRSS``) and how many were read: from ``/proc`` (zeros when
    the process is gone)."""
    from wcoj_core.budget import process_memory

    anon = high = rss = count = 0
    for p in pids if pids is not None else tree_pids(pid):
        got = process_memory(p)
        if got:
            count += 1
            anon += got.get("RssAnon", 0)
            rss += got.get("VmRSS", 0)
            high = max(high, got.get("VmHWM", 0))
    return anon, high, rss, count


def tree_pids(pid: int) -> list[int]:
    """A process and its descendants (just the process without psutil)."""
    try:
        import psutil  # pyright: ignore[reportMissingModuleSource]

        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except Exception:
        return [pid]


class MemoryCapExceeded(BenchError):
    """A measured process tree grew past the cap it was run under, and was killed."""


class TimedOut(BenchError):
    """A measured process ran past its time-out, and was killed."""


@dataclass(frozen=True, slots=True)
class ProcessRun:
    """One process, exec to exit."""

    argv: tuple[str, ...]
    seconds: float
    max_rss_bytes: int  # the process's own peak (see `run_process`)
    tree_rss_bytes: int  # the sampled peak of its whole process tree
    result: dict[str, Any]  # its last stdout line, a JSON object ({} when there is none)
    stderr: str
    # The sampled peak of the tree's anonymous memory (RssAnon summed over the tree) and the
    # largest VmHWM any process of it reached; the most processes seen at once.
    tree_anon_bytes: int = 0
    tree_hwm_bytes: int = 0
    processes: int = 1
    stdout: str = ""
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)  # the load average as it ended
    # CPU seconds (user and system) of the process and the children it waited for: on a
    # shared machine, what the work took whatever the wall time.
    cpu_seconds: float = 0.0


def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    interval: float = 0.05,
    cap: int | None = None,
    check: bool = True,
    timeout: float | None = None,
) -> ProcessRun:
    """Run `argv` to its exit: wall seconds from just before the fork to the reaped exit.

    The process's own peak memory is its high-water mark, ``VmHWM`` in ``/proc/PID/status``,
    read every `interval` until it exits (it only grows, so the last reading misses at most the
    last interval's growth). Not ``ru_maxrss``: Linux carries the address space the child was
    forked from into it, so every child of a parent that once held 2.5 GB reported 2.5 GB
    (where there is no ``/proc``, ``ru_maxrss`` is all there is).

    The tree's anonymous memory (``RssAnon`` of the process and its descendants, summed) is
    sampled every `interval` as well; with `cap`, a tree whose anonymous memory passes it is
    killed (`MemoryCapExceeded`): a measurement never takes a shared machine's memory. With
    `timeout`, a tree still running after that many seconds is killed (`TimedOut`).

    A non-zero exit status raises `BenchError` with the end of the process's stderr (unless
    `check` is false).
    """
    done = threading.Event()
    peak = [0]
    high_water = [0]
    anon_peak = [0]
    tree_high = [0]
    most = [1]
    capped = [0]
    late = [False]
    start = clock.perf_counter()
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=None if env is None else dict(env),
        cwd=cwd,
    )

    def sample() -> None:
        # The tree's processes are listed every quarter second (a scan of /proc), their
        # memory read every `interval` (a file each).
        pids: list[int] = [proc.pid]
        listed = 0.0
        while not done.wait(interval):
            now = clock.perf_counter()
            if now - listed > 0.25:
                pids, listed = tree_pids(proc.pid), now
            high_water[0] = max(high_water[0], _high_water(proc.pid))
            anon, high, rss, count = tree_memory(proc.pid, pids)
            peak[0] = max(peak[0], rss)
            anon_peak[0] = max(anon_peak[0], anon)
            tree_high[0] = max(tree_high[0], high)
            most[0] = max(most[0], count)
            if cap is not None and anon > cap and not capped[0]:
                capped[0] = anon
                _kill_tree(proc.pid)
            if timeout is not None and not late[0] and clock.perf_counter() - start > timeout:
                late[0] = True
                _kill_tree(proc.pid)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # The pipes are drained by threads so that a chatty process never blocks on a full pipe.
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [
        threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True),  # type: ignore[union-attr]
        threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True),  # type: ignore[union-attr]
    ]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = clock.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    for r in readers:
        r.join()
    sampler.join()
    stdout = b"".join(out).decode(errors="replace")
    stderr = b"".join(err).decode(errors="replace")
    if late[0] and not capped[0]:
        raise TimedOut(
            f"{' '.join(argv[:6])} ... was still running after {timeout:g} s and was stopped"
        )
    if capped[0]:
        raise MemoryCapExceeded(
            f"{' '.join(argv[:6])} ... was killed: its process tree's anonymous memory reached "
            f"{capped[0] / 2**30:.2f} GiB, past the cap of {(cap or 0) / 2**30:.2f} GiB"
        )
    if proc.returncode != 0 and check:
        tail = " | ".join(stderr.strip().splitlines()[-5:])
        raise BenchError(
            f"{' '.join(argv[:6])} ... exited with status {proc.returncode}: {tail or 'no stderr'}"
        )
    lines = [line for line in stdout.splitlines() if line.strip()]
    result: dict[str, Any] = {}
    if lines and lines[-1].lstrip().startswith("{"):
        result = json.loads(lines[-1])
    own = high_water[0] if Path("/proc/self/status").exists() else usage.ru_maxrss * 1024
    return ProcessRun(
        tuple(argv),
        seconds,
        own,
        max(peak[0], own),
        result,
        stderr,
        anon_peak[0],
        max(tree_high[0], own),
        most[0],
        stdout,
        os.getloadavg(),
        usage.ru_utime + usage.ru_stime,
    )


def _kill_tree(pid: int) -> None:
    """Kill a process and its descendants (the children first, then the process)."""
    try:
        import psutil  # pyright: ignore[reportMissingModuleSource]

        root = psutil.Process(pid)
        for child in root.children(recursive=True):
            try:
                child.kill()
            except Exception:
                continue
        root.kill()
    except Exception:
        with suppress(OSError):
            os.kill(pid, 9)


def _high_water(pid: int) -> int:
    """A live process's peak resident memory in bytes (``VmHWM``), or 0 when unreadable."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def evict(folder: str | os.PathLike[str]) -> int:
    """Drop the page-cache pages of every file under `folder`; the bytes advised.

    Pages a running process still maps stay; this is advice the kernel may take in part.
    """
    advised = 0
    for path in Path(folder).rglob("*"):
        if not path.is_file():
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            advised += os.fstat(fd).st_size
        except OSError:
            pass
        finally:
            os.close(fd)
    return advised


# -- agreement --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Agreement:
    """How two output changes differ, as multisets."""

    mismatches: int
    rows: int  # distinct tuples of the first, consolidated
    examples: tuple[tuple[tuple[int, ...], int, int], ...] = field(default=())

    @property
    def equal(self) -> bool:
        return self.mismatches == 0


def change_arrays(table: pa.Table, columns: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """An Arrow table of changes (`columns`, ``diff``) as consolidated (rows, diff) arrays."""
    from wcoj_core.kernel.changes import changes_layer

    layer = changes_layer(columns, table)
    return np.asarray(layer.rows), np.asarray(layer.diff)


def compare_changes(
    first: tuple[np.ndarray, np.ndarray],
    second: tuple[np.ndarray, np.ndarray],
    examples: int = 5,
) -> Agreement:
    """Two changes (rows, diffs; any order, not necessarily consolidated) as exact multisets.

    >>> a = (np.array([[1, 2], [3, 4], [1, 2]]), np.array([1, 1, 1]))
    >>> b = (np.array([[3, 4], [1, 2]]), np.array([1, 2]))
    >>> compare_changes(a, b).equal
    True
    >>> found = compare_changes(a, (np.array([[3, 4]]), np.array([-1])))
    >>> found.mismatches, found.examples
    (2, (((1, 2), 2, 0), ((3, 4), 1, -1)))
    """
    from wcoj_core.kernel.layer import Layer

    rows_a, diff_a = first
    rows_b, diff_b = second
    width = rows_a.shape[1] if rows_a.ndim == 2 else rows_b.shape[1]
    a = Layer.build(np.asarray(rows_a).reshape(-1, width), np.asarray(diff_a))
    b = Layer.build(np.asarray(rows_b).reshape(-1, width), np.asarray(diff_b))
    both = Layer.build(
        np.concatenate([np.asarray(a.rows), np.asarray(b.rows)]),
        np.concatenate([np.asarray(a.diff), -np.asarray(b.diff)]),
    )
    shown = []
    for row in np.asarray(both.rows)[:examples]:
        key = tuple(int(v) for v in row)
        shown.append((key, _held(a, row), _held(b, row)))
    return Agreement(len(both), len(a), tuple(shown))


def _held(layer: Any, row: np.ndarray) -> int:
    hit = np.flatnonzero((np.asarray(layer.rows) == row).all(axis=1))
    return int(np.asarray(layer.diff)[hit[0]]) if len(hit) else 0


__all__ = [
    "Agreement",
    "BenchError",
    "MemoryCapExceeded",
    "MemoryWatch",
    "ProcessRun",
    "Sample",
    "SparkMeter",
    "TimedOut",
    "change_arrays",
    "compare_changes",
    "evict",
    "folder_bytes",
    "run_process",
    "spark_workers",
    "tree_memory",
    "tree_pids",
    "tree_rss",
]
