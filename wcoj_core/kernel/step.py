"""One step of a delta rule: count, pick the fewest, propose and validate (`wcoj_core.kernel.join`).

Each phase is one loop of the compiled kernel (`wcoj_core.kernel.native`) over the step's
prefixes: `count` (every extender's candidates, the fewest picked, dead prefixes dropped) and
`extend` (the winner proposes its key's range within the filters' bounds, merged over its
layers; every other extender validates by galloping through its own range; only survivors are
written, or, counting, only counted). A loop over many prefixes runs on several threads, each
taking chunks of prefixes, committed in order. `propose` and `validate` run one extender's side
alone, for a deployment that validates in a stage of its own (`wcoj_core.deploy.sharded`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wcoj_core.errors import MultiplicityOverflow
from wcoj_core.kernel.index import Layers
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import (
    CONSTANT,
    ITSELF,
    OPS,
    OVER_LAYERS,
    PREFIX_COL,
    Layer,
    NativeFilter,
    contiguous,
    damaged,
    lookup_sum_of,
    native_outcome,
    present,
)
from wcoj_core.kernel.multiplicity import times
from wcoj_core.kernel.native import native
from wcoj_core.query.ir import CmpOp, Filter, Var
from wcoj_core.query.plan import AtomView, Extender, Plan, Step
from wcoj_core.traces import counts_trace_name, relation_trace_name


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

    def passing(self, filters: Sequence[Filter]) -> np.ndarray:
        """Which rows pass every filter (a boolean mask)."""
        return _filter_mask(self, filters)


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


def support_source(x: Extender) -> tuple[str, AtomView | None, tuple[int, ...]]:
    """Where extender `x` proposes from: the trace, its view, and the columns (key, value)."""
    if x.completes:
        return relation_trace_name(x.view.relation), x.view, (*x.key, x.value)
    cols = x.support.key  # sorted view columns: key + value
    return counts_trace_name(x.support), None, tuple(cols.index(c) for c in (*x.key, x.value))


def counts_source(x: Extender) -> tuple[str, None, tuple[int, ...]]:
    """Where extender `x` counts from: its counts trace, keyed by its key."""
    return counts_trace_name(x.counts), None, tuple(range(len(x.key)))


@dataclass(frozen=True, slots=True)
class Live:
    """The prefixes a step's count kept (their positions), the extender with the fewest
    candidates for each (`tag`) and that number (`least`); `joins`, the rows out of the
    count's lookups (each extender's prefixes still alive after it); `extenders`, the step's
    extenders as the count handed them to the kernel, for `extend` to hand on."""

    rows: np.ndarray
    tag: np.ndarray
    least: np.ndarray
    joins: int
    extenders: list[NativeExtender]

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
    plan: Plan, x: Extender, names: Sequence[Var], layers: Layers, m: int, counted: bool = True
) -> NativeExtender:
    """Extender `x` as the compiled kernel reads it: its source layers, its counts layers
    (None: counted by its source layers' ranges; only one layer's unless not `counted`), its
    key's prefix columns, completes."""
    source = [layer for layer in layers.layers(*support_source(x), x.version) if len(layer)]
    counts = None
    if len(source) > 1 and counted:
        counts = [layer.spec(m) for layer in layers.layers(*counts_source(x), x.version)]
    key = tuple(names.index(plan.atom_vars[x.atom][k]) for k in x.key)
    return [layer.spec(m, values=not key) for layer in source], counts, key, x.completes


def native_extenders(
    plan: Plan, step: Step, names: Sequence[Var], layers: Layers, m: int
) -> list[NativeExtender]:
    """The step's extenders as the compiled kernel reads them, for `m` prefixes binding `names`."""
    return [_native_extender(plan, x, names, layers, m) for x in step.extenders]


def _damaged(xs: Sequence[NativeExtender]) -> None:
    """Raise for a mapped layer of the extenders in which the kernel found a damaged block."""
    damaged(spec for x in xs for spec in [*x[0], *(x[1] or ())])


