"""The per-epoch check: an epoch's output change recomputed from its input changes.

`recompute_change` evaluates a query's delta rules at an epoch (`wcoj_core.audit_sample` compares
the result with the stored change and figures, in full or sampled)::

    Q(new) - Q(old) = sum_i  new_1 ... new_{i-1}  dR_i  old_{i+1} ... old_n

**Independent of the kernel**: plain binary joins, one atom at a time, each fetching only the
tuples that match the keys bound so far from sorted sources it searches itself (index segments
whose leading column is bound, mapped and checked in order first, plus the recent batches sorted
here; old and new states are signed sums of them, never merged). Only when no order starts with a
bound column is a relation scanned (`Audit.method` says so). The next atom is the one with the
fewest matching tuples per binding; bindings that disagree are split by their cheapest atom.
Weights are exact: int64 while a bound proves it fits, Python ints otherwise.

**What it cannot see**: what both sides read alike (a wrong relation batch, a segment that
disagrees with its batches, the output's earlier batches, counts arrangements);
``matches_binary_join`` and ``wcoj verify`` cover those.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from wcoj_core.arrow import consolidated, longs
from wcoj_core.errors import DamagedFile, QueryError, StateError
from wcoj_core.query.ir import Atom, CmpOp, Const, Filter, Query, Term, Var
from wcoj_core.store import segments
from wcoj_core.store.batches import read_tables
from wcoj_core.store.manifest import Batch, Level, Manifest, Segment, Trace
from wcoj_core.traces import DIFF, relation_trace_name

if TYPE_CHECKING:
    from wcoj_core.engine import Engine

__all__ = ["Audit", "AuditMode", "Change", "recompute_change"]

I64 = np.int64
LIMIT = 1 << 63  # |value| below this fits in int64
EXAMPLES = 5  # mismatching tuples an audit names
SPLIT = 2.0  # split bindings by their cheapest atom when that cuts the rows by this factor
SMALL = 1 << 13  # recent segments up to this many rows are sorted with the batches, not mapped
ORDER_ROWS = 1 << 20  # a mapped segment up to this many rows has every pair of rows checked
ORDER_PAIRS = 4096  # a larger one this many random pairs

Columns = list[np.ndarray]  # rows as one array per column
Block = tuple[Columns, np.ndarray]  # rows and their diffs (or weights)


@dataclass(frozen=True, slots=True)
class Audit:
    """A check of one query's output change at one epoch (see the module).

    `examples` name the first mismatching tuples (``"(1, 2, 3): expected 1, stored 0"``);
    `expected_rows` and `actual_rows` count the recomputed and the stored change's tuples,
    `joined_rows` the rows the check's joins produced; `method` says what it read.
    """

    passed: bool
    mismatches: int
    examples: list[str]
    expected_rows: int
    actual_rows: int
    joined_rows: int
    seconds: float
    method: str
    mode: str = "full"  # "full" or "exact" (every tuple), or "sampled"
    figures: str = "ok"  # what the figures as of the epoch get wrong
    catch: float = 1.0  # the chance one wrong tuple is found (1.0: every tuple checked)
    # The chance an error moving the change's sum (a missing or extra tuple, a wrong
    # multiplicity) is found, and what the check can miss.
    catch_sum: float = 1.0
    misses: str = "nothing of the change: every tuple recomputed"


@dataclass(frozen=True, slots=True)
class Change:
    """A recomputed output change: one array per head column and the tuples' multiplicities
    (int64, or Python ints where one leaves int64), consolidated and sorted."""

    columns: tuple[np.ndarray, ...]
    weights: np.ndarray
    joined_rows: int
    method: str

    def as_dict(self) -> dict[tuple[int, ...], int]:
        """The change as ``{tuple: multiplicity}`` in Python ints."""
        rows = zip(*(c.tolist() for c in self.columns), strict=True) if self.columns else None
        weights = [int(w) for w in self.weights.tolist()]
        if rows is None:  # a boolean query: its one tuple, or none
            return {(): weights[0]} if weights else {}
        return {tuple(r): w for r, w in zip(rows, weights, strict=True)}


class _Side(Enum):
    """Which state of a relation an atom reads."""

    OLD = "old"  # time < t
    NEW = "new"  # time <= t
    DELTA = "delta"  # the change at t


# -- exact multiplicities ----------------------------------------------------------------------


def _magnitude(a: np.ndarray) -> int:
    """The largest ``|value|`` as a Python int (0 for none).

    >>> _magnitude(np.array([3, -(2**63)], dtype=np.int64)) == 2**63
    True
    """
    return max(int(a.max()), -int(a.min())) if a.size else 0


def _times(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a * b`` elementwise, exactly: int64 when a bound proves it fits, else Python ints.

    >>> _times(np.array([2**40]), np.array([2**20])).dtype
    dtype('int64')
    >>> _times(np.array([2**40]), np.array([-(2**40)])).tolist() == [-(2**80)]
    True
    """
    if a.dtype != object and b.dtype != object and _magnitude(a) * _magnitude(b) < LIMIT:
        return a * b
    return a.astype(object) * b.astype(object)


