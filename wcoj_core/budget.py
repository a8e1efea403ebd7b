"""One memory budget per process: the number every stage of an epoch sizes its pieces by.

A process is given one budget (``--memory 4g``, the Dagster resource's ``memory:``) or takes
`default_budget` (a quarter of physical memory, at least 1 GiB); one the machine cannot back is
refused (`MemoryBudget.backed`). It bounds anonymous memory (``RssAnon``), not the page cache
behind mapped files. `Shares` cuts it, after a fixed reserve, into what each stage may hold
(`run_bytes`, `layer_bytes`, `proposals`, `chunk_rows`, `sink_bytes`, `spark_conf`); none reads
the machine. `MemoryMeter` measures the peak ``RssAnon`` (sampled), ``VmHWM`` and the bytes spilled.

>>> parse_size("4g"), parse_size("512M"), parse_size("1.5GiB")
(4294967296, 536870912, 1610612736)
>>> Shares.of(MemoryBudget(4 << 30)).run_bytes > 100 << 20
True
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from wcoj_core.errors import WcojError

# What the interpreter, numpy, pyarrow and the engine's own objects take before any array: kept
# out of the stages' shares (a budget smaller than twice this gives the stages half of it).
RESERVE = 224 << 20
# The smallest budget a process accepts: the interpreter, numpy and pyarrow alone take about
# 60 MiB before any work (a test forcing every stage to spill gives its stages tiny shares).
MIN_BUDGET = 128 << 20
# The default budget: this share of the machine's memory, at least `DEFAULT_FLOOR`.
DEFAULT_SHARE = 4
DEFAULT_FLOOR = 1 << 30
# Copies of a candidate's columns a kernel step may hold at once (proposals, the columns spread
# over them, validation lookups, the parts being put together), to size its pieces in bytes.
# Measured: 4-cliques of facebook_combined grew by about 75 bytes per candidate of the pieces
# (bindings of 4 variables, i.e. 1.6 copies of their 6 columns); 4 leaves room for hubs.
CANDIDATE_COPIES = 4
# How often the meter samples RssAnon, in seconds.
SAMPLE_SECONDS = 0.02

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class BudgetError(WcojError):
    """A memory budget that cannot be read or used, or work that cannot fit in it (or on the
    disk it spills to), said before anything is exhausted."""


def parse_size(text: str) -> int:
    """A size such as ``4g``, ``512m``, ``1.5GiB`` or ``1048576`` (bytes), in bytes.

    >>> parse_size("2048k")
    2097152
    >>> parse_size("lots")
    Traceback (most recent call last):
      ...
    wcoj_core.budget.BudgetError: memory size 'lots': give a number with an optional unit k, m, g or t (e.g. 4g)
    """
    found = _SIZE.fullmatch(text)
    if found is None:
        raise BudgetError(
            f"memory size {text!r}: give a number with an optional unit k, m, g or t (e.g. 4g)"
        )
    number, unit = float(found.group(1)), found.group(2).lower()
    return int(number * _UNITS[unit])


def format_size(n: int) -> str:
    """Bytes as a short figure.

    >>> format_size(4 << 30), format_size(1536 << 20), format_size(900)
    ('4.0 GiB', '1.5 GiB', '900 B')
    """
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def machine_memory() -> int | None:
    """This machine's physical memory in bytes (``MemTotal``), None when unknown."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """The bytes of anonymous memory a process may use, and where the number came from."""

    bytes: int
    source: str = "given"

    def __post_init__(self) -> None:
        if self.bytes < MIN_BUDGET:
            raise BudgetError(
                f"a memory budget of {format_size(self.bytes)} is too small: the process itself "
                f"takes about 60 MiB before any work; give at least {format_size(MIN_BUDGET)}"
            )

    @classmethod
    def of(cls, memory: MemoryBudget | int | str | None) -> MemoryBudget:
        """A budget from what a caller gave: a budget, bytes, a size text, or None (the
        machine's default)."""
        if isinstance(memory, MemoryBudget):
            return memory
        if memory is None:
            return default_budget()
        if isinstance(memory, str):
            return cls(parse_size(memory), f"--memory {memory.strip()}").backed()
        return cls(int(memory)).backed()

    def backed(self) -> MemoryBudget:
        """This budget, refused (`BudgetError`) when it is more than the machine's memory or
        the process's own limit: a budget is what the process holds before it spills, so one
        that cannot be backed never spills and the system runs out of memory first."""
        found = [(machine_memory(), "this machine's memory"), process_limit(), (1 << 62, "")]
        most, what = min((n, w) for n, w in (f or (None, "") for f in found) if n is not None)
        what = what.replace("its ", "this process's ", 1)
        if self.bytes <= most:
            return self
        raise BudgetError(
            f"a memory budget of {format_size(self.bytes)} is more than {what} "
            f"({format_size(most)}): the process would run out of memory before it spilled; "
            f"give at most {format_size(most)}"
        )

    def describe(self) -> str:
        """The budget and where it came from.

        >>> MemoryBudget(2 << 30, "--memory 2g").describe()
        '2.0 GiB (--memory 2g)'
        """
        return f"{format_size(self.bytes)} ({self.source})"


