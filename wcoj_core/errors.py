"""Errors raised by wcoj.

Every user mistake surfaces as a `WcojError` (or a subclass) whose message says what was wrong,
where (file, line, column, epoch, relation or query position) and, where it helps, what to do.
The core never prints; the CLI turns a `WcojError` into one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterable

# Items a message names from a list (column names, say) before it says how many there are.
NAMED = 8


def listed(items: Iterable[object], most: int = NAMED) -> str:
    """A list as a message shows it: every item when there are few, else the first ones and
    the last one with how many there are in all (a header of 100,000 columns makes a short
    line, not a megabyte).

    >>> listed(["a", "b"])
    "['a', 'b']"
    >>> listed([f"c{i}" for i in range(100_000)], most=3)
    "['c0', 'c1', 'c2', ..., 'c99999'] (100,000 in all)"
    """
    items = list(items)
    if len(items) <= most + 1:
        return repr(items)
    shown = ", ".join(repr(x) for x in items[:most])
    return f"[{shown}, ..., {items[-1]!r}] ({len(items):,} in all)"


class WcojError(Exception):
    """Base class for every error wcoj reports to a user."""


class QuerySyntaxError(WcojError):
    """Query text that does not parse; carries the 1-based line and column."""

    def __init__(self, message: str, line: int, column: int, text: str | None = None) -> None:
        self.line = line
        self.column = column
        self.text = text
        super().__init__(f"query line {line}, column {column}: {message}")


class QueryError(WcojError):
    """A query that parses but is not valid (unbound head variable, arity clash, ...)."""


class InputError(WcojError):
    """An input file or DataFrame that cannot be read as a relation.

    Carries the source name and, when known, the 1-based line and column (or row and column
    name for Parquet).
    """

    def __init__(
        self,
        message: str,
        source: str,
        line: int | None = None,
        column: int | str | None = None,
    ) -> None:
        self.source = source
        self.line = line
        self.column = column
        where = source
        if line is not None:
            where += f", line {line}"
        if column is not None:
            where += f", column {column}"
        super().__init__(f"{where}: {message}")


class StateError(WcojError):
    """The persisted state cannot accept the requested change (wrong epoch, concurrent writer, ...)."""


class EpochAlreadyApplied(StateError):
    """The epoch (or a later one) has already been applied to this state directory."""


class ConcurrentCommit(StateError):
    """Another writer committed the generation this one was about to commit."""


class DamagedState(StateError):
    """A manifest that is not what wcoj wrote: its digest does not match or its shape is wrong.

    The message is one line naming the file, what is wrong and the previous generation.
    """


class IncompatibleState(StateError):
    """A state written in a format this wcoj does not read (an earlier or a later one)."""


class DamagedFile(StateError):
    """A file named by the manifest that is missing or differs from what the manifest records.

    `path` is the file, `what` says what is wrong (missing, size, header, digest).
    """

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self.what = what
        super().__init__(f"{path}: {what}")


class DamagedBatch(DamagedFile):
    """A batch file (the source of truth of a trace) that is missing or differs from what the
    manifest records: nothing derived from it can be trusted or rebuilt, so the epoch stops."""


class OutOfMemory(WcojError, MemoryError):
    """Memory ran out while a file was being read: nothing is known to be wrong with the file
    (damage is claimed only on evidence: its size, digest, rows, or bytes read that do not
    decode). A `MemoryError` too, so that a handler of memory errors sees it as one."""


# What an allocation failure says when it reaches Python as another error: Arrow's memory
# pools, C++'s bad_alloc, the kernel's ENOMEM.
_NO_MEMORY = re.compile(r"out of memory|malloc of size|bad_alloc|cannot allocate memory", re.I)


def out_of_memory(e: BaseException) -> bool:
    """Whether an error is memory running out, not what was being read.

    >>> out_of_memory(MemoryError()), out_of_memory(OSError(errno.ENOMEM, "Cannot allocate memory"))
    (True, True)
    >>> out_of_memory(OSError("Unexpected end of stream")), out_of_memory(OSError(errno.EIO, "I/O"))
    (False, False)
    """
    if isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno == errno.ENOMEM):
        return True
    return _NO_MEMORY.search(str(e)) is not None


def read_failure(path: str, e: BaseException, what: str) -> WcojError:
    """The error for a file of a batch that failed to read with `e`: `OutOfMemory` when memory
    ran out, else `DamagedBatch` saying `what` could not be done (with `e`).

    >>> str(read_failure("b/part-0.parquet", MemoryError("malloc of size 64 failed"), "x"))
    'b/part-0.parquet: memory ran out reading this batch file (malloc of size 64 failed): no sign of damage, and nothing was changed; give the process more memory, or read less at once'
    >>> str(read_failure("b/part-0.parquet", OSError("Unexpected end of stream"), "not a readable batch"))
    'b/part-0.parquet: not a readable batch (Unexpected end of stream)'
    """
    if out_of_memory(e):
        return OutOfMemory(
            f"{path}: memory ran out reading this batch file ({e}): no sign of damage, and "
            "nothing was changed; give the process more memory, or read less at once"
        )
    return DamagedBatch(path, f"{what} ({e})")


class MultiplicityOverflow(WcojError):
    """A product or sum of multiplicities that would leave int64 (a weight of at least 2**63).

    Multiplicities are 64-bit integers: an epoch whose join multiplies or sums them past that
    range cannot be applied, rather than wrap to a wrong result. Carries `tuple` (the offending
    data tuple as Python ints, or None when unknown), `what` (the operation, in a few words)
    and `epoch` (None until the engine names it with `with_epoch`).

    >>> e = MultiplicityOverflow("the output change", (1, 2, 3))
    >>> str(e.with_epoch(7))
    'multiplicity overflow in the output change at (1, 2, 3): the exact value leaves the 64-bit range of multiplicities, so epoch 7 cannot be applied (check the diffs of its changes)'
    """

    def __init__(
        self, what: str, row: tuple[int, ...] | None = None, epoch: int | None = None
    ) -> None:
        self.what = what
        self.tuple = row
        self.epoch = epoch
        at = "" if row is None else f" at {row}"
        which = "the epoch" if epoch is None else f"epoch {epoch}"
        super().__init__(
            f"multiplicity overflow in {what}{at}: the exact value leaves the 64-bit range of "
            f"multiplicities, so {which} cannot be applied (check the diffs of its changes)"
        )

    def with_epoch(self, epoch: int) -> MultiplicityOverflow:
        """The same overflow, its message naming `epoch`."""
        return MultiplicityOverflow(self.what, self.tuple, epoch)

    def __reduce__(self) -> tuple[type[MultiplicityOverflow], tuple[object, ...]]:
        # Pickled by its fields (an executor's error crossing to the driver), not its message.
        return (MultiplicityOverflow, (self.what, self.tuple, self.epoch))
