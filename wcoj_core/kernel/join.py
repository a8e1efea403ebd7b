"""One delta rule, attribute at a time: count, pick the fewest, propose, validate.

A rule starts from the changed tuples of its delta atom (`EpochLayers.delta`), multiplies in the
atoms they bind completely (`DeltaRule.checks`), then binds one variable per `Step`, each phase
a loop of the compiled kernel (`wcoj_core.kernel.native`) over the step's prefixes:

1. **count** (`count`) — every extender's number of candidates for each prefix: its counts
   arrangement's value, or, when the extender reads a single layer, the size of its key's
   range there (the same number: the layer holds each supported tuple once); a prefix some
   extender has none for dies here;
2. **pick** — per prefix, the extender with the fewest candidates (ties to the lowest index);
3. **propose** — the winner enumerates its candidates: its key's range in each of its layers,
   narrowed by the step's order filters (`b < c` never proposes ``c <= b``), merged in value
   order and summed over the layers; a completing extender multiplies in each tuple's
   multiplicity;
4. **validate** — every other extender looks each candidate up, galloping forward through its
   own key's range (candidates come in value order): a completing one multiplies in the
   tuple's multiplicity, the others only require the key to be in the atom's support.

Phases 2 to 4 are one pass (`extend`): only the candidates that pass every extender are written,
so no array of unvalidated proposals is ever made. Work per prefix is the smallest candidate
set, so a hub vertex never makes a quadratic pile of wedges. Memory is bounded too: the delta
is taken `CHUNK_ROWS` tuples at a time, and each step extends consecutive pieces of its
prefixes whose counts add up to at most `PROPOSAL_BUDGET` (the counts bound what a piece
writes), descending to the next step piece by piece (depth first). `run_rule` yields the full
bindings in parts as they are made; `RuleTally` adds up what every step did.

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
`wcoj_core.deploy` decide where rules run and hand each one its share of the delta (the
compiled loops release the GIL, so shares run at once on threads).
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
from wcoj_core.kernel.layer import (
    CONSTANT,
    DIRECTORY_SHARE,
    ITSELF,
    OPS,
    OVER_LAYERS,
    PREFIX_COL,
    Layer,
    NativeFilter,
    contiguous,
    lookup_sum_of,
    native_outcome,
    present,
)
from wcoj_core.kernel.multiplicity import times
from wcoj_core.kernel.native import native
from wcoj_core.query.ir import CmpOp, Filter, Var
from wcoj_core.query.plan import AtomView, DeltaRule, Extender, Plan, Step
from wcoj_core.traces import counts_trace_name, relation_trace_name

# A rule takes its delta tuples this many at a time.
CHUNK_ROWS = 1 << 22
# A step extends at most about this many candidates at once (as the counts bound them; a
# single prefix with more is taken alone): what bounds the memory of a rule.
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
    `MultiplicityOverflow` (`check_overflow`); one that dies before does not. `block`, when
    set, is the leading columns as one column-major array (see `head_block`).
    """

    cols: dict[Var, np.ndarray]
    weight: np.ndarray
    overflow: np.ndarray | None = None
    block: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.weight)

    def take(self, idx: np.ndarray) -> Prefixes:
        over = self.overflow
        cols = {v: c[idx] for v, c in self.cols.items()}
        return Prefixes(cols, self.weight[idx], None if over is None else over[idx])

    def scale(self, factor: np.ndarray) -> None:
        """Multiply each row's weight by its `factor` (multiplicities), flagging the rows whose
        exact product leaves int64."""
        self.weight, over = times(self.weight, factor)
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
        if not filters:
            return self
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


def counts_source(x: Extender) -> tuple[str, None, tuple[int, ...]]:
    """Where extender `x` counts from: its counts trace, keyed by its key."""
    return counts_trace_name(x.counts), None, tuple(range(len(x.key)))


def delta_layer(plan: Plan, rule: DeltaRule, layers: Layers) -> Layer:
    """The changed tuples a rule starts from: its delta atom's view of the epoch's changes."""
    view = plan.views[rule.delta]
    return layers.delta(relation_trace_name(view.relation), view, tuple(range(view.arity)))