def process_limit() -> tuple[int, str] | None:
    """The smallest memory limit set on this process, and what set it: its control group's
    ``memory.max`` (cgroup v2) or its address-space limit (``RLIMIT_AS``); None when neither."""
    found: list[tuple[int, str]] = []
    try:
        with open("/sys/fs/cgroup/memory.max", "rb") as f:
            text = f.read().strip()
        if text.isdigit():
            found.append((int(text), "its control group's memory.max"))
    except OSError:
        pass
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY and soft > 0:
            found.append((int(soft), "its address-space limit"))
    except (ImportError, OSError, ValueError):
        pass
    return min(found) if found else None


def default_budget() -> MemoryBudget:
    """A quarter of this machine's memory, at least 1 GiB; a quarter of the process's own
    limit (its control group's, or its address space's) when that is smaller (what ``--help``
    states)."""
    total = machine_memory()
    limit = process_limit()
    if limit is not None and (total is None or limit[0] < total):
        size = max(MIN_BUDGET, limit[0] // DEFAULT_SHARE)
        return MemoryBudget(size, f"default: a quarter of {limit[1]}, {format_size(limit[0])}")
    if total is None:
        return MemoryBudget(DEFAULT_FLOOR, "default: this machine's memory is unknown")
    size = max(DEFAULT_FLOOR, total // DEFAULT_SHARE)
    return MemoryBudget(size, f"default: a quarter of this machine's {format_size(total)}")


def default_description() -> str:
    """The default budget as ``--help`` states it."""
    return (
        "default: a quarter of this machine's memory (or of the process's own limit when "
        f"smaller), now {format_size(default_budget().bytes)}"
    )


@dataclass(frozen=True, slots=True)
class Shares:
    """What each stage may hold at once, cut from one budget (see the module); per-thread shares
    are divided by `threads` already."""

    budget: MemoryBudget
    work: int  # the budget less the reserve: what the stages share
    run_bytes: int  # rows (and diffs) a sort takes before writing a sorted run
    layer_bytes: int  # the largest layer held in memory; larger ones are spilled and mapped
    merge_bytes: int  # the blocks a k-way merge holds, all runs together
    kernel_bytes: int  # one kernel thread's proposals and bindings
    sink_bytes: int  # one kernel thread's output pieces before they are spilled
    threads: int

    @classmethod
    def of(cls, budget: MemoryBudget, threads: int = 1) -> Shares:
        reserve = min(RESERVE, budget.bytes // 2)
        work = budget.bytes - reserve
        threads = max(1, threads)
        least = 1 << 16
        return cls(
            budget,
            work,
            run_bytes=max(least, work // 10),
            layer_bytes=max(least, work // 8),
            merge_bytes=max(least, work // 10),
            kernel_bytes=max(least, work * 3 // 10 // threads),
            sink_bytes=max(least, work // 10 // threads),
            threads=threads,
        )

    def proposals(self, width: int) -> int:
        """The candidates a kernel step proposes at once for `width` variables: its share
        over what a candidate costs, about ``width**2 / 2`` longs held across the depths.

        >>> Shares.of(MemoryBudget(1 << 30)).proposals(100) < Shares.of(MemoryBudget(1 << 30)).proposals(3)
        True
        """
        per = CANDIDATE_COPIES * (width + 2) + width * width // 2
        return max(1 << 10, self.kernel_bytes // (8 * per))

    def chunk_rows(self, width: int) -> int:
        """The delta tuples a rule takes at once (the kernel's ``chunk_rows``)."""
        return max(1 << 10, min(1 << 20, self.kernel_bytes // (8 * 8 * (width + 2))))

    def for_spark(self, master: str | None, cores: int) -> SparkShares:
        """How a process tree that runs Spark splits this budget (`SparkShares`)."""
        return SparkShares.of(self.budget, master, cores, self.threads)


# The shares of a process tree running Spark in local mode: this process's own work, the JVM's
# heap (its overhead beyond the heap, metaspace and buffers, is about 384 MiB more), and
# the executors' Python workers together. On a cluster only the driver's JVM is in the tree.
DRIVER_SHARE = 0.4
JVM_SHARE = 0.2
WORKERS_SHARE = 0.25
MIN_HEAP = 512 << 20


@dataclass(frozen=True, slots=True)
class SparkShares:
    """One budget split over a process tree running Spark: this process's shares (`driver`), the
    JVM heap (`heap`) and each executor Python worker's (`worker_bytes`)."""

    driver: Shares
    heap: int
    worker_bytes: int

    @classmethod
    def of(cls, budget: MemoryBudget, master: str | None, cores: int, threads: int) -> SparkShares:
        """
        >>> s = SparkShares.of(MemoryBudget(4 << 30), "local[2]", 2, 2)
        >>> s.heap >> 20, s.worker_bytes >> 20, s.driver.budget.bytes >> 20
        (819, 512, 1638)
        """
        local = master is None or master.startswith("local")
        heap = max(MIN_HEAP, int(budget.bytes * JVM_SHARE))
        workers = int(budget.bytes * WORKERS_SHARE) if local else 0
        mine = max(MIN_BUDGET, int(budget.bytes * DRIVER_SHARE) if local else budget.bytes - heap)
        driver = Shares.of(MemoryBudget(mine, f"{budget.source}, this process's share"), threads)
        per_worker = max(64 << 20, workers // max(1, cores)) if local else 0
        return cls(driver, heap, per_worker)

    def conf(self) -> dict[str, str]:
        """The Spark settings that hold the JVM to its share."""
        return {"spark.driver.memory": f"{self.heap >> 20}m"}


# -- measuring -------------------------------------------------------------------------------------


def process_memory(pid: int | str = "self") -> dict[str, int]:
    """``RssAnon``, ``RssFile`` and ``VmHWM`` of a process in bytes (empty when unreadable:
    not Linux, or the process is gone)."""
    wanted = (b"RssAnon:", b"RssFile:", b"VmHWM:", b"VmRSS:")
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(wanted):
                    key, value = line.split(b":", 1)
                    out[key.decode()] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return out


@dataclass
class MemoryFigures:
    """What an epoch's process used: the budget, the sampled peak of its anonymous memory,
    its resident high-water mark (``VmHWM``: anonymous and mapped file pages), and the bytes
    it spilled to scratch files."""

    budget: int
    peak: int = 0
    high_water: int = 0
    spilled: int = 0
    source: str = ""
    stages: dict[str, int] = field(default_factory=dict)  # bytes spilled per epoch phase

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "budget_source": self.source,
            "peak_anon": self.peak,
            "vm_hwm": self.high_water,
            "spilled": self.spilled,
            "spilled_by_phase": dict(self.stages),
        }

    def describe(self) -> str:
        """One phrase for an epoch's line.

        >>> MemoryFigures(4 << 30, 300 << 20, 900 << 20, 0).describe()
        'memory 300.0 MiB of 4.0 GiB (VmHWM 900.0 MiB), spilled 0 B'
        """
        return (
            f"memory {format_size(self.peak)} of {format_size(self.budget)} "
            f"(VmHWM {format_size(self.high_water)}), spilled {format_size(self.spilled)}"
        )


@dataclass(eq=False)
class MemoryMeter:
    """Samples this process's ``RssAnon`` between `start` and `stop` (one `_Sampler` thread per
    process, kept for later meters) and counts the bytes `spilled`; `figures` gives what was seen.
    """

    budget: MemoryBudget
    interval: float = SAMPLE_SECONDS
    peak: int = 0
    spilled: int = 0
    high_water: int = 0
    _running: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def sample(self) -> int:
        found = process_memory()
        anon = found.get("RssAnon", 0)
        with self._lock:
            self.peak = max(self.peak, anon)
            self.high_water = max(self.high_water, found.get("VmHWM", 0))
        return anon

    def start(self) -> MemoryMeter:
        self.sample()
        if not self._running:
            self._running = True
            _SAMPLER.add(self)
        return self

    def stop(self) -> MemoryFigures:
        if self._running:
            _SAMPLER.remove(self)
            self._running = False
            self.sample()
        return self.figures()

    def add_spilled(self, n: int) -> None:
        with self._lock:
            self.spilled += n

    def figures(self) -> MemoryFigures:
        high_water = self.high_water or process_memory().get("VmHWM", 0)
        return MemoryFigures(
            self.budget.bytes, self.peak, high_water, self.spilled, self.budget.source
        )


class _Sampler:
    """The thread that samples for every running `MemoryMeter` of the process: it waits while
    none runs, and samples every `SAMPLE_SECONDS` (the shortest interval of those running)
    while any does."""

    def __init__(self) -> None:
        self._meters: set[MemoryMeter] = set()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, meter: MemoryMeter) -> None:
        with self._wake:
            self._meters.add(meter)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="wcoj-meter", daemon=True)
                self._thread.start()
            self._wake.notify()

    def remove(self, meter: MemoryMeter) -> None:
        with self._wake:
            self._meters.discard(meter)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._meters:
                    self._wake.wait()
                interval = min(m.interval for m in self._meters)
                self._wake.wait(interval)
                meters = list(self._meters)
            if meters:
                found = process_memory()
                for m in meters:
                    with m._lock:
                        m.peak = max(m.peak, found.get("RssAnon", 0))


_SAMPLER = _Sampler()
