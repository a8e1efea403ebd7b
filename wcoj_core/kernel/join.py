"""One delta rule, attribute at a time: count, pick the fewest, propose, validate.

A rule starts from the changed tuples of its delta atom (`EpochLayers.delta`), multiplies in the
atoms they bind completely (`DeltaRule.checks`), then binds one variable per `Step`:

1. **count** — every extender looks its key up in its counts arrangement: how many candidates
   it has for each prefix (a prefix some extender has none for dies here);
2. **pick** — per prefix, the extender with the fewest candidates (ties to the lowest index);
3. **propose** — the winner enumerates its candidates: a key range of its source layer,
   narrowed by the step's order filters (`b < c` never proposes ``c <= b``); a completing
   extender multiplies in each tuple's multiplicity;
4. **validate** — every other extender looks each proposal up: a completing one multiplies in
   the tuple's multiplicity, the others only require the key to be in the atom's support.

Work per prefix is the smallest candidate set, so a hub vertex never makes a quadratic pile of
wedges. Memory is bounded too: the delta is taken `CHUNK_ROWS` tuples at a time, and each step
proposes for consecutive pieces of its prefixes whose counts add up to at most
`PROPOSAL_BUDGET`, descending to the next step piece by piece (depth first). `run_rule` yields
the full bindings in parts as they are made; `RuleTally` adds up what every step did.

Multiplicities are checked, never wrapped (`wcoj_core.kernel.multiplicity`). A binding's weight
is the product of the multiplicities of its atoms, each as of the version the rule reads (the
delta atom's change, the others old or new): a full binding of a delta rule whose exact weight
leaves int64 raises `MultiplicityOverflow` naming it. The weight is multiplied in as the atoms
complete; a partial weight past the range flags its row instead of raising (`Prefixes`), so a
partial binding that dies before completing (not in some atom, filtered out) never raises: what
raises does not depend on the variable order or on which extender proposes. (No factor is 0,
so a flagged row's full weight is past the range too.) Sums raise as they are made: a tuple's
multiplicity over the layers of a trace, and the output change summed over rules and bindings.

Nothing here reads a file, starts a thread or knows Spark: the deployments in
`wcoj_core.deploy` decide where rules run and hand each one its share of the delta.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wcoj_core.errors import MultiplicityOverflow
from wcoj_core.kernel.index import Layers
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import Bound, Layer, find, lookup_bound, lookup_sum_of, present
from wcoj_core.kernel.multiplicity import times
from wcoj_core.query.ir import CmpOp, Filter, Var
from wcoj_core.query.plan import AtomView, DeltaRule, Extender, Plan, Step
from wcoj_core.traces import counts_trace_name, relation_trace_name

# A rule takes its delta tuples this many at a time.
CHUNK_ROWS = 1 << 20
# A step proposes for at most about this many candidates at once (as the counts estimate them;
# a single prefix with more is taken alone): what bounds the memory of a rule.
PROPOSAL_BUDGET = 1 << 23


def _cmp(op: CmpOp, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """An elementwise comparison: `CmpOp.fn` is the `operator` function, which numpy broadcasts."""
    compare: Callable[[Any, Any], Any] = op.fn
    return np.asarray(compare(left, right), dtype=bool)


@dataclass
class Prefixes:
    """Bound variables as columns, and the weight of each row: the product of the
    multiplicities of the atoms bound so far.

    `overflow` flags the rows whose exact weight has left int64 (their `weight` wrapped and
    means nothing); None when no row's has. A flagged row that completes a binding raises
    `MultiplicityOverflow` (`check_overflow`); one that dies before does not. `bound`, when
    known, bounds every ``|weight|``: the next product is then checked with one bound less to
    read. Change weights through `scale` (assigning `weight` directly must reset `bound`).
    """

    cols: dict[Var, np.ndarray]
    weight: np.ndarray
    overflow: np.ndarray | None = None
    bound: int | None = None

    def __len__(self) -> int:
        return len(self.weight)

    def take(self, idx: np.ndarray) -> Prefixes:
        over = self.overflow
        cols = {v: c[idx] for v, c in self.cols.items()}
        return Prefixes(cols, self.weight[idx], None if over is None else over[idx], self.bound)

    def scale(self, factor: np.ndarray, bound: int | None = None) -> None:
        """Multiply each row's weight by its `factor` (multiplicities, `bound` on their
        magnitudes when known), flagging the rows whose exact product leaves int64."""
        self.weight, over, self.bound = times(self.weight, factor, self.bound, bound)
        if over is not None:
            self.overflow = over if self.overflow is None else over | self.overflow

    def where(self, mask: np.ndarray) -> Prefixes:
        # Gathering the kept rows by index is several times cheaper than a boolean mask over
        # each column.
        return self.take(np.flatnonzero(mask))

    def rows(self, vs: Sequence[Var]) -> np.ndarray:
        if not vs:
            return np.zeros((len(self), 0), dtype=I64)
        return np.column_stack([self.cols[v] for v in vs]).astype(I64, copy=False)

    def filtered(self, filters: Sequence[Filter]) -> Prefixes:
        return self.where(_filter_mask(self, filters))


@dataclass
class StepCounts:
    """What one step of a rule did: prefixes counted, the sum of their least counts (the WCOJ
    bound on proposals), candidates proposed, and bindings that passed validation."""

    var: str
    prefixes: int = 0
    min_sum: int = 0
    proposed: int = 0
    validated: int = 0

    def plus(self, other: StepCounts) -> StepCounts:
        """Both parts' counts of the same step."""
        return StepCounts(
            self.var,
            self.prefixes + other.prefixes,
            self.min_sum + other.min_sum,
            self.proposed + other.proposed,
            self.validated + other.validated,
        )


