"""The default per-epoch check: an epoch's output change recomputed from its input changes.

`audit_epoch(engine, query, epoch)` recomputes query `query`'s output change at `epoch` from
the relations' stored state and compares it, as an exact multiset, with the change the engine
stored (the ``out/<query>`` batch at the epoch, its files checked against their digests). The
`Audit` says whether they agree, how many tuples differ (with a few named), how many rows the
check's joins produced, what it read and how long it took.

**Why it is independent of the kernel.** Nothing here runs the kernel's GenericJoin, its layer
searches or the planner's rules: the check evaluates the epoch's *delta rules* by plain binary
joins — one atom at a time, every variable of the atom bound at once — over sorted arrays it
searches with `numpy.searchsorted` and a vectorised bisection of its own. What the two share is
the stored data: the relations' batches (the source of truth) and their persisted index segments
(sorted copies of them, checked by size, header and stamp when mapped).

**Why its cost follows the epoch's change, not the graph.** The change of a conjunctive query
from the old state to the new one telescopes over its atoms::

    Q(new) - Q(old) = sum_i  new_1 ... new_{i-1}  dR_i  old_{i+1} ... old_n

(atom ``i`` reads the relation's change ``dR_i`` at the epoch, the atoms before it the new state,
time <= t, the atoms after it the old state, time < t). Rule ``i`` starts from ``dR_i`` — the
relation's stored batch at the epoch — and is empty when that relation did not change. Each next
atom is then joined by *fetching only the tuples that match the keys bound so far* (a semi-join
by key) from sorted sources: a relation's index segments ordered by a bound column (the identity
view's ``(c0, c1, ..)``, its reverse ``(c1, c0)`` when the plans read one, or a view segment of
the atom's own constants and repeated variables), plus the batches the index lacks or holds
beyond the epoch (read from Parquet, signed, sorted here). Old and new states are sums of such
sources; joins are linear in each input, so the sources are joined one by one and never merged,
and a whole relation is never materialized. Only when no sorted order starts with a bound column
is a relation scanned whole from its batches — `Audit.method` says so.

**Join order.** At each step the atom joined next is, among those sharing a bound term, the one
with the fewest matching tuples for the current bindings, counted exactly from the searched
ranges (narrowed by the filters that bound the atom's next column). The count is known per
binding, so when bindings disagree — some hang off a hub on one side, others on the other — they
are split by their cheapest atom and each group goes on with its own order: joins distribute
over a union, so the sum is unchanged, and a hub never makes a quadratic pile that another order
avoids. The joins produce every binding of the rule; filters apply as soon as their variables are
bound; the head projects (repeated head variables included) and equal tuples are summed.

**Exact arithmetic.** A binding's weight is the product of its atoms' multiplicities, as in
`wcoj_core.naive`: int64 while a bound on the magnitudes proves it fits, Python ints (object
arrays) otherwise — never a wrapped value. Sets, bags and negative multiplicities need nothing
special: the stored multiplicities are what the query reads.

What the check cannot see: anything both sides read alike — a relation batch that is itself
wrong (a wrong set effect of the landed changes), an index segment that disagrees with the
batches it was built from (a periodic full recompute from the batches, `matches_binary_join`,
or `wcoj verify` catches those), the output's accumulated trace, figures and index (only the
change at the epoch is checked), and the counts arrangements.
"""

from __future__ import annotations

import time as clock
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from wcoj_core import segments
from wcoj_core.errors import DamagedFile, QueryError, StateError
from wcoj_core.query.ir import Atom, CmpOp, Const, Filter, Query, Term, Var
from wcoj_core.store.manifest import Batch, Segment, Trace
from wcoj_core.traces import output_trace_name, relation_trace_name

if TYPE_CHECKING:
    from wcoj_core.engine import Engine

I64 = np.int64
LIMIT = 1 << 63  # |value| below this fits in int64
EXAMPLES = 5  # mismatching tuples named in an audit
SPLIT = 2.0  # split bindings by their cheapest atom when that cuts the rows by this factor

__all__ = ["Audit", "Change", "audit_epoch", "recompute_change"]


