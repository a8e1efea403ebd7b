"""One delta rule, attribute at a time: count, pick the fewest, propose, validate.

A rule starts from the changed tuples of its delta atom (`EpochLayers.delta`), multiplies in the
atoms they bind completely (`DeltaRule.checks`), then binds one variable per `Step`
(`wcoj_core.kernel.step`), each phase a loop of the compiled kernel (`wcoj_core.kernel.native`)
over the step's prefixes:

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
bindings in parts as they are made (`count_rule` only counts them and sums their weights);
`RuleTally` adds up what every step did.

**Aggregates** (`Query.aggregate`): a rule whose last variable is not the head's counts it per
prefix instead (`_counted`, the kernel's counting mode writing each prefix's sum: its
candidates' weights, times their values for the summed variable) and yields the prefixes with
those sums as weights; whatever a rule yields is then summed per group as it comes (`_grouped`:
weights times the summed variable where it is bound, runs of one group added up, zeros
dropped), so no full binding is held unless the last variable is the head's (each is then a
partial sum of its own group). A count per vertex of the cliques of an undirected relation
(`Plan.members`) runs the cliques' rules instead: each clique found once, not once per member,
its weight credited to each of its vertices (`_grouped`).

Multiplicities are checked, never wrapped (`wcoj_core.kernel.multiplicity`). A binding's weight
is the product of the multiplicities of its atoms, each as of the version the rule reads (the
delta atom's change, the others old or new): a full binding of a delta rule whose exact weight
leaves int64 raises `MultiplicityOverflow` naming it. The weight is multiplied in as the atoms
complete; a partial weight past the range flags its row instead of raising (`Prefixes`), so a
partial binding that dies before completing (not in some atom, filtered out) never raises: what
raises does not depend on the variable order or on which extender proposes. (No factor is 0,
so a flagged row's full weight is past the range too.) Sums raise as they are made: a tuple's
multiplicity over the layers of a trace, and the output change summed over rules and bindings.

Nothing here reads a file or knows Spark, and no thread starts but the compiled loops' own
(`threads`): the deployments in `wcoj_core.deploy` decide where rules run and hand each one its
share of the delta.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from wcoj_core.errors import MultiplicityOverflow
from wcoj_core.kernel.index import Layers
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import AGGREGATED, DIRECTORY_SHARE, Layer, lookup_sum_of
from wcoj_core.kernel.multiplicity import magnitude, row_namer, sums_at
from wcoj_core.kernel.step import (
    Prefixes,
    StepCounts,
    allocate,
    count,
    count_and_extend,
    counts_source,
    extend,
    pieces,
    support_source,
)
from wcoj_core.query.ir import Var
from wcoj_core.query.plan import DeltaRule, Plan, Step, Version
from wcoj_core.traces import relation_trace_name

# A rule takes its delta tuples this many at a time.
CHUNK_ROWS = 1 << 22
# A step extends at most about this many candidates at once (as the counts bound them; a
# single prefix with more is taken alone): what bounds the memory of a rule.
PROPOSAL_BUDGET = 1 << 23


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


def delta_layer(plan: Plan, rule: DeltaRule, layers: Layers) -> Layer:
    """The changed tuples a rule starts from: its delta atom's view of the epoch's changes."""
    view = plan.views[rule.delta]
    return layers.delta(relation_trace_name(view.relation), view, tuple(range(view.arity)))


# Bindings in the making: rows of the prefixes, or only those at the given indices.
Part = tuple[Prefixes, np.ndarray | None]


def part_rows(part: Part) -> int:
    return len(part[0]) if part[1] is None else len(part[1])


@dataclass(frozen=True, slots=True)
class Pace:
    """How a rule takes its work: delta tuples a chunk, candidates a piece (the proposal
    budget, what bounds its memory), and the threads its compiled loops may use."""

    chunk_rows: int = CHUNK_ROWS
    budget: int = PROPOSAL_BUDGET
    threads: int = 1


def run_rule(
    plan: Plan,
    rule: DeltaRule,
    layers: Layers,
    tally: RuleTally,
    rows: tuple[int, int] | None = None,
    *,
    pace: Pace = Pace(),
    whole: bool = False,
) -> Iterator[Part]:
    """The full bindings of one delta rule, in parts, as they are made (see the module).

    `rows` restricts the rule to the delta tuples at those positions (a deployment's share of
    the work); `tally` is added what every step did; `pace` sets the chunks, the pieces and
    the compiled loops' threads. The last step writes the head's columns as one column-major
    block (`head_block`), what the output change is made of: with `whole`, each chunk's
    bindings as one part (for a deployment that keeps every binding anyway: no part is
    copied into place later), else a piece of at most ``pace.budget`` candidates at a time
    (for one that sends each part on as it comes).
    """
    limits = Limits(pace.budget, pace.threads, whole, counting=False)
    for made in _chunks(plan, rule, layers, tally, rows, pace.chunk_rows, limits):
        assert not isinstance(made, Counted)
        yield made


def count_rule(
    plan: Plan,
    rule: DeltaRule,
    layers: Layers,
    tally: RuleTally,
    rows: tuple[int, int] | None = None,
    *,
    pace: Pace = Pace(),
) -> Counted:
    """`run_rule`'s full bindings counted, not written: how many, and their weights' exact sum
    (a binding whose weight leaves int64 raises as in `run_rule`). What an output whose
    bindings are all distinct tuples needs when only its count is asked for (`wcoj count`;
    not an aggregate's: `run_rule` counts its groups)."""
    assert plan.query.aggregate is None, "an aggregate's rules run with run_rule"
    found = Counted(0, 0)
    limits = Limits(pace.budget, pace.threads, True, counting=True)
    for made in _chunks(plan, rule, layers, tally, rows, pace.chunk_rows, limits):
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
    outer, (plan, rule) = plan, enumerated(plan, rule, layers)
    if not rule.checks and starved(rule, layers):  # (a check's sums may raise: left to run)
        if limits.counting:
            yield Counted(0, 0)
        return
    d = delta_layer(plan, rule, layers)
    lo, hi = (0, len(d)) if rows is None else rows
    start = plan.atom_vars[rule.delta]
    step = max(chunk_rows, 1)
    columns = d.columns()
    lead = _lead(plan, rule)
    for at in range(lo, hi, step):
        part = slice(at, min(at + step, hi))
        cols = {v: columns[i][part] for i, v in enumerate(start)}
        for made in _started(plan, rule, Prefixes(cols, d.diff[part]), layers, tally, limits, lead):
            yield (
                made if outer is plan or isinstance(made, Counted) else _grouped(outer, made, True)
            )


def run_from(
    plan: Plan,
    rule: DeltaRule,
    prefixes: Prefixes,
    layers: Layers,
    tally: RuleTally,
    *,
    pace: Pace = Pace(),
) -> Iterator[Part]:
    """`run_rule` started from given bindings of the rule's first variables (`rule.start`)
    and their weights, instead of its delta atom's tuples (`wcoj_core.ask`: the bindings a
    question is asked for): their atoms checked, their filters applied, then every step."""
    limits = Limits(pace.budget, pace.threads, False, counting=False)
    for made in _started(plan, rule, prefixes, layers, tally, limits, _lead(plan, rule)):
        assert not isinstance(made, Counted)
        yield made


def _started(
    plan: Plan,
    rule: DeltaRule,
    prefixes: Prefixes,
    layers: Layers,
    tally: RuleTally,
    limits: Limits,
    lead: Sequence[Var],
) -> Iterator[Part | Counted]:
    """A rule's steps from some bindings of its first variables (see `_chunks`)."""
    prefixes = _checked(plan, rule, prefixes, layers, tally)
    prefixes = prefixes.filtered(rule.start_filters)
    if not rule.steps and limits.counting:
        check_overflow(plan, (prefixes, None))
        total = int(np.asarray(prefixes.weight, dtype=object).sum()) if len(prefixes) else 0
        yield Counted(len(prefixes), total)
        return
    for made in _descend(plan, rule, 0, prefixes, layers, tally, limits, lead):
        if not isinstance(made, Counted):
            check_overflow(plan, made)
            if plan.query.aggregate is not None:
                made = _grouped(plan, made)
        yield made


def enumerated(plan: Plan, rule: DeltaRule, layers: Layers) -> tuple[Plan, DeltaRule]:
    """The plan and rule the kernel runs for `rule`: its `Plan.members` rule when it has one
    (full bindings of the cliques, grouped by `_grouped`), unless the old state holds nothing
    (a first load: the last rule alone finds every clique either way, and counting them per
    prefix in one layer beats listing them); else itself. The same for every rule of an
    epoch (a rule's share of the change differs between the two plans, their sum does not)."""
    m = plan.members
    if m is None or starved(plan.rules[0], layers):
        return plan, rule
    return m, m.rules[rule.delta]


def starved(rule: DeltaRule, layers: Layers) -> bool:
    """Whether an atom the rule extends by reads a version that holds nothing (the old state
    of a first load): then no binding exists, and the rule's delta is not even looked at. The
    old versions are looked at first, so no view of the epoch's changes is arranged for it."""
    extenders = [x for step in rule.steps for x in step.extenders]
    extenders.sort(key=lambda x: x.version is not Version.OLD)
    return any(
        not any(len(layer) for layer in layers.layers(*support_source(x), x.version))
        for x in extenders
    )


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
    last = k + 1 == len(rule.steps)
    if last and plan.query.aggregate is not None and step.var not in plan.query.head:
        yield _counted(plan, step, prefixes, layers, tally, k, limits.threads)
        return
    if last and limits.counting:
        # counted and extended in one pass where every extender reads one layer
        mine = StepCounts(step.var.name)
        got = count_and_extend(plan, step, prefixes, layers, mine, limits.threads)
        if got is not None and not got.flagged:
            tally.steps[k] = tally.steps[k].plus(mine)
            tally.joins += got.joins
            yield Counted(got.rows, got.total)
            return
    live = count(plan, step, prefixes, layers, limits.threads)
    tally.joins += live.joins
    counts = tally.steps[k]
    counts.prefixes += len(live)
    counts.min_sum += int(live.least.sum())
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


def _counted(
    plan: Plan,
    step: Step,
    prefixes: Prefixes,
    layers: Layers,
    tally: RuleTally,
    k: int,
    threads: int,
) -> Part:
    """An aggregate rule's last step counted per prefix (see the module): the prefixes, each
    weighted by its candidates' summed weights (times their values when the step binds the
    summed variable); a binding whose weight leaves int64 raises as in `run_rule`."""
    agg = plan.query.aggregate
    value = agg is not None and step.var == agg.var
    per = np.zeros(len(prefixes), dtype=I64)
    mine = StepCounts(step.var.name)
    got = count_and_extend(plan, step, prefixes, layers, mine, threads, per, value, True)
    assert got is not None
    if got.flagged:  # a binding's weight left int64: written again, to name it
        live = count(plan, step, prefixes, layers, threads)
        made = extend(plan, step, prefixes, live, (0, len(live)), layers, StepCounts(""))
        check_overflow(plan, (made.made, None))
    tally.joins += got.joins
    tally.steps[k] = tally.steps[k].plus(mine)
    return Prefixes(dict(prefixes.cols), per), None


def _grouped(plan: Plan, part: Part, cliques: bool = False) -> Part:
    """An aggregate rule's part as partial sums of its groups: each row's weight times the
    summed variable where the row binds it, runs of rows of one group added up, zeros
    dropped (a sum leaving int64 raises naming the group). With `cliques` the bindings are
    those of the `Plan.members` rules: each one's weight goes to each of its variables' groups."""
    p, kept = part
    p = weighed(plan, p if kept is None else p.take(kept))
    if cliques and plan.members is not None:
        vs = [p.cols[u] for u in plan.members.query.head]
        dense = _credited(vs, p.weight)
        if dense is not None:
            return Prefixes({plan.query.head[0]: dense[0]}, dense[1]), None
        p = Prefixes({plan.query.head[0]: np.concatenate(vs)}, np.tile(p.weight, len(vs)))
    cols = [p.cols[v] for v in plan.query.head]
    edge = np.zeros(len(p), dtype=bool)
    edge[:1] = True
    for c in cols:
        edge[1:] |= c[1:] != c[:-1]
    starts = np.flatnonzero(edge)
    sums = sums_at(p.weight, starts, row_namer(cols), AGGREGATED) if len(p) else p.weight
    keep = starts[sums != 0]
    head = {v: c[keep] for v, c in zip(plan.query.head, cols, strict=True)}
    return Prefixes(head, sums[sums != 0]), None


def _credited(
    cols: Sequence[np.ndarray], weight: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """The weights credited to the values of every column, summed per value by a dense count:
    the values (ascending) and their sums that are not 0; None (summed by sorting instead)
    when the values span more than twice the credits or a partial sum could leave the
    integers float64 holds exactly.

    >>> _credited([np.array([5, 6]), np.array([6, 7])], np.array([2, -2]))
    (array([5, 7]), array([ 2, -2]))
    """
    n = len(weight) * len(cols)
    if n == 0 or magnitude(weight) * n >= 1 << 53:
        return None
    lo = min(int(c.min()) for c in cols)
    span = max(int(c.max()) for c in cols) - lo + 1
    if span > 2 * n:
        return None
    w = weight.astype(np.float64)
    total = sum(np.bincount(c - lo, weights=w, minlength=span) for c in cols)
    at = np.flatnonzero(total)
    return at + lo, np.asarray(total)[at].astype(I64)


def weighed(plan: Plan, p: Prefixes) -> Prefixes:
    """Bindings of a sum(x) query (or its prefixes counted without x) with each weight times
    x where they bind it (a product leaving int64 raises naming the binding); others as they
    are."""
    agg = plan.query.aggregate
    if agg is not None and agg.var is not None and agg.var in p.cols:
        p.scale(p.cols[agg.var])
        check_overflow(plan, (p, None))
    return p


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
    made = allocate(vs, total, lead)
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


# A delta tuple the rule's start filters keep costs about this many candidates' work before it
# proposes any: its counts and key ranges are looked up at random places of the arrangements,
# while the candidates are merged in order. Where the bindings are written (each projected and
# encoded) a candidate weighs more than where they are only counted. Measured with the
# compiled kernel on web-NotreDame's triangles (docs/benchmarks.md, "The executors' static
# path, issue 29").
PREFIX_WORK = 16
PREFIX_WORK_COUNTED = 128
# Shares are cut on the expected work of at most this many delta tuples, evenly spaced: the
# lookups of a whole 2 M-tuple delta cost each task 0.13 s, a sample a few milliseconds.
WEIGH_SAMPLE = 1 << 16


def weights(
    plan: Plan,
    rule: DeltaRule,
    layers: Layers,
    at: np.ndarray | None = None,
    *,
    counting: bool = False,
) -> np.ndarray:
    """The expected work of the delta tuples at positions `at` (every one: None): 0 for a tuple
    the rule's start filters drop, else its least candidate count at the rule's first step
    plus `PREFIX_WORK` (`PREFIX_WORK_COUNTED` when the bindings are only `counting`), to cut
    the delta into pieces of similar work (1 for a kept tuple of a rule without steps)."""
    plan, rule = enumerated(plan, rule, layers)
    d = delta_layer(plan, rule, layers)
    m = len(d) if at is None else len(at)
    start = plan.atom_vars[rule.delta]
    columns = d.columns()
    cols = {v: columns[i] if at is None else columns[i][at] for i, v in enumerate(start)}
    diff = d.diff if at is None else d.diff[at]
    keep = Prefixes(dict(cols), diff).passing(rule.start_filters)
    if not rule.steps or m == 0:
        return keep.astype(I64)
    least: np.ndarray | None = None
    for x in rule.steps[0].extenders:
        keys = [cols.get(plan.atom_vars[x.atom][k]) for k in x.key]
        if any(c is None for c in keys):  # a key bound by a check, not by the delta: skip it
            continue
        n = lookup_sum_of(
            layers.layers(*counts_source(x), x.version), [c for c in keys if c is not None], m
        )
        least = n if least is None else np.minimum(least, n)
    if least is None:
        return keep.astype(I64)
    work = least + (PREFIX_WORK_COUNTED if counting else PREFIX_WORK)
    return np.where(keep, work, 0)


def share_ranges(
    plan: Plan, rule: DeltaRule, layers: Layers, count: int, *, counting: bool = False
) -> list[tuple[int, int]]:
    """`count` consecutive ranges of the rule's delta tuples of about equal expected work
    (`weights`), cut on an evenly spaced sample of at most `WEIGH_SAMPLE` tuples."""
    n = len(delta_layer(plan, rule, layers))
    stride = max(1, -(-n // WEIGH_SAMPLE))
    at = None if stride == 1 else np.arange(0, n, stride, dtype=I64)
    cuts = shares(weights(plan, rule, layers, at, counting=counting), count)
    ends = [min(a * stride, n) for a, _ in cuts] + [n]
    return list(itertools.pairwise(ends))


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
    plan, rule = enumerated(plan, rule, layers)
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