# Bindings in the making: rows of the prefixes, or only those at the given indices.
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
    threads: int = 1,
    whole: bool = False,
) -> Iterator[Part]:
    """The full bindings of one delta rule, in parts, as they are made (see the module).

    `rows` restricts the rule to the delta tuples at those positions (a deployment's share of
    the work); `tally` is added what every step did; `threads` is how many threads the
    compiled loops may use. The last step writes the head's columns as one column-major
    block (`head_block`), what the output change is made of: with `whole`, each chunk's
    bindings as one part (for a deployment that keeps every binding anyway: no part is
    copied into place later), else a piece of at most `budget` candidates at a time (for one
    that sends each part on as it comes).
    """
    limits = Limits(budget, threads, whole, counting=False)
    for made in _chunks(plan, rule, layers, tally, rows, chunk_rows, limits):
        assert not isinstance(made, Counted)
        yield made


def count_rule(
    plan: Plan,
    rule: DeltaRule,
    layers: Layers,
    tally: RuleTally,
    rows: tuple[int, int] | None = None,
    *,
    chunk_rows: int = CHUNK_ROWS,
    budget: int = PROPOSAL_BUDGET,
    threads: int = 1,
) -> Counted:
    """`run_rule`'s full bindings counted, not written: how many, and their weights' exact sum
    (a binding whose weight leaves int64 raises as in `run_rule`). What an output whose
    bindings are all distinct tuples needs when only its count is asked for (`wcoj count`)."""
    found = Counted(0, 0)
    limits = Limits(budget, threads, True, counting=True)
    for made in _chunks(plan, rule, layers, tally, rows, chunk_rows, limits):
        assert isinstance(made, Counted)
        found = Counted(found.rows + made.rows, found.total + made.total)
    return found


@dataclass(frozen=True, slots=True)
class Counted:
    """Bindings counted: how many, and the exact sum of their weights (a Python int)."""

    rows: int
    total: int


@dataclass(frozen=True, slots=True)
class Limits:
    """How a rule runs: the proposal budget, the threads, whether the last step writes each
    chunk whole, and whether it only counts."""

    budget: int
    threads: int
    whole: bool
    counting: bool


def _chunks(
    plan: Plan,
    rule: DeltaRule,
    layers: Layers,
    tally: RuleTally,
    rows: tuple[int, int] | None,
    chunk_rows: int,
    limits: Limits,
) -> Iterator[Part | Counted]:
    """The rule's delta tuples `rows`, a chunk at a time, through every step."""
    d = delta_layer(plan, rule, layers)
    lo, hi = (0, len(d)) if rows is None else rows
    start = plan.atom_vars[rule.delta]
    step = max(chunk_rows, 1)
    columns = d.columns()
    lead = _lead(plan, rule)
    for at in range(lo, hi, step):
        part = slice(at, min(at + step, hi))
        cols = {v: columns[i][part] for i, v in enumerate(start)}
        prefixes = Prefixes(cols, d.diff[part])
        prefixes = _checked(plan, rule, prefixes, layers, tally)
        prefixes = prefixes.filtered(rule.start_filters)
        if not rule.steps and limits.counting:
            check_overflow(plan, (prefixes, None))
            total = int(np.asarray(prefixes.weight, dtype=object).sum()) if len(prefixes) else 0
            yield Counted(len(prefixes), total)
            continue
        for made in _descend(plan, rule, 0, prefixes, layers, tally, limits, lead):
            if not isinstance(made, Counted):
                check_overflow(plan, made)
            yield made


def _lead(plan: Plan, rule: DeltaRule) -> tuple[Var, ...]:
    """The head's variables, when they are distinct variables of the rule (then written as
    one block), else none."""
    head = plan.query.head
    if len(set(head)) == len(head) and set(head) <= set(rule.order):
        return tuple(head)
    return ()


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
        prefixes.scale(m[keep])
        tally.joins += len(prefixes)
    return prefixes