@dataclass(frozen=True, slots=True)
class Audit:
    """The outcome of a check of one query's output change at one epoch.

    `examples` name the first mismatching tuples ("(1, 2, 3): expected 1, stored 0");
    `expected_rows` and `actual_rows` count the recomputed and the stored change's tuples;
    `joined_rows` the rows the check's joins produced; `method` what it read.
    """

    passed: bool
    mismatches: int
    examples: list[str]
    expected_rows: int
    actual_rows: int
    joined_rows: int
    seconds: float
    method: str


@dataclass(frozen=True, slots=True)
class Change:
    """A recomputed output change: one array per head column, the tuples' multiplicities
    (int64, or Python ints when one leaves int64), consolidated (each tuple once, no zero)."""

    columns: tuple[np.ndarray, ...]
    weights: np.ndarray
    joined_rows: int
    method: str

    def as_dict(self) -> dict[tuple[int, ...], int]:
        """The change as ``{tuple: multiplicity}`` in Python ints."""
        rows = zip(*(c.tolist() for c in self.columns), strict=True) if self.columns else None
        if rows is None:
            return {(): int(w) for w in self.weights.tolist()}
        return {tuple(r): int(w) for r, w in zip(rows, self.weights.tolist(), strict=True)}


class _Side(Enum):
    """Which state of a relation an atom reads."""

    OLD = "old"  # time < t
    NEW = "new"  # time <= t
    DELTA = "delta"  # the change at t


# -- exact weights ---------------------------------------------------------------------------


def _magnitude(a: np.ndarray) -> int:
    """The largest ``|value|`` as a Python int (0 for none).

    >>> _magnitude(np.array([3, -(2**63)], dtype=np.int64)) == 2**63
    True
    """
    if a.size == 0:
        return 0
    return max(int(a.max()), -int(a.min()))


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
    if a.dtype != object and a.size and int(a.min()) == -LIMIT:
        return -(a.astype(object))
    return -a


