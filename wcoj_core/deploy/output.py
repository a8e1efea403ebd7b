"""An output trace's change as the driver's threads make it: summed in memory, or spilled.

Each kernel thread hands each part of projected bindings to its own `Collector`, which holds
pieces up to `Shares.sink_bytes`; past it a `distinct` output (already consolidated) writes them
straight into its batch through a shared `Stream`, any other sums them into sorted runs
(`wcoj_core.spill.Sorter`). An output no one reads is only counted. `gather` puts one output's
collectors together as an `OutputChange`: arrays, runs to merge, or the batch written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import Layer
from wcoj_core.spill import Sorter, Spill


class Stream(Protocol):
    """Where a distinct output's spilled pieces go (`BatchWriter`)."""

    rows: int
    total: int

    def write(self, rows: np.ndarray, diff: np.ndarray) -> None: ...


@dataclass
class Written:
    """A batch written as its rows were made: the stream (closed by the caller) and its figures."""

    stream: Any
    rows: int
    total: int


@dataclass
class OutputChange:
    """One output's change after the rules: `arrays` (rows, diffs) in memory, or `runs` to
    merge (sorted, consolidated, in scratch files or memory), or a batch already `written`."""

    width: int
    arrays: tuple[np.ndarray, np.ndarray] | None = None
    runs: list[Layer] | None = None
    written: Written | None = None
    counted: tuple[int, int] | None = None  # rows and the sum of their diffs, nothing kept

    @property
    def spilled(self) -> bool:
        return self.arrays is None


@dataclass
class Collector:
    """One thread's pieces of one output (see the module)."""

    width: int
    distinct: bool
    limit: int
    spill: Spill | None
    stream: Callable[[], Stream] | None
    lock: threading.Lock
    pieces: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)
    held: int = 0
    sorter: Sorter | None = None
    streamed: bool = False
    counted: int = 0  # rows only counted (an output no one reads), and their diffs' sum
    counted_total: int = 0

    def count(self, rows: int, total: int) -> None:
        self.counted += rows
        self.counted_total += total

    def add(self, task: int, rows: np.ndarray, diff: np.ndarray) -> None:
        if len(diff) == 0:
            return
        if self.sorter is not None:
            self.sorter.add(rows, diff)
            return
        self.pieces.append((task, rows, diff))
        self.held += rows.nbytes + diff.nbytes
        if self.held > self.limit and self.spill is not None:
            self._spill()

    def _spill(self) -> None:
        if self.distinct and self.stream is not None:
            self._flush()
            return
        assert self.spill is not None
        self.sorter = self.spill.sorter(self.width, "summing the output change")
        self.sorter.run_bytes = self.limit
        pieces, self.pieces, self.held = self.pieces, [], 0
        for _, rows, diff in pieces:
            self.sorter.add(rows, diff)

    def _flush(self) -> None:
        """Write every piece held into the shared stream (a distinct output)."""
        assert self.stream is not None
        if self.spill is not None:
            self.spill.scratch.check_room(self.held // 4)  # compressed: about a quarter
        pieces, self.pieces, self.held = self.pieces, [], 0
        with self.lock:
            out = self.stream()
            for _, rows, diff in pieces:
                out.write(rows, diff)
        self.streamed = True


def gather(
    collectors: Sequence[Collector],
    width: int,
    distinct: bool,
    stream: Callable[[], Stream] | None,
    counting: bool = False,
) -> OutputChange:
    """The threads' collectors of one output put together (see the module)."""
    if counting:
        return OutputChange(
            width,
            counted=(sum(c.counted for c in collectors), sum(c.counted_total for c in collectors)),
        )
    if distinct and any(c.streamed for c in collectors):
        for c in collectors:
            if c.pieces:
                c._flush()  # pyright: ignore[reportPrivateUsage]
        assert stream is not None
        out = stream()
        return OutputChange(width, written=Written(out, out.rows, out.total))
    if any(c.sorter is not None for c in collectors):
        runs: list[Layer] = []
        for c in collectors:
            if c.sorter is None:
                c._spill()  # pyright: ignore[reportPrivateUsage]
            assert c.sorter is not None
            runs += c.sorter.take_runs()
        return OutputChange(width, runs=runs)
    pieces = sorted((p for c in collectors for p in c.pieces), key=lambda p: p[0])
    for c in collectors:
        c.pieces, c.held = [], 0
    if not pieces:
        return OutputChange(width, (np.zeros((0, width), dtype=I64), np.zeros(0, dtype=I64)))
    if len(pieces) == 1:
        rows, diff = pieces[0][1], pieces[0][2]
    else:
        n = sum(len(d) for _, _, d in pieces)
        rows = np.empty((n, width), dtype=I64, order="F")
        for j in range(width):
            np.concatenate([r[:, j] for _, r, _ in pieces], out=rows[:, j])
        diff = np.concatenate([d for _, _, d in pieces])
    pieces.clear()
    if distinct:
        return OutputChange(width, (rows, diff))
    layer = Layer.build(rows, diff, what="summing the output change")
    return OutputChange(width, (np.asarray(layer.rows), np.asarray(layer.diff)))
