"""Checked multiplicity arithmetic: int64 products and sums that never wrap unnoticed.

Multiplicities (diffs, weights) are ``int64``; numpy wraps silently past ``2**63``. Every product
and sum of multiplicities the kernel makes goes through here:

* `times` — an elementwise product, and which rows' exact product leaves int64 (a mask, None
  when none does): the join flags such rows and raises only if one completes a binding;
* `total` — the elementwise sum of a few arrays (a tuple's diff summed over layers);
* `sums_at` — sums of consecutive runs (``np.add.reduceat``: consolidating equal rows).

A sum raises `MultiplicityOverflow` naming the first row whose exact sum leaves int64 — the exact
final sum: a partial sum past the range that comes back into it does not count (wrapping
arithmetic is exact modulo ``2**64``, so the result is then right).

A product is checked row by row by the compiled kernel (`wcoj_core.kernel.native`), which also
makes the join's own products and sums over layers exactly (in 128 bits). A sum here is checked
cheaply first: a bound on the magnitudes in Python ints (the sum of the operands' ``max|a|``)
clears the usual case; only when it fails is every element checked exactly, by splitting each
value into its high and low 32 bits, summed apart (each fits) and recombined.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from wcoj_core.errors import MultiplicityOverflow
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.native import native

# |value| below this fits in int64 (and -LIMIT itself does too).
LIMIT = 1 << 63
_LOW = np.int64(0xFFFFFFFF)
_HALF = 1 << 31

# The data tuple of a row, by index: what an error names.
Namer = Callable[[int], tuple[int, ...]]


def magnitude(a: np.ndarray) -> int:
    """The largest ``|value|`` of `a` as a Python int (0 when empty): exact at ``-2**63``,
    where ``np.abs`` wraps.

    >>> magnitude(np.array([3, -(2**63)], dtype=np.int64)) == 2**63
    True
    """
    if a.size == 0:
        return 0
    return max(int(a.max()), -int(a.min()))


def times(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """``a * b`` elementwise, and which rows' exact product leaves int64 (None: no row's).

    A flagged row's product has wrapped: it must not be used. The kernel's compiled loops make
    the same check on every product they make (`native`).

    >>> big = np.array([2**32, 3, -(2**62)], dtype=np.int64)
    >>> product, over = times(big, np.array([2**31, 5, -2], dtype=np.int64))
    >>> product[1:].tolist(), over.tolist()
    ([15, -9223372036854775808], [True, False, True])
    """
    a = np.ascontiguousarray(a, dtype=I64)
    b = np.ascontiguousarray(b, dtype=I64)
    product = np.empty(len(a), dtype=I64)
    flags = np.zeros(len(a), dtype=np.uint8)
    if native.multiply(a, b, product, flags):
        return product, flags.view(bool)
    return product, None


def total(
    parts: Sequence[np.ndarray],
    name: Namer,
    what: str,
    bounds: Sequence[int | None] | None = None,
) -> np.ndarray:
    """The elementwise sum of `parts` (int64 arrays of one length, at least one), exact, or
    `MultiplicityOverflow` naming the first row whose sum leaves int64. `bounds` are known
    bounds on the parts' magnitudes (None: computed). The first part is summed into in place
    when there are several: pass one the caller owns.

    >>> total([np.array([2**62, 1]), np.array([2**62 - 1, 2])], lambda i: (i,), "a sum").tolist()
    [9223372036854775807, 3]
    >>> total([np.array([2**62, 1]), np.array([2**62, 2])], lambda i: (i,), "a sum")
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
      ...
    wcoj_core.errors.MultiplicityOverflow: multiplicity overflow in a sum at (0,): ...
    """
    if len(parts) == 1:
        return parts[0]
    bound = 0
    for i, p in enumerate(parts):
        known = None if bounds is None else bounds[i]
        bound += magnitude(p) if known is None else known
    if bound >= LIMIT:
        _raise_first(_split_sum(parts, lambda x: x), name, what)
    out = parts[0]
    for p in parts[1:]:
        np.add(out, p, out=out)
    return out


def sums_at(values: np.ndarray, starts: np.ndarray, name: Namer, what: str) -> np.ndarray:
    """``np.add.reduceat(values, starts)`` (`starts` increasing, the first 0), exact, or
    `MultiplicityOverflow` naming the run (by its first row) whose sum leaves int64.

    >>> sums_at(np.array([2, 3, 4]), np.array([0, 2]), lambda i: (i,), "a sum").tolist()
    [5, 4]
    """
    sums = np.add.reduceat(values, starts).astype(I64, copy=False)
    if magnitude(values) * len(values) >= LIMIT:
        over = _split_sum([values], lambda x: np.add.reduceat(x, starts))
        _raise_first(over, lambda g: name(int(starts[g])), what)
    return sums


def _split_sum(
    parts: Sequence[np.ndarray], reduce: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """Which rows' exact sum of the parts (each reduced by `reduce`) leaves int64.

    Each value is ``high * 2**32 + low`` with ``0 <= low < 2**32`` and ``|high| <= 2**31``: the
    highs and the lows of fewer than ``2**31`` values sum without wrapping, and the exact sum
    fits exactly when ``highs + (lows >> 32)`` lies in ``[-2**31, 2**31)``.
    """
    high = np.zeros(0, dtype=I64)
    low = np.zeros(0, dtype=I64)
    for i, p in enumerate(parts):
        h, lo = reduce(p >> 32), reduce(p & _LOW)
        high, low = (h, lo) if i == 0 else (high + h, low + lo)
    high += low >> 32
    return (high < -_HALF) | (high >= _HALF)


def _raise_first(over: np.ndarray, name: Namer, what: str) -> None:
    """Raise `MultiplicityOverflow` for the first flagged row, if any."""
    bad = np.flatnonzero(over)
    if len(bad):
        raise MultiplicityOverflow(what, name(int(bad[0])))


def exact_sum(values: np.ndarray) -> int:
    """The exact sum of an int64 array, as a Python int (it may lie beyond int64: the caller
    decides what that means).

    >>> exact_sum(np.array([2**62, 2**62, 2**62], dtype=np.int64)) == 3 * 2**62
    True
    """
    values = np.asarray(values, dtype=I64)
    if magnitude(values) * len(values) < LIMIT:
        return int(values.sum(dtype=I64))
    # Each value as high * 2**32 + low: both parts sum exactly for fewer than 2**31 values.
    return int((values >> 32).sum(dtype=I64)) * (1 << 32) + int((values & _LOW).sum(dtype=I64))


def row_namer(cols: Sequence[np.ndarray]) -> Namer:
    """The data tuple of a row given as columns.

    >>> row_namer([np.array([1, 2]), np.array([3, 4])])(1)
    (2, 4)
    """
    return lambda i: tuple(int(c[i]) for c in cols)
