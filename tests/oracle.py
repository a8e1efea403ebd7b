"""The tests' oracle: conjunctive queries over in-memory multisets in pure Python, the relations
epoch by epoch, and a state's traces read back — what every engine result is checked against.

No Spark and no engine code in the evaluation: it is written to be obviously right first and
only then reasonably fast. (It lived in the product as ``wcoj_core/naive.py``; only the tests
used it. The product's own checks — `wcoj_core.audit`, `wcoj_core.reference` — are independent
evaluations of their own, sized for real data.)

**Evaluation** (`naive_eval`). A relation is a mapping from tuples to signed integer
multiplicities; tuples with multiplicity zero are ignored, and a relation the query uses but
that is absent counts as empty. Evaluation has exact bag semantics: the multiplicity of a head
tuple is the sum, over every binding of the body variables that matches every atom (constants
equal, repeated variables equal) and passes every filter, of the product of the multiplicities
of the matched tuples -- one factor per atom, so a relation used twice contributes two factors.
Results that sum to zero are dropped. An aggregate head (``count()``, ``sum(x)``) groups by
the head's variables: ``count()`` is exactly that sum of products, ``sum(x)`` the same sum with
each product times the binding's ``x``. The search backtracks over the atoms in body order. Each
atom is looked up through a hash index on the positions already bound when it is reached (built
on first use), and each filter is checked as soon as its last variable is bound.

**Epochs** (`fold_epoch`, `Oracle`): a relation after an epoch of landed changes, as a set or a
bag, and an undirected relation read in both directions without self-loops, as the engine
reads them. **Arrangements** (`naive_counts`): what a counts arrangement holds. **Stored
traces** (`stored`): a state's trace summed from its batches, as the engine wrote them.

>>> from wcoj_core.query.parse import parse_query
>>> q = parse_query("p(a, c) :- e(a, b), e(b, c)")
>>> naive_eval(q, {"e": {(1, 2): 2, (2, 3): 3, (2, 4): -1}})
Counter({(1, 3): 6, (1, 4): -2})
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wcoj_core.errors import QueryError
from wcoj_core.meaning import Meaning, RelationSpec
from wcoj_core.query.ir import Const, Query, Term, Var
from wcoj_core.query.plan import Arrangement

if TYPE_CHECKING:
    from wcoj_core.engine import Engine

Relations = Mapping[str, Mapping[tuple[int, ...], int]]
_Bucket = list[tuple[tuple[int, ...], int]]


@dataclass(frozen=True, slots=True)
class _Step:
    """How to match one atom: which slots form the lookup key, which slots the match fills."""

    relation: str
    key_positions: tuple[int, ...]  # atom positions already bound when the atom is reached
    key_slots: tuple[int, ...]  # the slot holding each of those positions' values
    assign: tuple[tuple[int, int], ...]  # (position, slot) for the variables this atom binds
    repeats: tuple[tuple[int, int], ...]  # (position, earlier position) of a repeated new variable
    filters: tuple[Callable[[list[int]], bool], ...]  # checks whose last variable this atom binds


class _Index:
    """A relation's nonzero tuples, with hash indexes on position subsets built on demand."""

    def __init__(self, name: str, arity: int, tuples: Mapping[tuple[int, ...], int]) -> None:
        self.rows: _Bucket = []
        for row, mult in tuples.items():
            if mult == 0:
                continue
            if len(row) != arity:
                raise QueryError(
                    f"relation {name!r} holds the tuple {row!r} of arity {len(row)}, but the "
                    f"query uses {name!r} with arity {arity}"
                )
            self.rows.append((tuple(row), mult))
        self.by_positions: dict[tuple[int, ...], dict[tuple[int, ...], _Bucket]] = {}

    def lookup(self, positions: tuple[int, ...]) -> dict[tuple[int, ...], _Bucket]:
        """The rows grouped by their values at `positions` (built the first time it is asked)."""
        if positions not in self.by_positions:
            index: dict[tuple[int, ...], _Bucket] = {}
            for row, mult in self.rows:
                index.setdefault(tuple(row[p] for p in positions), []).append((row, mult))
            self.by_positions[positions] = index
        return self.by_positions[positions]