def _negated(a: np.ndarray) -> np.ndarray:
    """``-a`` exactly (``-(-2**63)`` leaves int64: then Python ints)."""
    return -(a.astype(object)) if a.dtype != object and _magnitude(a) >= LIMIT else -a


def _joined(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Diffs or weights concatenated, as Python ints if any of them is."""
    if any(a.dtype == object for a in arrays):
        return np.concatenate([a.astype(object) for a in arrays])
    return np.concatenate(arrays) if len(arrays) != 1 else arrays[0]


# -- sorted sources and their searches -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Source:
    """Rows sorted lexicographically (one array per column, in a path's order) and their
    signed multiplicities; `unique` when each row is there once (a consolidated segment)."""

    cols: tuple[np.ndarray, ...]
    diff: np.ndarray
    unique: bool = False

    def __len__(self) -> int:
        return len(self.diff)


def _bisect(
    col: np.ndarray, lo: np.ndarray, hi: np.ndarray, v: np.ndarray, right: bool
) -> np.ndarray:
    """Per key ``i``, the first position in ``[lo[i], hi[i])`` of sorted `col` whose value is
    above ``v[i]`` (`right`) or at least ``v[i]``; ``hi[i]`` when there is none.

    >>> col = np.array([1, 3, 3, 5, 2, 4])
    >>> lo, hi = np.array([0, 0, 4]), np.array([4, 4, 6])
    >>> _bisect(col, lo, hi, np.array([3, 3, 9]), False).tolist()
    [1, 1, 6]
    >>> _bisect(col, lo, hi, np.array([3, 6, 3]), True).tolist()
    [3, 4, 5]
    """
    lo, hi = lo.copy(), hi.copy()
    live = np.flatnonzero(lo < hi)
    while len(live):
        a, b = lo[live], hi[live]
        mid = (a + b) >> 1
        go = col[mid] <= v[live] if right else col[mid] < v[live]
        a, b = np.where(go, mid + 1, a), np.where(go, b, mid)
        lo[live], hi[live] = a, b
        live = live[a < b]
    return lo


# A bound on a column from a filter: its values per binding, lower (else upper), strict.
_Bound = tuple[np.ndarray, bool, bool]


def _ranges(
    src: _Source,
    keys: Sequence[np.ndarray],
    first: tuple[np.ndarray, np.ndarray] | None,
    bounds: Sequence[_Bound],
    m: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Per binding, the range of `src`'s rows whose first columns equal `keys` and whose next
    column passes `bounds`. `first` holds the first key's distinct values, sorted, and where
    each binding's is among them: the leading column is searched once per value, in order."""
    if len(src) == 0:
        return np.zeros(m, dtype=I64), np.zeros(m, dtype=I64)
    if first is not None:
        values, where = first
        lo = np.searchsorted(src.cols[0], values, "left").astype(I64)[where]
        hi = np.searchsorted(src.cols[0], values, "right").astype(I64)[where]
    else:
        lo, hi = np.zeros(m, dtype=I64), np.full(m, len(src), dtype=I64)
    for k in range(1, len(keys)):
        col = src.cols[k]
        lo = _bisect(col, lo, hi, keys[k], False)
        if src.unique and k == len(src.cols) - 1:  # a whole row, held once: there or not
            hit = lo < hi
            hit[hit] = col[lo[hit]] == keys[k][hit]
            hi = lo + hit
        else:
            hi = _bisect(col, lo, hi, keys[k], True)
    for values, lower, strict in bounds:
        col = src.cols[len(keys)]
        right = strict if lower else not strict
        if keys:
            edge = _bisect(col, lo, hi, values, right)
        else:  # every range is the whole column
            edge = np.searchsorted(col, values, "right" if right else "left").astype(I64)
        lo, hi = (np.maximum(edge, lo), hi) if lower else (lo, np.minimum(edge, hi))
    return lo, np.maximum(hi, lo)


def _packed(cols: Sequence[np.ndarray]) -> np.ndarray | None:
    """Rows (as columns, not empty) as one int64 each, in the rows' lexicographic order: each
    column's offset from its least value in the bits its span needs, the first column highest.
    None when they need more than 63 bits together.

    >>> _packed([np.array([3, 1, 3]), np.array([-1, 7, 0])]).tolist()
    [32, 8, 33]
    >>> _packed([np.array([0, 2**62]), np.array([0, 1])]) is None
    True
    """
    lows = [int(c.min()) for c in cols]
    bits = [(int(c.max()) - low).bit_length() for c, low in zip(cols, lows, strict=True)]
    if sum(bits) > 63:
        return None
    key = np.zeros(len(cols[0]), dtype=I64)
    for c, low, width in zip(cols, lows, bits, strict=True):
        key <<= width
        key |= c - I64(low)  # the offset fits: exact even where the subtraction wraps
    return key


def _groups(cols: Columns, w: np.ndarray) -> tuple[Columns, np.ndarray, np.ndarray]:
    """Rows sorted, `w` reordered alike, and where each run of equal rows starts.

    >>> cols, w, starts = _groups([np.array([2, 1, 2]), np.array([5, 9, 5])], np.array([1, 2, 3]))
    >>> [c.tolist() for c in cols], w.tolist(), starts.tolist()
    ([[1, 2, 2], [9, 5, 5]], [2, 1, 3], [0, 1])
    """
    if not cols or not len(w):
        return cols, w, np.zeros(1 if len(w) else 0, dtype=I64)
    key = _packed(cols)
    order = np.lexsort(tuple(reversed(cols))) if key is None else np.argsort(key, kind="stable")
    cols, w = [c[order] for c in cols], w[order]
    first = np.ones(len(w), dtype=bool)
    if key is not None:
        key = key[order]
        first[1:] = key[1:] != key[:-1]
    else:
        first[1:] = False
        for c in cols:
            first[1:] |= c[1:] != c[:-1]
    return cols, w, np.flatnonzero(first)


def _sorted(parts: Sequence[Block], width: int) -> _Source:
    """Parts of rows and diffs as one source sorted here (equal rows kept apart)."""
    live = [p for p in parts if len(p[1])]
    if not live:
        return _Source(tuple(np.zeros(0, I64) for _ in range(width)), np.zeros(0, I64))
    cols = [np.concatenate([c[k] for c, _ in live]) for k in range(width)]
    cols, diff, _ = _groups(cols, _joined([d for _, d in live]))
    return _Source(tuple(cols), diff)


def _longs(tables: Sequence[pa.Table], name: str) -> np.ndarray:
    """A long column of tables taken in order (a view for one table of one chunk)."""
    parts = [longs(t.column(name)) for t in tables]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, I64)


def in_order(cols: Sequence[np.ndarray], rng: np.random.Generator) -> bool:
    """Whether rows (as columns) are strictly increasing, as a segment's must be: every pair of
    neighbours when there are at most `ORDER_ROWS`, else `ORDER_PAIRS` random pairs (a segment
    with a share ``f`` of its pairs out of order is caught with chance ``1 - (1 - f)^4096``).

    >>> rng = np.random.default_rng(0)
    >>> in_order([np.array([1, 1, 2]), np.array([5, 7, 0])], rng)
    True
    >>> in_order([np.array([2, 1]), np.array([0, 0])], rng)
    False
    """
    n = len(cols[0]) if cols else 0
    if n < 2:
        return True
    at = np.arange(n - 1) if n <= ORDER_ROWS else rng.integers(0, n - 1, ORDER_PAIRS)
    less = np.zeros(len(at), dtype=bool)
    equal = np.ones(len(at), dtype=bool)
    for c in cols:
        a, b = c[at], c[at + 1]
        less |= equal & (a < b)
        equal &= a == b
    return bool(less.all())


# -- how an atom reads a relation ------------------------------------------------------------

_Pattern = tuple[int | Const, ...]
_Key = tuple[_Pattern | None, tuple[int, ...]]  # an index view (None: as stored) and order


def _pattern(atom: Atom) -> _Pattern:
    """The atom's view as the index names it: per column, its variable's rank among the atom's
    distinct variables, or its constant.

    >>> _pattern(Atom("e", (Var("x"), Const(3), Var("x"), Var("y"))))
    (0, Const(value=3), 0, 1)
    """
    seen: dict[Var, int] = {}
    return tuple(t if isinstance(t, Const) else seen.setdefault(t, len(seen)) for t in atom.terms)


def _view(rows: Columns, pattern: _Pattern | None) -> tuple[Columns, np.ndarray | None]:
    """Relation columns through a view: its columns, and which rows it keeps (None: all)."""
    if pattern is None:
        return rows, None
    keep = np.ones(len(rows[0]), dtype=bool)
    first: dict[int, int] = {}
    for col, p in enumerate(pattern):
        if isinstance(p, Const):
            keep &= rows[col] == p.value
        elif p in first:
            keep &= rows[col] == rows[first[p]]
        else:
            first[p] = col
    return [rows[first[j]][keep] for j in range(len(first))], keep


def _prefix(terms: Sequence[Term], bound: set[Var]) -> int:
    """How many leading terms are constants or bound variables.

    >>> _prefix((Const(1), Var("a"), Var("b")), {Var("a")})
    2
    """
    n = 0
    while n < len(terms) and (isinstance(terms[n], Const) or terms[n] in bound):
        n += 1
    return n


def _keyed(atom: Atom, bound: set[Var]) -> bool:
    """Whether some column of the atom is known: a constant or a bound variable."""
    return any(isinstance(t, Const) or t in bound for t in atom.terms)


@dataclass(frozen=True, slots=True)
class _Path:
    """Sources whose stored column ``k`` holds the atom's term ``terms[k]``; `how` names them."""

    terms: tuple[Term, ...]
    sources: tuple[_Source, ...]
    how: str


class _Relation:
    """A relation's stored state around an epoch: its change, and sources for its old and new
    states (base segments plus what the index lacks, or its batches alone)."""

    def __init__(self, engine: Engine, trace: Trace | None, arity: int, epoch: int) -> None:
        self.engine, self.trace, self.arity, self.epoch = engine, trace, arity, epoch
        self.batches: tuple[Batch, ...] = trace.batches if trace is not None else ()
        index = trace.index if trace is not None else None
        self.index = index if index is not None and index.segments and engine.local else None
        self.keys: dict[_Key, list[Segment]] = {}
        for s in self.index.segments if self.index is not None else ():
            self.keys.setdefault((s.view, tuple(s.order)), []).append(s)
        self.notes: set[str] = set()
        self.rng = np.random.default_rng(epoch)  # which rows of a large segment are checked
        self._read: dict[str, Block] = {}
        self._bases: dict[_Key, tuple[_Source, ...]] = {}
        self._recent: dict[_Key, list[Block]] = {}
        self._small: dict[tuple[_Side, bool, _Key], _Source] = {}

    @property
    def changed(self) -> bool:
        return any(b.time == self.epoch and b.rows for b in self.batches)

    def rows(self) -> int:
        return sum(b.rows for b in self.batches if b.time <= self.epoch)

    def _batch(self, b: Batch) -> Block:
        """A batch read whole (its files' sizes, digests, rows and epoch checked), as columns
        and diffs, consolidated and sorted: as its files hold it when one pass over them
        confirms it (what the engine writes), else sorted by the engine's reader."""
        if b.path not in self._read:
            assert self.trace is not None
            columns = self.trace.columns
            tables = self.engine.batches.verified_tables(b.path, columns, b.files, b.rows, b.time)
            if consolidated(tables, columns):
                cols = [_longs(tables, c) for c in columns]
                diff = _longs(tables, DIFF)
            else:
                layer = read_tables(columns, tables)
                rows = np.asarray(layer.rows)
                cols = [np.ascontiguousarray(rows[:, j]) for j in range(self.arity)]
                diff = np.asarray(layer.diff)
            self._read[b.path] = (cols, diff)
        return self._read[b.path]

    def _signed(self, side: _Side, scan: bool) -> list[tuple[Batch, int]]:
        """The batches `side` adds (+1) to the index or takes from it (-1); all its batches
        with `scan` or without an index."""
        t = self.epoch
        if side is _Side.DELTA:
            return [(b, 1) for b in self.batches if b.time == t]
        held = [b for b in self.batches if b.time < t or (side is _Side.NEW and b.time == t)]
        if scan or self.index is None:
            return [(b, 1) for b in held]
        covered, paths = self.index.time, {b.path for b in held}
        plus = [(b, 1) for b in held if b.time > covered]
        return plus + [(b, -1) for b in self.batches if b.time <= covered and b.path not in paths]

    def small(self, side: _Side, key: _Key, scan: bool = False) -> _Source | None:
        """What `side` holds beyond the base segments of `key` — the recent segments and the
        batches the index lacks, signed — or with `scan` all its batches: sorted here."""
        found = (side, scan, key)
        if found not in self._small:
            pattern, order = key
            parts = list(self._recent.get(key, [])) if side is not _Side.DELTA and not scan else []
            for b, sign in self._signed(side, scan):
                if b.rows:
                    rows, diff = self._batch(b)
                    view, keep = _view(rows, pattern)
                    d = diff if keep is None else diff[keep]
                    parts.append(([view[j] for j in order], d if sign > 0 else _negated(d)))
            self._small[found] = _sorted(parts, len(order))
        src = self._small[found]
        return src if len(src) else None

    def bases(self, key: _Key) -> tuple[_Source, ...] | None:
        """The segments of `key` searched where they lie, mapped: the base and any large
        recent one; the small recent ones are read for `small`. None when a segment file is
        damaged (the relation's batches are scanned instead)."""
        if key not in self._bases:
            bases: list[_Source] = []
            recent: list[Block] = []
            try:
                for s in self.keys[key]:
                    if s.rows:
                        layer = segments.open_segment(self.engine.store.root, s)
                        rows, diff = np.asarray(layer.rows), np.asarray(layer.diff)
                        cols = [rows[:, k] for k in range(rows.shape[1])]
                        if not in_order(cols, self.rng):
                            raise DamagedFile(s.path, "its rows are not in order")
                        if s.level is Level.BASE or s.rows > SMALL:
                            bases.append(_Source(tuple(cols), diff, unique=True))
                        else:
                            recent.append(([np.array(c) for c in cols], np.array(diff)))
            except DamagedFile as e:
                self.notes.add(f"a damaged segment ({e.path}: {e.what}): scanned its batches")
                self.index = None
                return None
            self._bases[key], self._recent[key] = tuple(bases), recent
        return self._bases[key]

    def path(self, atom: Atom, side: _Side, bound: set[Var]) -> _Path | None:
        """The sorted path for `atom` whose leading columns are bound the furthest; None when
        only a scan of the batches would do."""
        if side is _Side.DELTA:  # sorted here, its known columns first
            order = _known_first(atom, bound, self.arity)
            src = self.small(side, (None, order))
            terms = tuple(atom.terms[j] for j in order)
            return _Path(terms, (src,) if src is not None else (), "change")
        if side is _Side.OLD and not any(b.time < self.epoch for b in self.batches):
            return _Path(atom.terms, (), "nothing before the epoch")
        if self.index is None:
            return None
        pattern, distinct = _pattern(atom), atom.vars
        best: tuple[int, bool, _Key, tuple[Term, ...]] | None = None
        for key in self.keys:
            view, order = key
            if view is not None and view != pattern:
                continue
            terms = tuple(atom.terms[j] if view is None else distinct[j] for j in order)
            # The furthest bound; between equals, a view's segment (its rows are selected).
            rank = (_prefix(terms, bound), view is not None, key, terms)
            if best is None or rank[:2] > best[:2]:
                best = rank
        if best is None:
            return None
        lead, _, key, terms = best
        if lead == 0 and _keyed(atom, bound):
            return None  # bound columns, none leading: a scan beats every row
        bases = self.bases(key)
        if bases is None:
            return None
        extra = self.small(side, key)
        view, order = key
        how = f"{'segments' if view is None else 'view segments'} ({_order(order)})"
        return _Path(terms, (*bases, *((extra,) if extra is not None else ())), how)

    def scan(self, atom: Atom, side: _Side, bound: set[Var]) -> _Path:
        """The relation's batches of `side` read whole, sorted with the bound columns first."""
        order = _known_first(atom, bound, self.arity)
        src = self.small(side, (None, order), scan=True)
        fixed = _keyed(atom, bound)
        why = f"no segment led by c{order[0]}" if fixed and self.index is not None else "no index"
        self.notes.add(f"scanned its batches ({why})")
        terms = tuple(atom.terms[j] for j in order)
        return _Path(terms, (src,) if src is not None else (), f"batches ({_order(order)})")


class _Whole(_Relation):
    """A relation as a query attached at the epoch reads it (`wcoj_core.attach`): nothing
    before, all of it the change, so its delta rules give the whole output its trace holds at
    that epoch. Its batches are scanned."""

    def __init__(self, engine: Engine, trace: Trace | None, arity: int, epoch: int) -> None:
        super().__init__(engine, trace, arity, epoch)
        self.index = None
        self.batches = tuple(b for b in self.batches if b.time <= epoch)

    @property
    def changed(self) -> bool:
        return any(b.rows for b in self.batches)

    def _signed(self, side: _Side, scan: bool) -> list[tuple[Batch, int]]:
        return [] if side is _Side.OLD else [(b, 1) for b in self.batches]


def _known_first(atom: Atom, bound: set[Var], arity: int) -> tuple[int, ...]:
    """The atom's columns, those holding a constant or a bound variable first.

    >>> _known_first(Atom("e", (Var("a"), Const(2), Var("b"))), {Var("b")}, 3)
    (1, 2, 0)
    """
    fixed = [j for j, t in enumerate(atom.terms) if isinstance(t, Const) or t in bound]
    return tuple(fixed + [j for j in range(arity) if j not in fixed])


def _order(order: Sequence[int]) -> str:
    return ",".join(f"c{j}" for j in order)


# -- bindings and joins ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Bindings:
    """Partial bindings of a rule's variables (an array per bound variable) and weights."""

    values: dict[Var, np.ndarray]
    weight: np.ndarray

    def __len__(self) -> int:
        return len(self.weight)

    def taking(self, picked: np.ndarray) -> _Bindings:
        return _Bindings({v: a[picked] for v, a in self.values.items()}, self.weight[picked])

    def value(self, term: Term) -> np.ndarray:
        if isinstance(term, Const):
            return np.full(len(self), term.value, dtype=I64)
        return self.values[term]


@dataclass(frozen=True, slots=True)
class _Probe:
    """An atom's path searched for the bindings: each binding's range in each source."""

    atom: int
    path: _Path
    lead: int
    ranges: tuple[tuple[np.ndarray, np.ndarray], ...]
    m: int

    def sizes(self) -> np.ndarray:
        """Per binding, the rows its ranges hold in every source together."""
        total = np.zeros(self.m, dtype=I64)
        for lo, hi in self.ranges:
            total += hi - lo
        return total

    def taking(self, picked: np.ndarray) -> _Probe:
        ranges = tuple((lo[picked], hi[picked]) for lo, hi in self.ranges)
        return _Probe(self.atom, self.path, self.lead, ranges, len(picked))


_LOWER = {CmpOp.GT: True, CmpOp.GE: True, CmpOp.LT: False, CmpOp.LE: False}
_COMPARE = {
    CmpOp.LT: np.less,
    CmpOp.LE: np.less_equal,
    CmpOp.GT: np.greater,
    CmpOp.GE: np.greater_equal,
    CmpOp.EQ: np.equal,
    CmpOp.NE: np.not_equal,
}


def _bounds(var: Var, filters: Iterable[Filter], b: _Bindings) -> list[_Bound]:
    """The bounds the filters put on `var` given the bound variables and constants."""
    out: list[_Bound] = []
    for f in filters:
        if f.left == var and f.right != var:
            op, other = f.op, f.right
        elif f.right == var and f.left != var:
            op, other = f.op.flipped(), f.left
        else:
            continue
        if isinstance(other, Var) and other not in b.values:
            continue
        values = b.value(other)
        if op is CmpOp.EQ:
            out += [(values, True, False), (values, False, False)]
        elif op in _LOWER:
            out.append((values, _LOWER[op], op in (CmpOp.GT, CmpOp.LT)))
    return out


def _probe(atom: int, path: _Path, b: _Bindings, filters: Sequence[Filter]) -> _Probe:
    """Search `path` for each binding's keys (its bound leading columns)."""
    lead = _prefix(path.terms, set(b.values))
    keys = [b.value(t) for t in path.terms[:lead]]
    nxt = path.terms[lead] if lead < len(path.terms) else None
    bounds = _bounds(nxt, filters, b) if isinstance(nxt, Var) else []
    first = np.unique(keys[0], return_inverse=True) if keys else None
    ranges = tuple(_ranges(src, keys, first, bounds, len(b)) for src in path.sources)
    return _Probe(atom, path, lead, ranges, len(b))


def _positions(lo: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ranges ``[lo, lo + sizes)`` concatenated, and the range each came from.

    >>> pos, owner = _positions(np.array([5, 0, 2]), np.array([2, 0, 3]))
    >>> pos.tolist(), owner.tolist()
    ([5, 6, 2, 3, 4], [0, 0, 2, 2, 2])
    """
    owner = np.repeat(np.arange(len(sizes), dtype=I64), sizes)
    starts = np.cumsum(sizes) - sizes
    return np.arange(int(sizes.sum()), dtype=I64) + np.repeat(lo - starts, sizes), owner


def _fetch(b: _Bindings, probe: _Probe) -> _Bindings:
    """The bindings joined with the rows in their ranges: the atom's other columns checked
    (constants, bound and repeated variables) or bound, the weights multiplied."""
    terms, lead = probe.path.terms, probe.lead
    owners: list[np.ndarray] = []
    cols: list[Columns] = [[] for _ in terms[lead:]]
    diffs: list[np.ndarray] = []
    for src, (lo, hi) in zip(probe.path.sources, probe.ranges, strict=True):
        sizes = hi - lo
        if sizes.any():
            pos, owner = _positions(lo, sizes)
            owners.append(owner)
            for k in range(lead, len(terms)):
                cols[k - lead].append(src.cols[k][pos])
            diffs.append(src.diff[pos])
    if not owners:
        return b.taking(np.zeros(0, dtype=I64))
    owner, diff = np.concatenate(owners), _joined(diffs)
    keep: np.ndarray | None = None
    fresh: dict[Var, np.ndarray] = {}
    for term, parts in zip(terms[lead:], cols, strict=True):
        got = np.concatenate(parts) if len(parts) > 1 else parts[0]
        if isinstance(term, Const):
            same = got == term.value
        elif term in b.values:
            same = got == b.values[term][owner]
        elif term in fresh:
            same = got == fresh[term]
        else:
            fresh[term] = got
            continue
        keep = same if keep is None else keep & same
    if keep is not None:
        owner, diff = owner[keep], diff[keep]
        fresh = {v: a[keep] for v, a in fresh.items()}
    values = {v: a[owner] for v, a in b.values.items()} | fresh
    return _Bindings(values, _times(b.weight[owner], diff))


class TooMuch(Exception):
    """The joins of an audit went past their budget of rows (`_Rules.budget`)."""


class _Rules:
    """A query's delta rules at an epoch, evaluated by binary joins (see the module).

    `budget` bounds the rows the joins may produce (None: no bound); past it `TooMuch` stops
    them, so a caller can do less (a sample) instead."""

    def __init__(
        self, query: Query, relations: dict[str, _Relation], budget: int | None = None
    ) -> None:
        self.query, self.relations = query, relations
        self.joined = 0
        self.budget = budget
        self.hows: dict[str, set[str]] = {}
        self.out: list[Block] = []
        self.sides: list[_Side] = []

    def _sides(self, delta: int) -> None:
        n = len(self.query.atoms)
        self.sides = [_Side.NEW if j < delta else _Side.OLD for j in range(n)]
        self.sides[delta] = _Side.DELTA

    def run(self, delta: int, keep: np.ndarray | None = None) -> None:
        """Add rule `delta`'s bindings, projected on the head, to `out`; with `keep`, only those
        grown from the delta atom's change rows at the sorted positions `keep` (a sample)."""
        n = len(self.query.atoms)
        self._sides(delta)
        atom = self.query.atoms[delta]
        path = self.relations[atom.relation].path(atom, _Side.DELTA, set())
        assert path is not None
        if keep is not None:
            picked = tuple(
                _Source(tuple(c[keep] for c in src.cols), src.diff[keep]) for src in path.sources
            )
            path = _Path(path.terms, picked, path.how)
        start = _Bindings({}, np.ones(1, dtype=I64))
        probe = _probe(delta, path, start, self.query.filters)
        self._step(start, probe, [], [j for j in range(n) if j != delta])

    def run_bound(self, delta: int, start: _Bindings) -> None:
        """Add rule `delta`'s bindings that extend `start` (head variables bound to given
        tuples), projected on the head, to `out`: what the rule adds to those tuples."""
        self._sides(delta)
        self._after(start, [], list(range(len(self.query.atoms))))

    def _step(self, b: _Bindings, probe: _Probe, applied: list[Filter], rest: list[int]) -> None:
        """Join one atom, apply the filters now bound, and go on with the other atoms."""
        atom = self.query.atoms[probe.atom]
        self.hows.setdefault(atom.relation, set()).add(probe.path.how)
        b = _fetch(b, probe)
        self.joined += len(b)
        if self.budget is not None and self.joined > self.budget:
            raise TooMuch
        self._after(b, applied, [j for j in rest if j != probe.atom])

    def _after(self, b: _Bindings, applied: list[Filter], rest: list[int]) -> None:
        """Apply the filters the bindings now bind, and go on with the atoms `rest`."""
        ready = [f for f in self.query.filters if f not in applied and f.vars <= set(b.values)]
        if ready and len(b):
            keep = np.ones(len(b), dtype=bool)
            for f in ready:
                keep &= _COMPARE[f.op](b.value(f.left), b.value(f.right))
            b = b.taking(np.flatnonzero(keep))
        if len(b):
            self._extend(b, applied + ready, rest)

    def _extend(self, b: _Bindings, applied: list[Filter], rest: list[int]) -> None:
        """Join the cheapest next atom, per group of bindings when they disagree."""
        if not rest:
            agg = self.query.aggregate
            weight = (
                b.weight if agg is None or agg.var is None else _times(b.weight, b.values[agg.var])
            )
            self.out.append(([b.values[v] for v in self.query.head], weight))
            return
        candidates = self._candidates(b, [f for f in self.query.filters if f not in applied], rest)
        sizes = np.stack([p.sizes() for p in candidates])
        best = int(np.argmin(sizes.sum(axis=1)))
        apart = int(sizes.min(axis=0).sum())  # rows if each binding took its cheapest atom
        if len(candidates) == 1 or int(sizes[best].sum()) <= SPLIT * apart + len(b):
            self._step(b, candidates[best], applied, rest)
            return
        choice = np.argmin(sizes, axis=0)
        for c, probe in enumerate(candidates):
            picked = np.flatnonzero(choice == c)
            if len(picked):
                self._step(b.taking(picked), probe.taking(picked), applied, rest)

    def _candidates(self, b: _Bindings, pending: list[Filter], rest: list[int]) -> list[_Probe]:
        """The atoms that may come next, searched: those keyed by a bound term (through a
        segment, else a scan); when none is, every atom (a product)."""
        atoms, bound = self.query.atoms, set(b.values)
        probes: list[_Probe] = []
        unsearched: list[int] = []
        for j in rest:
            path = self.relations[atoms[j].relation].path(atoms[j], self.sides[j], bound)
            if path is None:
                unsearched.append(j)
            else:
                probes.append(_probe(j, path, b, pending))
        keyed = [p for p in probes if p.lead > 0 or not atoms[p.atom].vars]
        if keyed or not unsearched:
            return keyed or probes
        linked = [j for j in unsearched if _keyed(atoms[j], bound)]
        if probes and not linked:
            return probes
        j = min(linked or unsearched, key=lambda j: self.relations[atoms[j].relation].rows())
        path = self.relations[atoms[j].relation].scan(atoms[j], self.sides[j], bound)
        return [_probe(j, path, b, pending)]


def _summed(blocks: Sequence[Block], width: int) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Head tuples and weights, equal tuples summed (exactly), zeros dropped, sorted."""
    live = [bl for bl in blocks if len(bl[1])]
    if not live:
        return tuple(np.zeros(0, I64) for _ in range(width)), np.zeros(0, I64)
    cols = [np.concatenate([c[k] for c, _ in live]) for k in range(width)]
    w = _joined([x for _, x in live])
    if w.dtype != object and len(w) * _magnitude(w) >= LIMIT:
        w = w.astype(object)
    cols, w, starts = _groups(cols, w)
    sums = np.add.reduceat(w, starts)
    nonzero = np.flatnonzero(np.asarray(sums != 0, dtype=bool))
    return tuple(c[starts][nonzero] for c in cols), sums[nonzero]


# -- the check -------------------------------------------------------------------------------


class AuditMode(Enum):
    """How much of an epoch's change an audit recomputes."""

    FULL = "full"  # every tuple, by binary joins, whatever it costs
    SAMPLED = "sampled"  # every tuple when the epoch is small, else a sample (the default)


def recompute_change(engine: Engine, query: str, epoch: int) -> Change:
    """Query `query`'s output change at `epoch`, recomputed from the relations' stored state by
    the epoch's delta rules (see the module)."""
    manifest = engine.store.current()
    return _recompute(engine, query, epoch, manifest, _relations(engine, query, epoch, manifest))


def _relations(engine: Engine, query: str, epoch: int, manifest: Manifest) -> dict[str, _Relation]:
    """The relations a query reads around an epoch that can be audited (else `StateError`)."""
    q = engine.queries.get(query)
    if q is None:
        raise QueryError(f"unknown query {query!r}; this engine serves {sorted(engine.queries)}")
    if manifest.epoch is None or not 0 <= epoch <= manifest.epoch:
        held = "no epoch" if manifest.epoch is None else f"epochs up to {manifest.epoch}"
        raise StateError(f"epoch {epoch} of {engine.store.root} cannot be audited: it holds {held}")
    if manifest.frontier is not None and epoch <= manifest.frontier:
        raise StateError(
            f"epoch {epoch} of {engine.store.root} is at or before the compaction frontier "
            f"{manifest.frontier}: its changes are no longer kept apart"
        )
    since = engine.served.since(query)
    if since is not None and epoch < since:
        raise StateError(
            f"query {query!r} was attached to {engine.store.root} at epoch {since}: it has no "
            f"change at epoch {epoch}"
        )
    kind = _Whole if epoch == since else _Relation
    return {
        r: kind(engine, manifest.trace(relation_trace_name(r)), arity, epoch)
        for r, arity in q.relations.items()
    }


def _recompute(
    engine: Engine,
    query: str,
    epoch: int,
    manifest: Manifest,
    relations: dict[str, _Relation],
    budget: int | None = None,
) -> Change:
    q = engine.queries[query]
    rules = _Rules(q, relations, budget)
    ran = [i for i, atom in enumerate(q.atoms) if relations[atom.relation].changed]
    for i in ran:
        rules.run(i)
    columns, weights = _summed(rules.out, len(q.head))
    method = f"{len(ran)} delta rule(s) of {len(q.atoms)} by binary joins"
    for r in sorted(relations):
        reads = sorted(rules.hows.get(r, set())) + sorted(relations[r].notes)
        method += f"; {r}: {', '.join(reads)}" if reads else ""
    if epoch in engine.stale(manifest):
        method += f"; epoch {epoch} is stale (derived from changes corrected since)"
    return Change(columns, weights, rules.joined, method)


def _compare(expected: Block, stored: Block) -> tuple[int, list[str]]:
    """Two consolidated multisets: how many tuples differ, and the first few named.

    >>> _compare(([np.array([1, 2])], np.array([1, 1])), ([np.array([2, 3])], np.array([1, -1])))
    (2, ['(1,): expected 1, stored 0', '(3,): expected 0, stored -1'])
    """
    (e_cols, e_w), (s_cols, s_w) = expected, stored
    kind = object if e_w.dtype == object or s_w.dtype == object else I64
    n = len(e_w)
    cols = [np.concatenate([e, s]) for e, s in zip(e_cols, s_cols, strict=True)]
    cols, index, starts = _groups(cols, np.arange(n + len(s_w)))
    # Each side is consolidated: a run of equal tuples holds at most one of each side.
    mine = np.concatenate([e_w.astype(kind), np.zeros(len(s_w), kind)])[index]
    theirs = np.concatenate([np.zeros(n, kind), s_w.astype(kind)])[index]
    e = np.add.reduceat(mine, starts) if len(starts) else mine
    s = np.add.reduceat(theirs, starts) if len(starts) else theirs
    differ = np.flatnonzero(np.asarray(e != s, dtype=bool))
    examples = [
        f"{tuple(int(c[starts[g]]) for c in cols)}: expected {e[g]}, stored {s[g]}"
        for g in differ[:EXAMPLES].tolist()
    ]
    return len(differ), examples