@dataclass
class RuleTally:
    """What a rule did, step by step, and the rows out of every lookup it made (`joins`: the
    analogue of a binary plan's join output rows)."""

    steps: list[StepCounts]
    joins: int = 0

    @classmethod
    def of(cls, rule: DeltaRule) -> RuleTally:
        return cls([StepCounts(s.var.name) for s in rule.steps])

    def plus(self, other: RuleTally) -> RuleTally:
        """Two parts of the same rule (pieces of its delta) together."""
        steps = [a.plus(b) for a, b in zip(self.steps, other.steps, strict=True)]
        return RuleTally(steps, self.joins + other.joins)


def support_source(x: Extender) -> tuple[str, AtomView | None, tuple[int, ...]]:
    """Where extender `x` proposes from: the trace, its view, and the columns (key, value)."""
    if x.completes:
        return relation_trace_name(x.view.relation), x.view, (*x.key, x.value)
    cols = x.support.key  # sorted view columns: key + value
    return counts_trace_name(x.support), None, tuple(cols.index(c) for c in (*x.key, x.value))


def delta_layer(plan: Plan, rule: DeltaRule, layers: Layers) -> Layer:
    """The changed tuples a rule starts from: its delta atom's view of the epoch's changes."""
    view = plan.views[rule.delta]
    return layers.delta(relation_trace_name(view.relation), view, tuple(range(view.arity)))


# Bindings in the making: rows of the prefixes, or only those at the given indices (the rows a
# validation kept, gathered once, when the parts are put together by `concat`).
Part = tuple[Prefixes, np.ndarray | None]


def part_rows(part: Part) -> int:
    return len(part[0]) if part[1] is None else len(part[1])


def run_rule(
    plan: Plan,
    rule: DeltaRule,
    layers: Layers,
    tally: RuleTally,
    rows: tuple[int, int] | None = None,
    *,
    chunk_rows: int = CHUNK_ROWS,
    budget: int = PROPOSAL_BUDGET,
) -> Iterator[Part]:
    """The full bindings of one delta rule, in parts, as they are made (see the module).

    `rows` restricts the rule to the delta tuples at those positions (a deployment's share of
    the work); `tally` is added what every step did.
    """
    d = delta_layer(plan, rule, layers)
    lo, hi = (0, len(d)) if rows is None else rows
    start = plan.atom_vars[rule.delta]
    step = max(chunk_rows, 1)
    for at in range(lo, hi, step):
        part = slice(at, min(at + step, hi))
        cols = {v: d.rows[part, i] for i, v in enumerate(start)}
        prefixes = Prefixes(cols, d.diff[part], None, d.diff_bound())
        prefixes = _checked(plan, rule, prefixes, layers, tally)
        for made in _descend(
            plan, rule, 0, prefixes.filtered(rule.start_filters), layers, tally, budget
        ):
            check_overflow(plan, made)
            yield made