def naive_eval(query: Query, relations: Relations) -> Counter[tuple[int, ...]]:
    """Evaluate `query` over `relations` with exact signed bag semantics.

    >>> from wcoj_core.query.parse import parse_query
    >>> q = parse_query("p(a) :- e(a, a), f(7, a), a > 0")
    >>> naive_eval(q, {"e": {(1, 1): 2, (2, 2): 1, (1, 2): 5, (0, 0): 1}, "f": {(7, 1): -3}})
    Counter({(1,): -6})
    """
    # Every variable and every constant gets a slot in one value array, so that lookup keys and
    # filters read their operands the same way.
    slots: dict[Term, int] = {}
    values: list[int] = []
    for v in query.vars:
        slots[v] = len(values)
        values.append(0)
    for atom in query.atoms:
        for t in atom.terms:
            if isinstance(t, Const) and t not in slots:
                slots[t] = len(values)
                values.append(t.value)
    for f in query.filters:
        for t in (f.left, f.right):
            if isinstance(t, Const) and t not in slots:
                slots[t] = len(values)
                values.append(t.value)

    indexes = {
        name: _Index(name, arity, relations.get(name, {}))
        for name, arity in query.relations.items()
    }
    steps = _plan_steps(query, slots)
    lookups: list[dict[tuple[int, ...], _Bucket] | None] = [None] * len(steps)
    head_slots = tuple(slots[v] for v in query.head)
    agg = query.aggregate
    summed = None if agg is None or agg.var is None else slots[agg.var]
    out: Counter[tuple[int, ...]] = Counter()

    def visit(depth: int, weight: int) -> None:
        if depth == len(steps):
            times = 1 if summed is None else values[summed]
            out[tuple(values[s] for s in head_slots)] += weight * times
            return
        step = steps[depth]
        lookup = lookups[depth]
        if lookup is None:
            lookup = lookups[depth] = indexes[step.relation].lookup(step.key_positions)
        bucket = lookup.get(tuple(values[s] for s in step.key_slots))
        if not bucket:
            return
        for row, mult in bucket:
            if any(row[p] != row[q] for p, q in step.repeats):
                continue
            for p, s in step.assign:
                values[s] = row[p]
            if all(check(values) for check in step.filters):
                visit(depth + 1, weight * mult)

    visit(0, 1)
    return Counter({row: m for row, m in out.items() if m != 0})


def _plan_steps(query: Query, slots: Mapping[Term, int]) -> list[_Step]:
    """One `_Step` per atom, in body order."""
    bound: set[Var] = set()
    pending = list(query.filters)
    steps: list[_Step] = []
    for atom in query.atoms:
        key_positions: list[int] = []
        assign: list[tuple[int, int]] = []
        repeats: list[tuple[int, int]] = []
        first_position: dict[Var, int] = {}
        for p, t in enumerate(atom.terms):
            if isinstance(t, Const) or t in bound:
                key_positions.append(p)
            elif t in first_position:
                repeats.append((p, first_position[t]))
            else:
                first_position[t] = p
                assign.append((p, slots[t]))
        bound.update(first_position)
        ready = [f for f in pending if f.vars <= bound]
        pending = [f for f in pending if not f.vars <= bound]
        steps.append(
            _Step(
                relation=atom.relation,
                key_positions=tuple(key_positions),
                key_slots=tuple(slots[atom.terms[p]] for p in key_positions),
                assign=tuple(assign),
                repeats=tuple(repeats),
                filters=tuple(
                    _compile_check(f.op.fn, slots[f.left], slots[f.right]) for f in ready
                ),
            )
        )
    return steps


def _compile_check(
    fn: Callable[[int, int], bool], left: int, right: int
) -> Callable[[list[int]], bool]:
    """A filter as a function of the value array."""
    return lambda values: fn(values[left], values[right])


def naive_delta(query: Query, before: Relations, after: Relations) -> Counter[tuple[int, ...]]:
    """The signed change of the query's output from `before` to `after` (zeros dropped).

    >>> from wcoj_core.query.parse import parse_query
    >>> q = parse_query("p(a) :- e(a)")
    >>> naive_delta(q, {"e": {(1,): 1, (2,): 1}}, {"e": {(2,): 3, (3,): 1}})
    Counter({(2,): 2, (3,): 1, (1,): -1})
    """
    return signed_difference(naive_eval(query, after), naive_eval(query, before))


def signed_difference(after: Mapping, before: Mapping) -> Counter:
    """``after - before`` as a signed multiset (zeros dropped).

    >>> signed_difference({(1,): 2, (2,): 1}, {(2,): 1, (3,): 1})
    Counter({(1,): 2, (3,): -1})
    """
    diff: Counter = Counter()
    for k in after.keys() | before.keys():
        d = after.get(k, 0) - before.get(k, 0)
        if d:
            diff[k] = d
    return diff