def _sums(w: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums of the runs of `w` beginning at `starts`, exactly."""
    if w.dtype != object and len(w) * _magnitude(w) >= LIMIT:
        w = w.astype(object)
    return np.add.reduceat(w, starts)


# -- sorted sources and searches -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Source:
    """Rows sorted lexicographically (a column each, in a path's order) with their signed
    multiplicities: a mapped index segment, or batches read and sorted here."""

    cols: tuple[np.ndarray, ...]
    diff: np.ndarray
    sign: int = 1

    def __len__(self) -> int:
        return len(self.diff)


def _bisect(
    col: np.ndarray, lo: np.ndarray, hi: np.ndarray, v: np.ndarray, right: bool
) -> np.ndarray:
    """Per key ``i``, the first position in ``[lo[i], hi[i])`` of sorted `col` holding a value
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
        got = col[mid]
        go = got <= v[live] if right else got < v[live]
        a = np.where(go, mid + 1, a)
        b = np.where(go, b, mid)
        lo[live], hi[live] = a, b
        live = live[a < b]
    return lo


def _search(
    col: np.ndarray, lo: np.ndarray, hi: np.ndarray, v: np.ndarray, right: bool, whole: bool
) -> np.ndarray:
    """`_bisect`, or one `numpy.searchsorted` when every range is the whole column."""
    if whole:
        return np.searchsorted(col, v, "right" if right else "left").astype(I64, copy=False)
    return _bisect(col, lo, hi, v, right)


@dataclass(frozen=True, slots=True)
class _Bound:
    """A bound on the next column from a filter: ``col > v``, ``col >= v``, ``col < v`` ..."""

    values: np.ndarray
    lower: bool
    strict: bool


def _ranges(
    src: _Source, keys: Sequence[np.ndarray], bounds: Sequence[_Bound], m: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per binding, the range of `src`'s rows whose first columns equal `keys` and whose next
    column passes `bounds`."""
    lo = np.zeros(m, dtype=I64)
    hi = np.full(m, len(src), dtype=I64)
    if len(src) == 0:
        return lo, lo.copy()
    for k, key in enumerate(keys):
        col = src.cols[k]
        lo = _search(col, lo, hi, key, False, k == 0)
        hi = _search(col, lo, hi, key, True, k == 0)
    col_at = len(keys)
    for b in bounds:
        col = src.cols[col_at]
        if b.lower:
            lo = _search(col, lo, hi, b.values, b.strict, col_at == 0)
        else:
            hi = np.maximum(_search(col, lo, hi, b.values, not b.strict, col_at == 0), lo)
    return lo, np.maximum(hi, lo)


def _sorted(cols: list[np.ndarray], diff: np.ndarray) -> _Source:
    """Rows given as columns, sorted lexicographically (equal rows kept: sums are linear)."""
    if cols and len(diff) > 1:
        order = np.lexsort(tuple(reversed(cols)))
        cols, diff = [c[order] for c in cols], diff[order]
    return _Source(tuple(np.ascontiguousarray(c) for c in cols), diff)


# -- how an atom reads a relation -------------------------------------------------------------

# An index key: the view pattern (None: the relation as stored) and the column order.
_Key = tuple[tuple[int | Const, ...] | None, tuple[int, ...]]


def _pattern(atom: Atom) -> tuple[int | Const, ...]:
    """The atom's view pattern as the index stores it: per column, the index of its variable
    among the atom's distinct variables, or its constant.

    >>> _pattern(Atom("e", (Var("x"), Const(3), Var("x"), Var("y"))))
    (0, Const(value=3), 0, 1)
    """
    seen: dict[Var, int] = {}
    return tuple(t if isinstance(t, Const) else seen.setdefault(t, len(seen)) for t in atom.terms)


def _view_rows(
    rows: list[np.ndarray], pattern: tuple[int | Const, ...] | None
) -> tuple[list[np.ndarray], np.ndarray | None]:
    """Relation columns through a view pattern: its columns, and which rows it keeps."""
    if pattern is None:
        return rows, None
    keep = np.ones(len(rows[0]) if rows else 0, dtype=bool)
    first: dict[int, int] = {}
    for col, p in enumerate(pattern):
        if isinstance(p, Const):
            keep &= rows[col] == p.value
        elif p in first:
            keep &= rows[col] == rows[first[p]]
        else:
            first[p] = col
    return [rows[first[j]][keep] for j in range(len(first))], keep


@dataclass(frozen=True, slots=True)
class _Path:
    """Sources whose stored column ``k`` holds the atom's term ``terms[k]``; `how` names them."""

    terms: tuple[Term, ...]
    sources: tuple[_Source, ...]
    how: str


class _Relation:
    """A relation's stored state around an epoch: its change, and sorted sources for its old
    and new states (index segments plus the batches the index lacks, or its batches alone)."""

    def __init__(self, engine: Engine, trace: Trace | None, arity: int, epoch: int) -> None:
        self.engine = engine
        self.trace = trace
        self.arity = arity
        self.epoch = epoch
        self.batches: tuple[Batch, ...] = trace.batches if trace is not None else ()
        index = trace.index if trace is not None else None
        self.index = index if index is not None and index.segments and engine.local else None
        self.keys: dict[_Key, list[Segment]] = {}
        for s in self.index.segments if self.index is not None else ():
            self.keys.setdefault((s.view, tuple(s.order)), []).append(s)
        self.notes: set[str] = set()
        self._read: dict[str, list[np.ndarray]] = {}
        self._diffs: dict[str, np.ndarray] = {}
        self._mapped: dict[_Key, tuple[_Source, ...]] = {}
        self._memory: dict[tuple[_Side, bool, _Key], _Source] = {}

    @property
    def changed(self) -> bool:
        return any(b.time == self.epoch and b.rows for b in self.batches)

    def rows(self) -> int:
        return sum(b.rows for b in self.batches if b.time <= self.epoch)

    def _batch(self, b: Batch) -> tuple[list[np.ndarray], np.ndarray]:
        if b.path not in self._read:
            assert self.trace is not None
            layer = self.engine.read_batch(self.trace, b)
            rows = np.asarray(layer.rows)
            self._read[b.path] = [np.ascontiguousarray(rows[:, j]) for j in range(self.arity)]
            self._diffs[b.path] = np.asarray(layer.diff)
        return self._read[b.path], self._diffs[b.path]

    def _signed_batches(self, side: _Side, scan: bool) -> list[tuple[Batch, int]]:
        """The batches to add (+1) or subtract (-1): beyond the index, or all of them (`scan`)."""
        t = self.epoch
        if side is _Side.DELTA:
            return [(b, 1) for b in self.batches if b.time == t]
        upto = (lambda b: b.time <= t) if side is _Side.NEW else (lambda b: b.time < t)
        if scan or self.index is None:
            return [(b, 1) for b in self.batches if upto(b)]
        covered = self.index.time
        out = [(b, 1) for b in self.batches if b.time > covered and upto(b)]
        return out + [(b, -1) for b in self.batches if b.time <= covered and not upto(b)]

    def memory(self, side: _Side, key: _Key, scan: bool = False) -> _Source | None:
        """The batches of `side` beyond the index (or all, `scan`) through `key`, sorted here."""
        found = (side, scan, key)
        if found not in self._memory:
            pattern, order = key
            cols: list[list[np.ndarray]] = [[] for _ in order]
            diffs: list[np.ndarray] = []
            for b, sign in self._signed_batches(side, scan):
                if not b.rows:
                    continue
                rows, diff = self._batch(b)
                view, keep = _view_rows(rows, pattern)
                for k, j in enumerate(order):
                    cols[k].append(view[j])
                d = diff if keep is None else diff[keep]
                diffs.append(d if sign > 0 else _negated(d))
            if not diffs or not sum(len(d) for d in diffs):
                self._memory[found] = _Source(
                    tuple(np.zeros(0, I64) for _ in order), np.zeros(0, I64)
                )
            else:
                obj = any(d.dtype == object for d in diffs)
                diff = np.concatenate([d.astype(object) if obj else d for d in diffs])
                self._memory[found] = _sorted([np.concatenate(c) for c in cols], diff)
        src = self._memory[found]
        return src if len(src) else None

    def mapped(self, key: _Key) -> tuple[_Source, ...] | None:
        """The index segments of `key`, mapped (None: a segment file is damaged)."""
        if key not in self._mapped:
            out: list[_Source] = []
            try:
                for s in self.keys[key]:
                    if s.rows:
                        layer = segments.open_segment(self.engine.store.root, s)
                        rows = np.asarray(layer.rows)
                        out.append(
                            _Source(
                                tuple(rows[:, k] for k in range(rows.shape[1])),
                                np.asarray(layer.diff),
                            )
                        )
            except DamagedFile as e:
                self.notes.add(f"segments damaged ({e.path}): scanned its batches")
                self.index = None
                return None
            self._mapped[key] = tuple(out)
        return self._mapped[key]

    def path(self, atom: Atom, side: _Side, bound: set[Var]) -> _Path | None:
        """The best sorted path for `atom` given the bound variables: the one whose leading
        columns are bound the furthest; None when only a scan of the batches would do."""
        identity = tuple(range(self.arity))
        if side is _Side.DELTA:
            src = self.memory(side, (None, identity))
            return _Path(atom.terms, (src,) if src is not None else (), "change")
        if self.index is None:
            return None
        pattern, distinct = _pattern(atom), atom.vars
        best: tuple[int, _Key, tuple[Term, ...]] | None = None
        for key in self.keys:
            view, order = key
            if view is None:
                terms = tuple(atom.terms[j] for j in order)
            elif view == pattern:
                terms = tuple(distinct[j] for j in order)
            else:
                continue
            lead = _prefix(terms, bound)
            if (
                best is None
                or lead > best[0]
                or (lead == best[0] and view is not None and best[1][0] is None)
            ):
                best = (lead, key, terms)
        if best is None:
            return None
        lead, key, terms = best
        if lead == 0 and any(isinstance(t, Const) or t in bound for t in atom.terms):
            return None  # bound columns, none leading: a scan does better than every row
        mapped = self.mapped(key)
        if mapped is None:
            return None
        extra = self.memory(side, key)
        view, order = key
        cols = ",".join(f"c{j}" for j in order)
        how = (
            f"segments ({cols})"
            if view is None
            else f"view segments {_pattern_text(view)} ({cols})"
        )
        return _Path(terms, (*mapped, *((extra,) if extra is not None else ())), how)

    def scan(self, atom: Atom, side: _Side, bound: set[Var]) -> _Path:
        """The relation's batches of `side` read whole, sorted with the bound columns first."""
        fixed = [j for j, t in enumerate(atom.terms) if isinstance(t, Const) or t in bound]
        order = tuple(fixed + [j for j in range(self.arity) if j not in fixed])
        src = self.memory(side, (None, order), scan=True)
        cols = ",".join(f"c{j}" for j in order)
        self.notes.add(f"scanned its batches (no segment sorted by c{fixed[0] if fixed else 0})")
        return _Path(
            tuple(atom.terms[j] for j in order),
            (src,) if src is not None else (),
            f"batches ({cols})",
        )


def _pattern_text(view: tuple[int | Const, ...]) -> str:
    return "[" + ", ".join(str(p.value) if isinstance(p, Const) else f"v{p}" for p in view) + "]"


def _prefix(terms: Sequence[Term], bound: set[Var]) -> int:
    """How many leading terms are constants or bound variables.

    >>> _prefix((Const(1), Var("a"), Var("b")), {Var("a")})
    2
    """
    n = 0
    for t in terms:
        if not (isinstance(t, Const) or t in bound):
            break
        n += 1
    return n


# -- bindings and joins ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Bindings:
    """Partial bindings of a rule's variables: a column per bound variable, and weights."""

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
    """An atom's path searched for the current bindings: per source, each binding's range."""

    atom: int
    path: _Path
    lead: int
    ranges: tuple[tuple[np.ndarray, np.ndarray], ...]
    m: int

    def sizes(self) -> np.ndarray:
        """Per binding, the rows its ranges hold over every source."""
        total = np.zeros(self.m, dtype=I64)
        for lo, hi in self.ranges:
            total += hi - lo
        return total

    def taking(self, picked: np.ndarray) -> _Probe:
        ranges = tuple((lo[picked], hi[picked]) for lo, hi in self.ranges)
        return _Probe(self.atom, self.path, self.lead, ranges, len(picked))


_LOWER = {CmpOp.GT: True, CmpOp.GE: True, CmpOp.LT: False, CmpOp.LE: False}


def _bounds(var: Var, filters: Iterable[Filter], b: _Bindings) -> list[_Bound]:
    """The bounds the filters put on `var` given the bound variables (and constants)."""
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
            out += [_Bound(values, True, False), _Bound(values, False, False)]
        elif op in _LOWER:
            out.append(_Bound(values, _LOWER[op], op in (CmpOp.GT, CmpOp.LT)))
    return out


def _probe(atom_index: int, path: _Path, b: _Bindings, filters: Sequence[Filter]) -> _Probe:
    lead = _prefix(path.terms, set(b.values))
    keys = [b.value(t) for t in path.terms[:lead]]
    bounds: list[_Bound] = []
    if lead < len(path.terms):
        nxt = path.terms[lead]
        if isinstance(nxt, Var):
            bounds = _bounds(nxt, filters, b)
    ranges = tuple(_ranges(src, keys, bounds, len(b)) for src in path.sources)
    return _Probe(atom_index, path, lead, ranges, len(b))


def _positions(lo: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ranges ``[lo, lo + sizes)``, concatenated, and the range each came from.

    >>> pos, owner = _positions(np.array([5, 0, 2]), np.array([2, 0, 3]))
    >>> pos.tolist(), owner.tolist()
    ([5, 6, 2, 3, 4], [0, 0, 2, 2, 2])
    """
    n = int(sizes.sum())
    owner = np.repeat(np.arange(len(sizes), dtype=I64), sizes)
    starts = np.cumsum(sizes) - sizes
    return np.arange(n, dtype=I64) + np.repeat(lo - starts, sizes), owner


def _fetch(b: _Bindings, probe: _Probe) -> _Bindings:
    """The bindings joined with the tuples their ranges hold: the atom's other columns checked
    (constants, bound and repeated variables) or bound, the weights multiplied."""
    terms, lead = probe.path.terms, probe.lead
    owners: list[np.ndarray] = []
    cols: list[list[np.ndarray]] = [[] for _ in terms[lead:]]
    diffs: list[np.ndarray] = []
    for src, (lo, hi) in zip(probe.path.sources, probe.ranges, strict=True):
        sizes = hi - lo
        if not sizes.any():
            continue
        pos, owner = _positions(lo, sizes)
        owners.append(owner)
        for k in range(lead, len(terms)):
            cols[k - lead].append(src.cols[k][pos])
        d = src.diff[pos]
        diffs.append(d if src.sign > 0 else _negated(d))
    if not owners:
        return _Bindings({v: a[:0] for v, a in b.values.items()}, b.weight[:0])
    owner = np.concatenate(owners)
    obj = any(d.dtype == object for d in diffs)
    diff = np.concatenate([d.astype(object) if obj else d for d in diffs])
    keep: np.ndarray | None = None
    fresh: dict[Var, np.ndarray] = {}
    for k, term in enumerate(terms[lead:]):
        got = np.concatenate(cols[k]) if len(cols[k]) > 1 else cols[k][0]
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


# -- one rule, one query ---------------------------------------------------------------------


class _Rules:
    """The delta rules of a query at an epoch, evaluated by binary joins (see the module)."""

    def __init__(self, query: Query, relations: dict[str, _Relation]) -> None:
        self.query = query
        self.relations = relations
        self.joined = 0
        self.hows: dict[str, set[str]] = {}

    def run(self, delta: int) -> list[tuple[list[np.ndarray], np.ndarray]]:
        """Rule `delta`'s bindings projected on the head (unsummed), as blocks."""
        atoms = self.query.atoms
        sides = [
            _Side.DELTA if j == delta else _Side.NEW if j < delta else _Side.OLD
            for j in range(len(atoms))
        ]
        start = _Bindings({}, np.ones(1, dtype=I64))
        rel = self.relations[atoms[delta].relation]
        path = rel.path(atoms[delta], _Side.DELTA, set())
        assert path is not None
        first = self._join(start, _probe(delta, path, start, self.query.filters), [])
        out: list[tuple[list[np.ndarray], np.ndarray]] = []
        self._extend(first[0], first[1], [j for j in range(len(atoms)) if j != delta], sides, out)
        return out

    def _join(
        self, b: _Bindings, probe: _Probe, applied: list[Filter]
    ) -> tuple[_Bindings, list[Filter]]:
        """Join one atom, then apply every filter whose variables are now bound."""
        atom = self.query.atoms[probe.atom]
        self.hows.setdefault(atom.relation, set()).add(probe.path.how)
        b = _fetch(b, probe)
        self.joined += len(b)
        ready = [f for f in self.query.filters if f not in applied and f.vars <= set(b.values)]
        if ready and len(b):
            keep = np.ones(len(b), dtype=bool)
            for f in ready:
                keep &= f.op.fn(b.value(f.left), b.value(f.right))
            b = b.taking(np.flatnonzero(keep))
        return b, applied + ready

    def _extend(
        self,
        b: _Bindings,
        applied: list[Filter],
        remaining: list[int],
        sides: Sequence[_Side],
        out: list[tuple[list[np.ndarray], np.ndarray]],
    ) -> None:
        if not len(b):
            return
        if not remaining:
            out.append(([b.values[v] for v in self.query.head], b.weight))
            return
        bound = set(b.values)
        pending = [f for f in self.query.filters if f not in applied]
        atoms = self.query.atoms
        probes: list[_Probe] = []
        unsearched: list[int] = []
        for j in remaining:
            rel = self.relations[atoms[j].relation]
            path = rel.path(atoms[j], sides[j], bound)
            if path is None:
                unsearched.append(j)
            else:
                probes.append(_probe(j, path, b, pending))
        linked = [p for p in probes if p.lead > 0 or not atoms[p.atom].vars]
        if not linked and unsearched:
            linked_scans = [
                j
                for j in unsearched
                if any(isinstance(t, Const) or t in bound for t in atoms[j].terms)
            ]
            if linked_scans or not probes:
                j = min(
                    linked_scans or unsearched,
                    key=lambda j: self.relations[atoms[j].relation].rows(),
                )
                rel = self.relations[atoms[j].relation]
                linked = [_probe(j, rel.scan(atoms[j], sides[j], bound), b, pending)]
        candidates = linked or probes
        sizes = np.stack([p.sizes() for p in candidates])
        totals = sizes.sum(axis=1)
        best = int(np.argmin(totals))
        cheapest = sizes.min(axis=0)
        if len(candidates) > 1 and int(totals[best]) > SPLIT * int(cheapest.sum()) + len(b):
            # Bindings disagree on their cheapest atom: each group goes on with its own.
            choice = np.argmin(sizes, axis=0)
            for c, probe in enumerate(candidates):
                picked = np.flatnonzero(choice == c)
                if len(picked):
                    self._step(
                        b.taking(picked), probe.taking(picked), applied, remaining, sides, out
                    )
            return
        self._step(b, candidates[best], applied, remaining, sides, out)

    def _step(
        self,
        b: _Bindings,
        probe: _Probe,
        applied: list[Filter],
        remaining: list[int],
        sides: Sequence[_Side],
        out: list[tuple[list[np.ndarray], np.ndarray]],
    ) -> None:
        joined, now = self._join(b, probe, applied)
        self._extend(joined, now, [j for j in remaining if j != probe.atom], sides, out)


def _consolidated(
    blocks: Sequence[tuple[list[np.ndarray], np.ndarray]], width: int
) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Blocks of head tuples and weights, equal tuples summed, zeros dropped, sorted."""
    live = [bl for bl in blocks if len(bl[1])]
    if not live:
        return tuple(np.zeros(0, I64) for _ in range(width)), np.zeros(0, I64)
    obj = any(w.dtype == object for _, w in live)
    w = np.concatenate([x.astype(object) if obj else x for _, x in live])
    cols = [np.concatenate([c[k] for c, _ in live]) for k in range(width)]
    cols, w, starts = _groups(cols, w)
    sums = _sums(w, starts)
    nonzero = np.flatnonzero(sums != 0)
    return tuple(c[starts][nonzero] for c in cols), sums[nonzero]


def _groups(
    cols: list[np.ndarray], w: np.ndarray
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Rows (as columns) sorted, `w` reordered alike, and where each run of equal rows starts.

    >>> cols, w, starts = _groups([np.array([2, 1, 2]), np.array([5, 9, 5])], np.array([1, 2, 3]))
    >>> [c.tolist() for c in cols], w.tolist(), starts.tolist()
    ([[1, 2, 2], [9, 5, 5]], [2, 1, 3], [0, 1])
    """
    if not cols or not len(w):
        return cols, w, np.zeros(1 if len(w) else 0, dtype=I64)
    order = np.lexsort(tuple(reversed(cols)))
    cols = [c[order] for c in cols]
    w = w[order]
    first = np.ones(len(w), dtype=bool)
    if len(w) > 1:
        same = np.ones(len(w) - 1, dtype=bool)
        for c in cols:
            same &= c[1:] == c[:-1]
        first[1:] = ~same
    return cols, w, np.flatnonzero(first)


# -- the check -------------------------------------------------------------------------------


def recompute_change(engine: Engine, query: str, epoch: int) -> Change:
    """Query `query`'s output change at `epoch`, recomputed from the relations' stored state by
    the epoch's delta rules (see the module)."""
    q = engine.queries.get(query)
    if q is None:
        raise QueryError(f"unknown query {query!r}; this engine serves {sorted(engine.queries)}")
    manifest = engine.store.current()
    if manifest.epoch is None or not 0 <= epoch <= manifest.epoch:
        held = "no epoch" if manifest.epoch is None else f"epochs up to {manifest.epoch}"
        raise StateError(f"epoch {epoch} of {engine.store.root} cannot be audited: it holds {held}")
    if manifest.frontier is not None and epoch <= manifest.frontier:
        raise StateError(
            f"epoch {epoch} of {engine.store.root} is at or before the compaction frontier "
            f"{manifest.frontier}: its changes are no longer kept apart"
        )
    relations = {
        r: _Relation(engine, manifest.trace(relation_trace_name(r)), arity, epoch)
        for r, arity in q.relations.items()
    }
    rules = _Rules(q, relations)
    blocks: list[tuple[list[np.ndarray], np.ndarray]] = []
    ran = 0
    for i, atom in enumerate(q.atoms):
        if relations[atom.relation].changed:
            blocks += rules.run(i)
            ran += 1
    columns, weights = _consolidated(blocks, len(q.head))
    reads = "; ".join(
        f"{r}: {', '.join(sorted(rules.hows.get(r, set())) + sorted(relations[r].notes))}"
        for r in sorted(relations)
        if rules.hows.get(r) or relations[r].notes
    )
    method = f"{ran} delta rule(s) of {len(q.atoms)} by binary joins" + (
        f"; {reads}" if reads else ""
    )
    if epoch in engine.stale(manifest):
        method += f"; epoch {epoch} is stale (derived from changes corrected since)"
    return Change(columns, weights, rules.joined, method)


def audit_epoch(engine: Engine, query: str, epoch: int) -> Audit:
    """Check query `query`'s stored output change at `epoch` against its recomputation (see
    the module). A damaged output or relation batch raises `DamagedBatch`."""
    started = clock.perf_counter()
    expected = recompute_change(engine, query, epoch)
    trace = engine.store.current().trace(output_trace_name(query))
    width = len(engine.queries[query].head)
    stored_cols: tuple[np.ndarray, ...] = tuple(np.zeros(0, I64) for _ in range(width))
    stored_w = np.zeros(0, I64)
    for b in trace.batches if trace is not None else ():
        if b.time == epoch and b.rows:
            layer = engine.read_batch(trace, b)
            rows = np.asarray(layer.rows)
            stored_cols = tuple(rows[:, k] for k in range(width))
            stored_w = np.asarray(layer.diff)
    mismatches, examples = _compare(expected.columns, expected.weights, stored_cols, stored_w)
    return Audit(
        passed=mismatches == 0,
        mismatches=mismatches,
        examples=examples,
        expected_rows=len(expected.weights),
        actual_rows=len(stored_w),
        joined_rows=expected.joined_rows,
        seconds=clock.perf_counter() - started,
        method=expected.method,
    )


def _compare(
    exp_cols: Sequence[np.ndarray],
    exp_w: np.ndarray,
    act_cols: Sequence[np.ndarray],
    act_w: np.ndarray,
) -> tuple[int, list[str]]:
    """Two consolidated multisets compared: how many tuples differ, and the first few named.

    >>> _compare([np.array([1, 2])], np.array([1, 1]), [np.array([2, 3])], np.array([1, -1]))
    (2, ['(1,): expected 1, stored 0', '(3,): expected 0, stored -1'])
    """
    obj = exp_w.dtype == object or act_w.dtype == object
    kind = object if obj else I64
    n_e, n_a = len(exp_w), len(act_w)
    cols = [np.concatenate([e, a]) for e, a in zip(exp_cols, act_cols, strict=True)]
    both = np.concatenate([exp_w.astype(kind), np.zeros(n_a, kind)])
    side = np.concatenate([np.zeros(n_e, kind), act_w.astype(kind)])
    index = np.arange(n_e + n_a)
    cols, index, starts = _groups(cols, index)
    # Each side is consolidated: a group holds at most one tuple of each.
    e = np.add.reduceat(both[index], starts) if len(starts) else both[:0]
    a = np.add.reduceat(side[index], starts) if len(starts) else side[:0]
    differ = np.flatnonzero(np.asarray(e != a, dtype=bool))
    examples = [
        f"{tuple(int(c[starts[g]]) for c in cols)}: expected {e[g]}, stored {a[g]}"
        for g in differ[:EXAMPLES].tolist()
    ]
    return len(differ), examples