def check_overflow(plan: Plan, part: Part) -> None:
    """Raise `MultiplicityOverflow` when a row of `part` has a weight that left int64, naming
    the first such row's binding (its variables in the query's order).

    `run_rule` checks every full binding it yields; a deployment that carries `Prefixes`
    between steps itself (dropping `Prefixes.overflow`) checks each step's output instead."""
    p, kept = part
    if p.overflow is None:
        return
    bad = np.flatnonzero(p.overflow if kept is None else p.overflow[kept])
    if len(bad) == 0:
        return
    i = int(bad[0]) if kept is None else int(kept[bad[0]])
    order = [v for v in plan.query.vars if v in p.cols]  # the query's order, not the rule's
    names = ", ".join(v.name for v in order)
    what = f"the weight of a binding ({names}) of {plan.query.name}"
    raise MultiplicityOverflow(what, tuple(int(p.cols[v][i]) for v in order))


def _checked(
    plan: Plan, rule: DeltaRule, prefixes: Prefixes, layers: Layers, tally: RuleTally
) -> Prefixes:
    """Multiply in the atoms whose variables the delta tuples bind completely."""
    for c in rule.checks:
        order = tuple(range(c.view.arity))
        held = layers.layers(relation_trace_name(c.view.relation), c.view, order, c.version)
        cols = [prefixes.cols[v] for v in plan.atom_vars[c.atom]]
        m = lookup_sum_of(held, cols, len(prefixes))
        keep = np.flatnonzero(m)
        prefixes = prefixes.take(keep)
        prefixes.scale(m[keep], lookup_bound(held))
        tally.joins += len(prefixes)
    return prefixes


def _descend(
    plan: Plan,
    rule: DeltaRule,
    k: int,
    prefixes: Prefixes,
    layers: Layers,
    tally: RuleTally,
    budget: int,
) -> Iterator[Part]:
    """Steps `k`.. of a rule for some prefixes, piece by piece (see the module)."""
    if k == len(rule.steps):
        yield prefixes, None
        return
    step = rule.steps[k]
    prefixes, n = count(plan, step, prefixes, layers, tally)
    tag, least = pick(n)
    counts = tally.steps[k]
    counts.prefixes += len(prefixes)
    counts.min_sum += int(least.sum())
    names = list(prefixes.cols)
    for piece in pieces(least, budget):
        mine = prefixes if piece is None else prefixes.take(piece)
        parts = extend(plan, step, mine, tag if piece is None else tag[piece], layers, tally, k)
        if k + 1 == len(rule.steps):
            yield from parts
        elif parts:
            yield from _descend(
                plan, rule, k + 1, concat(parts, [*names, step.var]), layers, tally, budget
            )


def count(
    plan: Plan, step: Step, prefixes: Prefixes, layers: Layers, tally: RuleTally
) -> tuple[Prefixes, np.ndarray]:
    """Count: each extender's number of candidates per prefix; the prefixes left with none in
    some extender are dropped. Returns the live prefixes and their counts (extender x prefix)."""
    xs = step.extenders
    n = np.zeros((len(xs), len(prefixes)), dtype=I64)
    alive = np.ones(len(prefixes), dtype=bool)
    for j, x in enumerate(xs):
        n[j] = count_of(plan, x, prefixes, layers)
        alive &= n[j] > 0
        tally.joins += int(alive.sum())
    if not alive.all():
        keep = np.flatnonzero(alive)
        prefixes, n = prefixes.take(keep), n[:, keep]
    return prefixes, n


def count_of(plan: Plan, x: Extender, prefixes: Prefixes, layers: Layers) -> np.ndarray:
    """One extender's number of candidates for each prefix (its counts arrangement's value)."""
    # An empty key is no column: every prefix then reads the one total count.
    return lookup_sum_of(
        layers.layers(counts_trace_name(x.counts), None, tuple(range(len(x.key))), x.version),
        [prefixes.cols[plan.atom_vars[x.atom][k]] for k in x.key],
        len(prefixes),
    )