def accumulate(
    updates: Iterable[tuple[tuple[int, ...], int, int]], time: int, strict: bool = False
) -> Counter[tuple[int, ...]]:
    """Sum the diffs of ``(data, time, diff)`` updates at or before `time` (before it if `strict`).

    >>> ups = [((1, 2), 0, 1), ((1, 2), 1, -1), ((3, 4), 1, 2), ((5, 6), 2, 1)]
    >>> accumulate(ups, 1)
    Counter({(3, 4): 2})
    >>> accumulate(ups, 1, strict=True)
    Counter({(1, 2): 1})
    """
    total: Counter[tuple[int, ...]] = Counter()
    for data, t, diff in updates:
        if t < time or (t == time and not strict):
            total[data] += diff
    return Counter({data: d for data, d in total.items() if d != 0})


def fold_epoch(
    before: Mapping[tuple[int, ...], int],
    landed: Iterable[tuple[tuple[int, ...], int]],
    *,
    as_set: bool,
) -> Counter[tuple[int, ...]]:
    """A relation after one epoch of landed ``(tuple, diff)`` changes, from its state `before`.

    A bag adds each diff. A set takes, per tuple, the sum of the epoch's diffs: positive means
    present afterwards, negative absent, zero unchanged (so landing a tuple twice is landing it
    once, and deleting an absent tuple or inserting a present one changes nothing).

    >>> fold_epoch({(1,): 1}, [((1,), 1), ((2,), 1), ((2,), 1), ((3,), -1)], as_set=True)
    Counter({(1,): 1, (2,): 1})
    >>> fold_epoch({(1,): 1}, [((1,), 1), ((3,), -1)], as_set=False)
    Counter({(1,): 2, (3,): -1})
    """
    sums: Counter[tuple[int, ...]] = Counter()
    for data, diff in landed:
        sums[data] += diff
    after: Counter[tuple[int, ...]] = Counter({k: v for k, v in before.items() if v})
    for data, s in sums.items():
        if as_set:
            if s > 0:
                after[data] = 1
            elif s < 0:
                after.pop(data, None)
        else:
            after[data] += s
    return Counter({k: v for k, v in after.items() if v})


Ups = list[tuple[tuple[int, ...], int]]


class Oracle:
    """The relations epoch by epoch, folded as sets or bags (undirected ones read in both
    directions, self-loops dropped), and the query over them."""

    def __init__(self, query: Query, specs: Mapping[str, RelationSpec]) -> None:
        self.query = query
        self.specs = specs
        self.history: list[dict[str, Counter]] = []  # state after each epoch
        self.landed: list[Mapping[str, Ups]] = []

    def state(self, t: int) -> dict[str, Counter]:
        if t < 0:
            return {rel: Counter() for rel in self.specs}
        return self.history[t]

    def land(self, t: int, changes: Mapping[str, Ups]) -> None:
        """Set (or replace) epoch t's landed changes, and fold every epoch from t on again."""
        while len(self.landed) <= t:
            self.landed.append({})
        self.landed[t] = changes
        self.history = self.history[:t]
        for k in range(t, len(self.landed)):
            before = self.state(k - 1)
            after = {}
            for rel, spec in self.specs.items():
                ups = list(self.landed[k].get(rel, []))
                if spec.undirected:
                    ups = [x for (a, b), d in ups if a != b for x in (((a, b), d), ((b, a), d))]
                after[rel] = fold_epoch(before[rel], ups, as_set=spec.meaning is Meaning.SET)
            self.history.append(after)

    def output(self, t: int) -> Counter:
        return naive_eval(self.query, self.state(t))

    def change(self, t: int) -> Counter:
        return signed_difference(self.output(t), self.output(t - 1))


def naive_counts(a: Arrangement, tuples: Mapping[tuple[int, ...], int]) -> Counter:
    """counts[key] of a view, from the relation's tuples: distinct view tuples per key."""
    seen: set[tuple[int, ...]] = set()
    for tup, d in tuples.items():
        if d == 0:
            continue
        first: dict[int, int] = {}
        ok = True
        for col, p in enumerate(a.view.pattern):
            if isinstance(p, Const):
                ok &= tup[col] == p.value
            elif p in first:
                ok &= tup[col] == tup[first[p]]
            else:
                first[p] = col
        if ok:
            seen.add(tuple(tup[first[j]] for j in range(a.view.arity)))
    return Counter(tuple(v[k] for k in a.key) for v in seen)


def stored(engine: Engine, name: str, time: int | None = None) -> Counter[tuple[int, ...]]:
    """A trace's batches up to `time` (all of them for None), summed: read with pyarrow, their
    digests checked."""
    trace = engine.store.current().trace(name)
    total: Counter[tuple[int, ...]] = Counter()
    for b in trace.batches if trace is not None else ():
        if time is None or b.time <= time:
            layer = engine.read_batch(trace, b)
            for row, d in zip(layer.rows.tolist(), layer.diff.tolist(), strict=True):
                total[tuple(row)] += d
    return Counter({k: v for k, v in total.items() if v})