def _descend(
    plan: Plan,
    rule: DeltaRule,
    k: int,
    prefixes: Prefixes,
    layers: Layers,
    tally: RuleTally,
    limits: Limits,
    lead: Sequence[Var],
) -> Iterator[Part | Counted]:
    """Steps `k`.. of a rule for some prefixes, piece by piece (see the module)."""
    if k == len(rule.steps):
        yield prefixes, None
        return
    step = rule.steps[k]
    live = count(plan, step, prefixes, layers, tally, limits.threads)
    counts = tally.steps[k]
    counts.prefixes += len(live)
    counts.min_sum += int(live.least.sum())
    last = k + 1 == len(rule.steps)
    whole = last and (limits.whole or limits.counting)
    cut = [(0, len(live))] if whole else pieces(live.least, limits.budget)
    for a, b in cut:
        if last and limits.counting:
            got = extend(
                plan, step, prefixes, live, (a, b), layers, counts, (), limits.threads, True
            )
            tally.joins += got.joins
            if got.flagged:  # a binding's weight left int64: written again, to name it
                made = extend(plan, step, prefixes, live, (a, b), layers, StepCounts(""))
                check_overflow(plan, (made.made, None))
            yield Counted(got.rows, got.total)
            continue
        part = extend(
            plan, step, prefixes, live, (a, b), layers, counts, lead if last else (), limits.threads
        )
        tally.joins += part.joins
        if last:
            yield part.made, None
        elif len(part.made):
            yield from _descend(plan, rule, k + 1, part.made, layers, tally, limits, lead)


@dataclass(frozen=True, slots=True)
class Live:
    """The prefixes a step's count kept (their positions), the extender with the fewest
    candidates for each (`tag`) and that number (`least`)."""

    rows: np.ndarray
    tag: np.ndarray
    least: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)


# A loop over fewer prefixes than this runs on one thread; on several, each takes this many
# prefixes at a time (a count, more at once).
THREAD_PREFIXES = 1 << 15
CHUNK_PREFIXES = 1 << 11
COUNT_CHUNK = 1 << 14


def _threads(prefixes: int, threads: int) -> int:
    """The threads a loop over `prefixes` prefixes uses: one for a small one."""
    return threads if prefixes >= THREAD_PREFIXES else 1


NativeExtender = tuple[list[Any], list[Any] | None, tuple[int, ...], bool]


def _native_extender(
    plan: Plan, x: Extender, names: Sequence[Var], layers: Layers, m: int
) -> NativeExtender:
    """Extender `x` as the compiled kernel reads it: its source layers, its counts layers
    (None: counted by its one source layer's ranges), its key's prefix columns, completes."""
    source = [layer for layer in layers.layers(*support_source(x), x.version) if len(layer)]
    counts = None
    if len(source) > 1:
        counts = [layer.spec(m) for layer in layers.layers(*counts_source(x), x.version)]
    key = tuple(names.index(plan.atom_vars[x.atom][k]) for k in x.key)
    return [layer.spec(m) for layer in source], counts, key, x.completes


def count(
    plan: Plan, step: Step, prefixes: Prefixes, layers: Layers, tally: RuleTally, threads: int = 1
) -> Live:
    """Count and pick: each extender's number of candidates per prefix, the prefixes left with
    none in some extender dropped, and for the others the extender with the fewest."""
    names = list(prefixes.cols)
    m = len(prefixes)
    xs = [_native_extender(plan, x, names, layers, m) for x in step.extenders]
    rows = np.empty(m, dtype=I64)
    tag = np.empty(m, dtype=I64)
    least = np.empty(m, dtype=I64)
    alive = np.empty(len(xs), dtype=I64)
    cols = contiguous(prefixes.cols.values())
    kept = native.count(xs, cols, m, rows, tag, least, alive, _threads(m, threads), COUNT_CHUNK)
    if kept < 0:
        raise MultiplicityOverflow(OVER_LAYERS, tuple(int(c[-kept - 1]) for c in cols))
    tally.joins += int(alive.sum())
    return Live(rows[:kept], tag[:kept], least[:kept])


def count_of(plan: Plan, x: Extender, prefixes: Prefixes, layers: Layers) -> np.ndarray:
    """One extender's number of candidates for each prefix (its counts arrangement's value)."""
    # An empty key is no column: every prefix then reads the one total count.
    return lookup_sum_of(
        layers.layers(*counts_source(x), x.version),
        [prefixes.cols[plan.atom_vars[x.atom][k]] for k in x.key],
        len(prefixes),
    )