def pick(n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pick: per prefix, the extender with the fewest candidates (ties to the lowest index)
    and that least count.

    >>> pick(np.array([[3, 1, 2], [2, 5, 2]]))
    (array([1, 0, 0]), array([2, 1, 2]))
    """
    m = n.shape[1]
    tag = np.argmin(n, axis=0) if len(n) > 1 else np.zeros(m, dtype=I64)
    least = n[tag, np.arange(m)] if m else np.zeros(0, dtype=I64)
    return tag, least


def pieces(sizes: np.ndarray, budget: int) -> Iterator[np.ndarray | None]:
    """Consecutive pieces of rows whose `sizes` add up to at most `budget` each (a row above it
    alone); a single None when every row fits in one.

    >>> [p if p is None else p.tolist() for p in pieces(np.array([2, 2, 5, 1]), 4)]
    [[0, 1], [2], [3]]
    """
    total = int(sizes.sum())
    if total <= budget:
        yield None
        return
    ends = np.cumsum(sizes)
    start = 0
    while start < len(sizes):
        base = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, base + budget, "right"))
        stop = max(stop, start + 1)
        yield np.arange(start, stop)
        start = stop


def extend(
    plan: Plan,
    step: Step,
    prefixes: Prefixes,
    tag: np.ndarray,
    layers: Layers,
    tally: RuleTally,
    k: int,
) -> list[Part]:
    """Propose and validate: each extender proposes for the prefixes it won (`tag`), every
    other extender validates; the bindings come out in extender order."""
    xs = step.extenders
    parts: list[Part] = []
    counts = tally.steps[k]
    for j, x in enumerate(xs):
        mine = np.flatnonzero(tag == j) if len(xs) > 1 else None
        got = prefixes if mine is None else prefixes.take(mine)
        if len(got) == 0:
            continue
        source = layers.layers(*support_source(x), x.version)
        checks = [
            (y, layers.layers(*support_source(y), y.version)) for i, y in enumerate(xs) if i != j
        ]
        part, proposed, passed = _extend(plan, step, x, got, source, checks)
        counts.proposed += proposed
        counts.validated += part_rows(part)
        tally.joins += proposed + sum(passed)
        parts.append(part)
    return parts


def _extend(
    plan: Plan,
    step: Step,
    x: Extender,
    mine: Prefixes,
    source: Sequence[Layer],
    checks: Sequence[tuple[Extender, Sequence[Layer]]],
) -> tuple[Part, int, list[int]]:
    """Extender `x` proposes for prefixes `mine` from `source`; every other extender validates.

    Returns the bindings, the number proposed, and per validator how many rows passed. The rows
    a validator drops are gathered out before the next one checks, but the last one's only
    marks the rows it kept (see `Part`).
    """
    part, proposed = propose(plan, step, x, mine, source)
    kept: np.ndarray | None = None
    passed: list[int] = []
    for y, ys in checks:
        if kept is not None:
            part, kept = part.take(kept), None
        if len(part) == 0:
            continue
        kept, m = validate(plan, y, part, ys)
        passed.append(len(kept))
        if y.completes and m is not None:  # else every kept row's factor is 1
            part.scale(m, lookup_bound(ys))  # the rows dropped (factor 0) are never read
    return (part, kept), proposed, passed


def propose(
    plan: Plan, step: Step, x: Extender, mine: Prefixes, source: Sequence[Layer]
) -> tuple[Prefixes, int]:
    """Extender `x` proposes the step's variable for prefixes `mine` from its `source` layers,
    within the step's filters. Returns the bindings and how many were proposed (before the
    filters a range cannot apply)."""
    atom_vars = plan.atom_vars
    bounds, leftover = bounds_of(step.var, step.filters, mine)
    found = find(source, [mine.cols[atom_vars[x.atom][k]] for k in x.key], len(mine), bounds)
    over = None if mine.overflow is None else found.spread(mine.overflow)
    cols = {v: found.spread(c) for v, c in mine.cols.items()}
    part = Prefixes(cols, found.spread(mine.weight), over, mine.bound)
    part.cols[step.var] = found.rest[:, 0]
    if x.completes and found.diff is not None:
        part.scale(found.diff, found.bound)
    proposed = len(part)
    if leftover:  # the filters the proposals' bounds did not already apply
        part = part.filtered(leftover)
    return part, proposed


def validate(
    plan: Plan, y: Extender, part: Prefixes, source: Sequence[Layer]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Extender `y` validates bindings: the indices of those it holds, and each binding's
    multiplicity in it (None when every held one's is 1). A completing extender's factor
    multiplies the weight; the others' only say the key is in the atom's support."""
    cols = [part.cols[plan.atom_vars[y.atom][k]] for k in (*y.key, y.value)]
    return present(source, cols, len(part))