def count(
    plan: Plan,
    step: Step,
    prefixes: Prefixes,
    layers: Layers,
    threads: int = 1,
    extenders: list[NativeExtender] | None = None,
) -> Live:
    """Count and pick: each extender's number of candidates per prefix, the prefixes left with
    none in some extender dropped, and for the others the extender with the fewest.
    `extenders`: the step's, made before (`native_extenders`) for the same layers."""
    m = len(prefixes)
    xs = extenders or native_extenders(plan, step, list(prefixes.cols), layers, m)
    rows = np.empty(m, dtype=I64)
    tag = np.empty(m, dtype=I64)
    least = np.empty(m, dtype=I64)
    alive = np.empty(len(xs), dtype=I64)
    cols = contiguous(prefixes.cols.values())
    kept = native.count(xs, cols, m, rows, tag, least, alive, _threads(m, threads), COUNT_CHUNK)
    _damaged(xs)
    if kept < 0:
        raise MultiplicityOverflow(OVER_LAYERS, tuple(int(c[-kept - 1]) for c in cols))
    return Live(rows[:kept], tag[:kept], least[:kept], int(alive.sum()), xs)


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
    per: np.ndarray | None = None,
    value: bool = False,
) -> Extended:
    """Propose and validate, for the live prefixes of `piece`: each one's extender with the
    fewest candidates proposes, every other validates; the bindings come out in prefix
    order, the step's variable last. The columns of `lead` (variables of the bindings) are
    written as one column-major block (`head_block`). With `counting`, nothing is written:
    the bindings are counted and their weights summed (times the step's variable with
    `value`), each prefix's sum also written at its row of `per` when given (an aggregate)."""
    names = list(prefixes.cols)
    a, b = piece
    cap = 0 if counting else int(live.least[a:b].sum())
    # The count's extenders: the same layers (a directory the count made is the layer's, so
    # extenders made again for fewer probes would hold the same).
    xs = live.extenders
    made = allocate([*names, step.var], cap, lead)
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
        per,
        value,
    )
    _damaged(xs)
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


def count_and_extend(
    plan: Plan,
    step: Step,
    prefixes: Prefixes,
    layers: Layers,
    counts: StepCounts,
    threads: int = 1,
    per: np.ndarray | None = None,
    value: bool = False,
    ranged: bool = False,
) -> Extended | None:
    """A count's last step in one pass: each prefix counted and picked as `count` does it,
    then proposed and validated as `extend` counting does, without the arrays of live rows,
    tags and least counts; the step's counts as the two would add them (`joins`: the count's
    rows alive after each extender, then the lookups). When some extender reads several
    layers (a warm epoch): None (`count`, then `extend`), or with `ranged` each counted by
    its key's ranges in its layers instead of its counts (no lookups but those extending
    makes: the prefixes and least counts it reports are then bounds, an entry a layer
    cancels still counted). `per` and `value` as `extend` takes them."""
    names = list(prefixes.cols)
    m = len(prefixes)
    xs = [_native_extender(plan, x, names, layers, m, counted=False) for x in step.extenders]
    if not ranged and any(len(x[0]) > 1 for x in xs):
        return None
    cols = contiguous(prefixes.cols.values())
    outcome = native.extend(
        cols,
        m,
        np.ascontiguousarray(prefixes.weight, dtype=I64),
        prefixes.overflow,
        None,
        None,
        0,
        m,
        xs,
        native_filters(step, names),
        None,
        None,
        None,
        None,
        0,
        _threads(m, threads),
        CHUNK_PREFIXES,
        per,
        value,
    )
    _damaged(xs)
    got = native_outcome(outcome, cols, [x[2] for x in xs])
    live, least, alive = (int(v) for v in outcome[10:13])
    counts.prefixes += live
    counts.min_sum += least
    counts.proposed += got.proposed
    counts.validated += got.rows
    made = allocate([*names, step.var], 0, ())
    return Extended(made, alive + got.proposed + got.passed, got.rows, got.total, got.flagged)


def allocate(vs: Sequence[Var], rows: int, lead: Sequence[Var]) -> Prefixes:
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
    xs = [([layer.spec(m, values=not key) for layer in held], None, key, x.completes)]
    cols = contiguous(mine.cols.values())
    rows = np.arange(m, dtype=I64)
    tag = np.zeros(m, dtype=I64)
    args = (cols, m, np.ascontiguousarray(mine.weight, dtype=I64), mine.overflow, rows, tag)
    filters = native_filters(step, names)
    counted = native.extend(*args, 0, m, xs, filters, None, None, None, None, 0)
    _damaged(xs)
    cap = native_outcome(counted, cols, [key]).rows
    made = allocate([*names, step.var], cap, ())
    flags = np.empty(cap, dtype=np.uint8)
    outcome = native.extend(
        *args, 0, m, xs, filters, tuple(made.cols.values()), None, made.weight, flags, cap
    )
    _damaged(xs)
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


def _filter_mask(p: Prefixes, filters: Sequence[Filter]) -> np.ndarray:
    keep = np.ones(len(p), dtype=bool)
    for f in filters:
        left = p.cols[f.left] if isinstance(f.left, Var) else np.int64(f.left.value)
        right = p.cols[f.right] if isinstance(f.right, Var) else np.int64(f.right.value)
        keep &= _cmp(f.op, np.asarray(left), np.asarray(right))
    return keep