def pick(n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pick, from counts made apart (extender x prefix): per prefix, the extender with the
    fewest candidates (ties to the lowest index) and that least count.

    >>> pick(np.array([[3, 1, 2], [2, 5, 2]]))
    (array([1, 0, 0]), array([2, 1, 2]))
    """
    m = n.shape[1]
    tag = np.argmin(n, axis=0) if len(n) > 1 else np.zeros(m, dtype=I64)
    least = n[tag, np.arange(m)] if m else np.zeros(0, dtype=I64)
    return tag, least


def pieces(sizes: np.ndarray, budget: int) -> Iterator[tuple[int, int]]:
    """Consecutive row ranges whose `sizes` add up to at most `budget` each (a row above it
    alone).

    >>> list(pieces(np.array([2, 2, 5, 1]), 4))
    [(0, 2), (2, 3), (3, 4)]
    """
    total = int(sizes.sum())
    if total <= budget:
        yield 0, len(sizes)
        return
    ends = np.cumsum(sizes)
    start = 0
    while start < len(sizes):
        base = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, base + budget, "right"))
        stop = max(stop, start + 1)
        yield start, stop
        start = stop


def native_filters(step: Step, names: Sequence[Var]) -> list[NativeFilter]:
    """The step's filters as the kernel takes them: the new variable compared with a prefix
    column, a constant or itself (every filter of a step holds its variable)."""
    out: list[NativeFilter] = []
    for f in step.filters:
        if f.left == step.var:
            op, other = f.op, f.right
        elif f.right == step.var:
            op, other = f.op.flipped(), f.left
        else:
            raise AssertionError(f"filter {f} of step {step.var} does not hold it")
        if other == step.var:
            out.append((OPS[op.value], ITSELF, 0))
        elif isinstance(other, Var):
            out.append((OPS[op.value], PREFIX_COL, names.index(other)))
        else:
            out.append((OPS[op.value], CONSTANT, int(other.value)))
    return out


@dataclass(frozen=True, slots=True)
class Extended:
    """The bindings a piece of a step made (none when only counted: then `rows` of them, with
    weights summing to `total`), the lookups behind them (`joins`), and whether a weight was
    flagged."""

    made: Prefixes
    joins: int
    rows: int = 0
    total: int = 0
    flagged: bool = False


def extend(
    plan: Plan,
    step: Step,
    prefixes: Prefixes,
    live: Live,
    piece: tuple[int, int],
    layers: Layers,
    counts: StepCounts,
    lead: Sequence[Var] = (),
    threads: int = 1,
    counting: bool = False,
) -> Extended:
    """Propose and validate, for the live prefixes of `piece`: each one's extender with the
    fewest candidates proposes, every other validates; the bindings come out in prefix
    order, the step's variable last. The columns of `lead` (variables of the bindings) are
    written as one column-major block (`head_block`). With `counting`, nothing is written:
    the bindings are counted and their weights summed."""
    names = list(prefixes.cols)
    a, b = piece
    cap = 0 if counting else int(live.least[a:b].sum())
    xs = [_native_extender(plan, x, names, layers, b - a) for x in step.extenders]
    made = _allocate([*names, step.var], cap, lead)
    cols = contiguous(prefixes.cols.values())
    flags = np.empty(cap, dtype=np.uint8)
    outcome = native.extend(
        cols,
        len(prefixes),
        np.ascontiguousarray(prefixes.weight, dtype=I64),
        prefixes.overflow,
        live.rows,
        live.tag,
        a,
        b,
        xs,
        native_filters(step, names),
        None if counting else tuple(made.cols.values()),
        None,
        None if counting else made.weight,
        None if counting else flags,
        cap,
        _threads(b - a, threads),
        CHUNK_PREFIXES,
    )
    got = native_outcome(outcome, cols, [x[2] for x in xs])
    n = 0 if counting else got.rows
    counts.proposed += got.proposed
    counts.validated += got.rows
    out = Prefixes(
        {v: c[:n] for v, c in made.cols.items()},
        made.weight[:n],
        flags[:n].view(bool) if got.flagged and not counting else None,
        None if made.block is None else made.block[:n],
    )
    return Extended(out, got.proposed + got.passed, got.rows, got.total, got.flagged)


def _allocate(vs: Sequence[Var], rows: int, lead: Sequence[Var]) -> Prefixes:
    """Empty columns for `rows` bindings of `vs`, those of `lead` as one column-major block.

    Written by the kernel front to back: pages past the rows it writes are never touched."""
    block = np.empty((rows, len(lead)), dtype=I64, order="F") if lead else None
    at = {v: i for i, v in enumerate(lead)}
    cols = {
        v: block[:, at[v]] if block is not None and v in at else np.empty(rows, dtype=I64)
        for v in vs
    }
    return Prefixes(cols, np.empty(rows, dtype=I64), None, block)


def propose(
    plan: Plan, step: Step, x: Extender, mine: Prefixes, source: Sequence[Layer]
) -> tuple[Prefixes, int]:
    """Extender `x` alone proposes the step's variable for prefixes `mine` from its `source`
    layers, within the step's filters (a deployment that validates in a later stage). Returns
    the bindings and how many were proposed."""
    names = list(mine.cols)
    m = len(mine)
    held = [layer for layer in source if len(layer)]
    key = tuple(names.index(plan.atom_vars[x.atom][k]) for k in x.key)
    xs = [([layer.spec(m) for layer in held], None, key, x.completes)]
    cols = contiguous(mine.cols.values())
    rows = np.arange(m, dtype=I64)
    tag = np.zeros(m, dtype=I64)
    args = (cols, m, np.ascontiguousarray(mine.weight, dtype=I64), mine.overflow, rows, tag)
    filters = native_filters(step, names)
    counted = native.extend(*args, 0, m, xs, filters, None, None, None, None, 0)
    cap = native_outcome(counted, cols, [key]).rows
    made = _allocate([*names, step.var], cap, ())
    flags = np.empty(cap, dtype=np.uint8)
    outcome = native.extend(
        *args, 0, m, xs, filters, tuple(made.cols.values()), None, made.weight, flags, cap
    )
    got = native_outcome(outcome, cols, [key])
    made.overflow = flags[: got.rows].view(bool) if got.flagged else None
    return made, got.proposed


def validate(
    plan: Plan, y: Extender, part: Prefixes, source: Sequence[Layer]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Extender `y` alone validates bindings (a deployment that validates in a stage of its
    own): the indices of those it holds, and each binding's multiplicity in it. A completing
    extender's factor multiplies the weight; the others only say the key is in the atom's
    support."""
    cols = [part.cols[plan.atom_vars[y.atom][k]] for k in (*y.key, y.value)]
    return present(source, cols, len(part))


def bounds_of(var: Var, filters: Sequence[Filter], p: Prefixes) -> tuple[list[Any], list[Filter]]:
    """The step's filters that compare the new variable with a bound term, as range bounds
    (`wcoj_core.kernel.layer.Bound`), and the filters left over: those a range cannot apply
    (``!=``, or not on the new variable). Every proposal made within the bounds satisfies the
    others."""
    from wcoj_core.kernel.layer import Bound

    sides = {CmpOp.GT: (True, False), CmpOp.GE: (True, True)}
    sides |= {CmpOp.LT: (False, False), CmpOp.LE: (False, True)}
    out: list[Any] = []
    rest: list[Filter] = []
    for f in filters:
        if f.left == var and f.right != var:
            op, other = f.op, f.right
        elif f.right == var and f.left != var:
            op, other = f.op.flipped(), f.left
        else:
            rest.append(f)
            continue
        if op not in sides and op is not CmpOp.EQ:
            rest.append(f)  # != cannot narrow a range
            continue
        values = np.asarray(
            p.cols[other] if isinstance(other, Var) else np.full(len(p), other.value), dtype=I64
        )
        for lower, inclusive in [(True, True), (False, True)] if op is CmpOp.EQ else [sides[op]]:
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
    rows each part kept (a single whole part is returned as it is, unless `lead` is given and
    it holds no block of those columns).

    The list is emptied as the parts are copied: each part's memory is freed as soon as its
    rows are in place, and the next parts' rows land in the pages it held (touching new memory
    costs far more than reusing what was just freed).

    The columns of `lead` (distinct variables of `vs`) are written as the columns of one
    column-major array, in that order: `output_changes` then takes that array as the output's
    rows as it is, instead of copying every column once more (see `head_block`).
    """
    if len(parts) == 1 and parts[0][1] is None:
        only = parts[0][0]
        if not lead or head_block(only, lead) is not None:
            return parts.pop()[0]
    total = sum(part_rows(part) for part in parts)
    made = _allocate(vs, total, lead)
    flagged = any(p.overflow is not None for p, _ in parts)
    over = np.zeros(total, dtype=bool) if flagged else None
    start = 0
    parts.reverse()  # popped from the end: first part first
    while parts:
        p, kept = parts.pop()
        end = start + (len(p) if kept is None else len(kept))
        pairs = [*((p.cols[v], made.cols[v]) for v in vs), (p.weight, made.weight)]
        if over is not None and p.overflow is not None:
            pairs.append((p.overflow, over))
        for src, out in pairs:
            if kept is None:
                out[start:end] = src
            else:  # indices known valid: "clip" writes straight into `out`, unbuffered
                np.take(src, kept, out=out[start:end], mode="clip")
        start = end
    made.overflow = over
    return made


def head_block(p: Prefixes, head: Sequence[Var]) -> np.ndarray | None:
    """The head's columns of `p` as one column-major array, when they already are its
    `Prefixes.block` (written so by `extend` or `concat`), without a copy; else None."""
    block = p.block
    if block is None or not head or block.shape[1] != len(head) or len(block) != len(p):
        return None
    for i, v in enumerate(head):
        col = p.cols.get(v)
        if (
            col is None
            or not np.shares_memory(col, block[:, i])
            or col.ctypes.data != (block[:, i].ctypes.data)
        ):
            return None
    return block


def bindings(plan: Plan, rule: DeltaRule, parts: list[Part]) -> Prefixes:
    """A rule's parts of full bindings as one set of columns (`parts` is emptied).

    When the head names distinct variables, its columns are one column-major array
    (`head_block`), which `output_changes` takes as the output's rows without a copy.
    """
    names = list(dict.fromkeys(rule.order))
    return concat(parts, names, _lead(plan, rule))


def weights(plan: Plan, rule: DeltaRule, layers: Layers) -> np.ndarray:
    """Each delta tuple's expected work: its least candidate count at the rule's first step
    (1 for a rule without steps), to cut the delta into pieces of similar work."""
    d = delta_layer(plan, rule, layers)
    if not rule.steps or len(d) == 0:
        return np.ones(len(d), dtype=I64)
    start = plan.atom_vars[rule.delta]
    columns = d.columns()
    cols = {v: columns[i] for i, v in enumerate(start)}
    least: np.ndarray | None = None
    for x in rule.steps[0].extenders:
        keys = [cols.get(plan.atom_vars[x.atom][k]) for k in x.key]
        if any(c is None for c in keys):  # a key bound by a check, not by the delta: skip it
            continue
        n = lookup_sum_of(
            layers.layers(*counts_source(x), x.version), [c for c in keys if c is not None], len(d)
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
    """Make every search structure the rule reads lazily (views, columns, unit flags, and the
    directories its many probes will want), so rules running at once on several threads over
    the same layers only read them."""
    d = delta_layer(plan, rule, layers)
    many = len(d)

    def ready(layer: Layer) -> None:
        layer.prepare(layer.width)
        if many and len(layer) and many >= DIRECTORY_SHARE * len(layer):
            layer.directory()

    for c in rule.checks:
        order = tuple(range(c.view.arity))
        name = relation_trace_name(c.view.relation)
        for layer in layers.layers(name, c.view, order, c.version):
            ready(layer)
    for step in rule.steps:
        for x in step.extenders:
            for layer in layers.layers(*counts_source(x), x.version):
                ready(layer)
            for layer in layers.layers(*support_source(x), x.version):
                ready(layer)