_LOWER = {CmpOp.GT: (True, False), CmpOp.GE: (True, True)}
_UPPER = {CmpOp.LT: (False, False), CmpOp.LE: (False, True)}


def bounds_of(var: Var, filters: Sequence[Filter], p: Prefixes) -> tuple[list[Bound], list[Filter]]:
    """The step's filters that compare the new variable with a bound term, as range bounds.

    Also returns the filters left over: those a range cannot apply (``!=``, or not on the new
    variable). Every proposal made within the bounds satisfies the others.
    """
    out: list[Bound] = []
    rest: list[Filter] = []
    for f in filters:
        if f.left == var and f.right != var:
            op, other = f.op, f.right
        elif f.right == var and f.left != var:
            op, other = f.op.flipped(), f.left
        else:
            rest.append(f)
            continue
        sides = {**_LOWER, **_UPPER, CmpOp.EQ: None}
        if op not in sides:
            rest.append(f)  # != cannot narrow a range
            continue
        values = np.asarray(
            p.cols[other] if isinstance(other, Var) else np.full(len(p), other.value), dtype=I64
        )
        found = sides[op]
        for lower, inclusive in [(True, True), (False, True)] if found is None else [found]:
            out.append(Bound(values, lower, inclusive))
    return out, rest


def _filter_mask(p: Prefixes, filters: Sequence[Filter]) -> np.ndarray:
    keep = np.ones(len(p), dtype=bool)
    for f in filters:
        left = p.cols[f.left] if isinstance(f.left, Var) else np.int64(f.left.value)
        right = p.cols[f.right] if isinstance(f.right, Var) else np.int64(f.right.value)
        keep &= _cmp(f.op, np.asarray(left), np.asarray(right))
    return keep


def concat(parts: list[Part], vs: Sequence[Var], lead: Sequence[Var] = ()) -> Prefixes:
    """Parts of bindings, one after another: each column is written once, straight from the
    rows each part kept (a single whole part is returned as it is, unless `lead` is given).

    The list is emptied as the parts are copied: each part's memory is freed as soon as its
    rows are in place, and the next parts' rows land in the pages it held (touching new memory
    costs far more than reusing what was just freed).

    The columns of `lead` (distinct variables of `vs`) are written as the columns of one
    column-major array, in that order: `output_changes` then takes that array as the output's
    rows as it is, instead of copying every column once more (see `head_block`).
    """
    if len(parts) == 1 and parts[0][1] is None and not lead:
        return parts.pop()[0]
    total = sum(part_rows(part) for part in parts)
    block = np.empty((total, len(lead)), dtype=I64, order="F")
    at = {v: i for i, v in enumerate(lead)}
    cols = {v: block[:, at[v]] if v in at else np.empty(total, dtype=I64) for v in vs}
    weight = np.empty(total, dtype=I64)
    known = [p.bound for p, _ in parts if p.bound is not None]
    bound = max(known) if known and len(known) == len(parts) else None
    flagged = any(p.overflow is not None for p, _ in parts)
    over = np.zeros(total, dtype=bool) if flagged else None
    start = 0
    parts.reverse()  # popped from the end: first part first
    while parts:
        p, kept = parts.pop()
        end = start + (len(p) if kept is None else len(kept))
        pairs = [*((p.cols[v], cols[v]) for v in vs), (p.weight, weight)]
        if over is not None and p.overflow is not None:
            pairs.append((p.overflow, over))
        for src, out in pairs:
            if kept is None:
                out[start:end] = src
            else:  # indices known valid: "clip" writes straight into `out`, unbuffered
                np.take(src, kept, out=out[start:end], mode="clip")
        start = end
    return Prefixes(cols, weight, over, bound)


def head_block(p: Prefixes, head: Sequence[Var]) -> np.ndarray | None:
    """The head's columns of `p` as one column-major array, when they already are the leading
    columns of one (`concat` with ``lead=head``), without a copy; else None."""
    if not head or len(set(head)) != len(head):
        return None
    base = p.cols[head[0]].base
    if not isinstance(base, np.ndarray) or base.ndim != 2 or base.shape[1] != len(head):
        return None
    for i, v in enumerate(head):
        col, want = p.cols[v], base[:, i]
        if (col.dtype, col.shape, col.strides, col.ctypes.data) != (
            want.dtype,
            want.shape,
            want.strides,
            want.ctypes.data,
        ):
            return None
    return base


def bindings(plan: Plan, rule: DeltaRule, parts: list[Part]) -> Prefixes:
    """A rule's parts of full bindings as one set of columns (`parts` is emptied).

    When the head names distinct variables, its columns are written as one column-major array
    (`head_block`), which `output_changes` takes as the output's rows without a copy.
    """
    names = list(dict.fromkeys(rule.order))
    head = plan.query.head
    lead = head if len(set(head)) == len(head) and set(head) <= set(names) else ()
    return concat(parts, names, lead)


def weights(plan: Plan, rule: DeltaRule, layers: Layers) -> np.ndarray:
    """Each delta tuple's expected work: its least candidate count at the rule's first step
    (1 for a rule without steps), to cut the delta into pieces of similar work."""
    d = delta_layer(plan, rule, layers)
    if not rule.steps or len(d) == 0:
        return np.ones(len(d), dtype=I64)
    start = plan.atom_vars[rule.delta]
    prefixes = Prefixes({v: d.rows[:, i] for i, v in enumerate(start)}, d.diff)
    xs = rule.steps[0].extenders
    least: np.ndarray | None = None
    for x in xs:
        keys = [prefixes.cols.get(plan.atom_vars[x.atom][k]) for k in x.key]
        if any(c is None for c in keys):  # a key bound by a check, not by the delta: skip it
            continue
        n = lookup_sum_of(
            layers.layers(counts_trace_name(x.counts), None, tuple(range(len(x.key))), x.version),
            [c for c in keys if c is not None],
            len(d),
        )
        least = n if least is None else np.minimum(least, n)
    return np.ones(len(d), dtype=I64) if least is None else np.maximum(least, 1)


def shares(sizes: np.ndarray, count: int) -> list[tuple[int, int]]:
    """`count` consecutive row ranges covering ``len(sizes)`` rows, of about equal total size
    (some may be empty).

    >>> shares(np.array([1, 1, 1, 1, 4]), 2)
    [(0, 4), (4, 5)]
    >>> shares(np.array([5]), 3)
    [(0, 0), (0, 0), (0, 1)]
    """
    count = max(count, 1)
    ends = np.cumsum(sizes)
    total = int(ends[-1]) if len(ends) else 0
    targets = [total * i / count for i in range(1, count)]
    cuts = [0, *(int(np.searchsorted(ends, t, "right")) for t in targets), len(sizes)]
    cuts = list(np.maximum.accumulate(np.array(cuts)))
    return [(int(a), int(b)) for a, b in itertools.pairwise(cuts)]


def prepare(plan: Plan, rule: DeltaRule, layers: Layers) -> None:
    """Build every search structure the rule reads lazily (views, sorted keys, columns), so
    rules running at once on several threads over the same layers only read them."""
    delta_layer(plan, rule, layers)
    for c in rule.checks:
        order = tuple(range(c.view.arity))
        name = relation_trace_name(c.view.relation)
        for layer in layers.layers(name, c.view, order, c.version):
            layer.prepare(layer.width)
    for step in rule.steps:
        for x in step.extenders:
            order = tuple(range(len(x.key)))
            for layer in layers.layers(counts_trace_name(x.counts), None, order, x.version):
                layer.prepare(layer.width)
            for layer in layers.layers(*support_source(x), x.version):
                layer.prepare(len(x.key), len(x.key) + 1, layer.width)
                if len(layer) and len(x.key) < layer.width:
                    layer.col(len(x.key))
