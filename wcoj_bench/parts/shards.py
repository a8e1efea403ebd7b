"""``wcoj-bench scale --shards``: the sharded deployment over k executors, simulated on one machine.

`wcoj_core.deploy.sharded` runs a rule as a chain of routed stages (`sharded.phases`: count
per extender, propose, validate per other extender), each stage's rows sent to the shard that
owns the key it looks up, every arrangement cut by its first column (`resident.shard_of`).
This part runs the same chain in one process over k shards: every stage of every delta rule of
a first load (epoch 0: the whole graph is the change) runs the real kernel calls
(`step.count_of`, `step.propose`, `step.validate`, `layer.lookup_sum_of`) on each shard's own
cut of the arrangements, its output routed to the next stage's shards as Spark's repartition
would. Two placements, side by side in one run:

* **by key** — today's `sharded`: a key's rows, its count and every lookup of it on
  ``shard_of(key)``;
* **split** — heavy keys split, as the skew-resilient variant of the founding distributed
  join describes: a key holding at least ``2 * slice_rows`` rows of an arrangement is cut by
  value into ``min(k, rows // slice_rows)`` slices on consecutive shards from its home shard;
  a count of a heavy key is a row every shard holds (there are few), so count lookups of it go
  to a shard picked by a hash of the prefix; a prefix whose fewest-candidates key is heavy is
  sent to every slice, each proposing its own part; a validation of ``(key, value)`` goes to
  the slice holding ``value``. Each candidate is still proposed once, so the answer is the
  same sum.

Work is counted, not modelled: per shard, the rows it received (each one lookup: a count, a
validation or a propose's search) plus the candidates it proposed; besides, its seconds in the
kernel calls, the bytes it received (the shuffle read: eight bytes a column a row), the
arrangement bytes it holds (int64 rows and diffs, as the simulation holds them) and its peak
(held bytes plus its largest stage batch in and out). Every run's summed answer is checked
against an independent count (numpy forward triangles; a scipy count of 4-cliques).

The graph: an R-MAT (numpy, the quadrant probabilities of ``rmat:``) plus ``hubs`` hub
vertices in a clique, each joined to distinct uniform R-MAT vertices up to ``hub_degree``
neighbours; the hubs are vertices ``0 .. hubs - 1`` (the R-MAT's ids shifted past them), as
an R-MAT numbers its own heaviest vertices first.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import Any

import numpy as np

from wcoj_core.deploy.resident import shard_of
from wcoj_core.deploy.sharded import Phase, ends_step, phases
from wcoj_core.generate import parse_generator_spec
from wcoj_core.kernel.changes import counts_delta, support_delta
from wcoj_core.kernel.index import EpochLayers, TraceIndex
from wcoj_core.kernel.join import check_overflow
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import Layer, lookup_sum_of
from wcoj_core.kernel.step import (
    Prefixes,
    count_of,
    counts_source,
    pick,
    pieces,
    propose,
    support_source,
    validate,
)
from wcoj_core.query.builtins import builtin
from wcoj_core.query.ir import Var
from wcoj_core.query.plan import AtomView, DeltaRule, Kind, Plan, Version, plan_query
from wcoj_core.traces import counts_trace_name, relation_columns, relation_trace_name

DEFAULT_RMAT = "rmat:scale=17,edges=600000,seed=1"
DEFAULT_HUBS = 100
DEFAULT_HUB_DEGREE = 10_000
DEFAULT_SHARDS = (2, 8, 32, 64)
DEFAULT_QUERIES = ("triangles", "4-cliques")
SLICE_ROWS = 64  # a key of at least twice this many rows is split
BUDGET = 1 << 20  # rows a stage hands on at once (and candidates a propose makes at once)
TARGET = 1.25  # the per-shard work max/mean
PLACEMENTS = ("by key", "split")

TAG = Var("_tag")
LEAST = Var("_least")
Say = Callable[[str], None]
ArrangementKey = tuple[str, AtomView | None, tuple[int, ...]]


# -- the graph and its independent counts -----------------------------------------------------


def rmat_pairs(spec: str) -> tuple[np.ndarray, np.ndarray]:
    """An R-MAT's edges (numpy, `spec` as ``rmat:`` takes it), loops and repeats kept."""
    p = parse_generator_spec(spec)
    rng = np.random.default_rng(p["seed"])
    src = np.zeros(p["edges"], dtype=I64)
    dst = np.zeros(p["edges"], dtype=I64)
    cuts = np.cumsum([p["a"], p["b"], p["c"]])
    for level in range(p["scale"]):
        q = np.searchsorted(cuts, rng.random(p["edges"]), "right")
        bit = 1 << (p["scale"] - 1 - level)
        src |= (q >= 2) * bit
        dst |= (q % 2 == 1) * bit
    return src, dst


def hub_graph(spec: str, hubs: int, hub_degree: int, seed: int = 7) -> np.ndarray:
    """The R-MAT of `spec` (ids shifted by `hubs`) plus `hubs` vertices ``0 ..``, in a clique, each
    joined to distinct uniform R-MAT vertices up to `hub_degree` neighbours: the undirected
    edges as sorted unique ``(low, high)`` rows, no loops."""
    src, dst = rmat_pairs(spec)
    n = 1 << parse_generator_spec(spec)["scale"]
    rng = np.random.default_rng(seed)
    src, dst = src + hubs, dst + hubs
    ids = np.arange(hubs, dtype=I64)
    a, b = np.triu_indices(hubs, 1)
    parts = [(src, dst), (ids[a], ids[b])]
    extra = min(max(hub_degree - (hubs - 1), 0), n)
    for h in ids:
        drawn = np.unique(rng.integers(0, n, 2 * extra + 16))  # distinct, then in random order
        while len(drawn) < extra:
            drawn = np.union1d(drawn, rng.integers(0, n, extra))
        parts.append((np.full(extra, h), hubs + rng.permutation(drawn)[:extra]))
    lo = np.concatenate([np.minimum(s, d) for s, d in parts])
    hi = np.concatenate([np.maximum(s, d) for s, d in parts])
    keep = lo != hi
    return np.unique(np.column_stack([lo[keep], hi[keep]]), axis=0)


def four_cliques(edges: np.ndarray) -> int:
    """The 4-cliques of an undirected simple graph, by scipy, independently of wcoj's kernel:
    edges oriented from lower to higher (degree, id) rank, then each vertex's out-neighbours'
    oriented triangles counted as ``sum((S @ S) * S)`` of their induced matrix ``S``."""
    from scipy.sparse import csr_matrix

    ids, index = np.unique(edges, return_inverse=True)
    index = index.reshape(-1, 2)
    n = len(ids)
    degree = np.bincount(index.ravel(), minlength=n)
    rank = np.empty(n, dtype=I64)
    rank[np.lexsort((np.arange(n), degree))] = np.arange(n)
    a, b = rank[index[:, 0]], rank[index[:, 1]]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    up = csr_matrix((np.ones(len(lo), dtype=I64), (lo, hi)), shape=(n, n))
    up.sort_indices()
    total = 0
    for u in np.flatnonzero(np.diff(up.indptr) >= 3):
        out = up.indices[up.indptr[u] : up.indptr[u + 1]]
        sub = up[out][:, out]
        total += int((sub @ sub).multiply(sub).sum())
    return total


def first_load(plan: Plan, edges: np.ndarray) -> EpochLayers:
    """What epoch 0 of an undirected `edge` reads: nothing old, every edge both ways as the
    change, and the counts arrangements the plan uses made from it."""
    name = relation_trace_name("edge")
    both = np.concatenate([edges, edges[:, ::-1]])
    traces = {name: TraceIndex.of(tuple(relation_columns(2)), Layer.empty(2), ())}
    deltas = {name: Layer.build(both, np.ones(len(both), dtype=I64))}
    layers = EpochLayers(traces, deltas)
    for a in plan.arrangements:
        if a.kind is Kind.COUNTS:
            counted = counts_trace_name(a)
            cols = tuple(f"c{k}" for k in a.key)
            traces[counted] = TraceIndex.of(cols, Layer.empty(len(a.key)), ())
            deltas[counted] = counts_delta(support_delta(layers, a.view), a.key)
    return layers


# -- where rows lie ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one arrangement's rows lie over `shards`: a light key's on ``shard_of(key)``; a
    heavy key's (`heavy`, sorted) in slices by value from its `home` shard on (`bounds`: each
    slice's first value, packed as heavy index << 32 | value; `first`: each key's first slice),
    or, for a counts arrangement (`replicated`), its one row on every shard."""

    shards: int
    heavy: np.ndarray
    home: np.ndarray
    bounds: np.ndarray
    first: np.ndarray
    replicated: bool

    @classmethod
    def of(cls, layers: Sequence[Layer], shards: int, slice_rows: int | None) -> Placement:
        """The placement of an arrangement held as `layers` (None `slice_rows`: by key only)."""
        held = [x for x in layers if len(x)]
        width = held[0].width if held else 0
        empty = np.zeros(0, dtype=I64)
        if slice_rows is None or shards == 1 or width not in (1, 2):
            return cls(shards, empty, empty, empty, empty, False)
        rows = np.concatenate([x.rows for x in held])
        if width == 1:  # a counts arrangement: the key's count is its diff
            keys, at = np.unique(rows[:, 0], return_inverse=True)
            sizes = np.bincount(at, weights=np.concatenate([x.diff for x in held]))
            heavy = keys[sizes >= 2 * slice_rows]
            return cls(shards, heavy, shard_of(heavy, shards), empty, empty, True)
        if rows.min() < 0 or rows.max() >= 1 << 31:
            raise ValueError("the simulation places ids in [0, 2**31) only")
        pairs = (rows[:, 0] << 32) | rows[:, 1]  # each key's values, in order
        if len(held) > 1:
            pairs = np.sort(pairs)
            pairs = pairs[np.concatenate([[True], pairs[1:] != pairs[:-1]])]
        starts = np.flatnonzero(np.concatenate([[True], np.diff(pairs >> 32) != 0]))
        keys, sizes = pairs[starts] >> 32, np.diff(np.append(starts, len(pairs)))
        big = sizes >= 2 * slice_rows
        heavy, sizes, starts = keys[big], sizes[big], starts[big]
        slices = np.minimum(shards, sizes // slice_rows)
        which = np.repeat(np.arange(len(heavy)), slices)
        step = np.arange(int(slices.sum())) - np.repeat(np.cumsum(slices) - slices, slices)
        at = starts[which] + step * sizes[which] // slices[which]
        bounds = (which << 32) | (pairs[at] & 0xFFFFFFFF)
        first = np.cumsum(slices) - slices
        return cls(shards, heavy, shard_of(heavy, shards), bounds, first, False)

    def _heavy(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which rows' keys are heavy, and each one's index among the heavy keys."""
        if not len(self.heavy):
            return np.zeros(len(keys), dtype=bool), np.zeros(len(keys), dtype=I64)
        at = np.minimum(np.searchsorted(self.heavy, keys), len(self.heavy) - 1)
        return self.heavy[at] == keys, at

    def owner(
        self, keys: np.ndarray, values: np.ndarray | None, spread: Callable[[], np.ndarray]
    ) -> np.ndarray:
        """The shard a lookup of each ``(key, value)`` goes to (a row's shard, for a stored
        row): a light key's, a heavy key's slice holding the value, a replicated count's where
        `spread` sends it."""
        out = shard_of(keys, self.shards)
        big, at = self._heavy(keys)
        if not big.any():
            return out
        if self.replicated or values is None:
            out[big] = spread()[big]
            return out
        packed = (at[big] << 32) | values[big]
        piece = np.maximum(np.searchsorted(self.bounds, packed, "right") - 1, self.first[at[big]])
        out[big] = (self.home[at[big]] + piece - self.first[at[big]]) % self.shards
        return out

    def spans(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each key's first shard and how many consecutive shards hold its rows."""
        start = shard_of(keys, self.shards)
        count = np.ones(len(keys), dtype=I64)
        big, at = self._heavy(keys)
        if big.any() and not self.replicated:
            ends = np.append(self.first, len(self.bounds))
            start[big] = self.home[at[big]]
            count[big] = ends[at[big] + 1] - ends[at[big]]
        return start, count

    def cut(self, layer: Layer) -> list[Layer]:
        """A layer's rows per shard (a replicated heavy count on every shard)."""
        if not len(layer) or not layer.width:  # a total count: every shard holds it
            return [layer] * self.shards
        rows, diff = layer.rows, layer.diff
        values = rows[:, 1] if rows.shape[1] == 2 else None
        big = self._heavy(rows[:, 0])[0] if self.replicated else np.zeros(len(rows), dtype=bool)
        where = self.owner(rows[:, 0], values, lambda: np.zeros(len(rows), dtype=I64))
        where[big] = self.shards  # replicated: apart
        order = np.argsort(where, kind="stable")  # each shard's rows stay sorted
        ends = np.cumsum(np.bincount(where, minlength=self.shards + 1))
        everywhere = order[ends[self.shards - 1] :]
        out = []
        for s in range(self.shards):
            mine = order[(ends[s - 1] if s else 0) : ends[s]]
            if len(everywhere):
                both = np.concatenate([mine, everywhere])
                out.append(Layer.build(rows[both], diff[both]))
            else:
                out.append(Layer(rows[mine], diff[mine]))
        return out


# -- the stages, run shard by shard ---------------------------------------------------------


@dataclass
class ShardTally:
    """What one shard did: rows received (each a lookup), candidates proposed, seconds in its
    stages, bytes received, and its largest stage batch (bytes in plus out)."""

    rows: int = 0
    proposed: int = 0
    seconds: float = 0.0
    bytes_in: int = 0
    batch_peak: int = 0

    @property
    def work(self) -> int:
        return self.rows + self.proposed


def _nbytes(p: Prefixes) -> int:
    return 8 * len(p) * (len(p.cols) + 1)


def _concat(parts: Sequence[Prefixes]) -> Prefixes:
    if len(parts) == 1:
        return parts[0]
    cols = {v: np.concatenate([p.cols[v] for p in parts]) for v in parts[0].cols}
    return Prefixes(cols, np.concatenate([p.weight for p in parts]))


def _spread(p: Prefixes, shards: int) -> np.ndarray:
    """A shard for each row by a hash of its bindings (where a lookup any shard can answer
    goes)."""
    h = np.full(len(p), 0x243F6A8885A308D3, dtype=np.uint64)
    for c in p.cols.values():
        h ^= np.asarray(c, dtype=I64).view(np.uint64)
        h *= np.uint64(0x100000001B3)
        h ^= h >> np.uint64(29)
    return (h % np.uint64(shards)).astype(I64)


@dataclass
class Simulation:
    """One plan's first load over `shards` shards, placed by key or split (`slice_rows`)."""

    plan: Plan
    whole: EpochLayers
    shards: int
    slice_rows: int | None
    collect: bool = False
    budget: int = BUDGET
    tallies: list[ShardTally] = field(default_factory=list)
    answer: int = 0
    found: Counter[tuple[int, ...]] = field(default_factory=Counter)
    _placed: dict[ArrangementKey, Placement] = field(default_factory=dict)
    _cuts: dict[tuple[ArrangementKey, int], list[Layer]] = field(default_factory=dict)
    _phase_cache: dict[int, list[Phase]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tallies = [ShardTally() for _ in range(self.shards)]

    def placement(self, key: ArrangementKey) -> Placement:
        if key not in self._placed:
            layers = self.whole.layers(*key, Version.NEW)
            self._placed[key] = Placement.of(layers, self.shards, self.slice_rows)
        return self._placed[key]

    def layers(self, key: ArrangementKey, version: Version, shard: int) -> list[Layer]:
        """Shard `shard`'s cut of an arrangement as of `version` (each layer cut once)."""
        out = []
        for x in self.whole.layers(*key, version):
            if (key, id(x)) not in self._cuts:
                self._cuts[key, id(x)] = self.placement(key).cut(x)
            out.append(self._cuts[key, id(x)][shard])
        return out

    def held_bytes(self) -> list[int]:
        """Each shard's arrangement bytes (every cut it holds, rows and diffs)."""
        out = [0] * self.shards
        for cut in self._cuts.values():
            for s, x in enumerate(cut):
                out[s] += x.rows.nbytes + x.diff.nbytes if len(x) else 0
        return out

    # -- routing --

    def _routed(self, rule: DeltaRule, at: int, p: Prefixes) -> Iterator[tuple[int, Prefixes]]:
        """Rows for stage `at` by the shard each goes to (a heavy winner's to each slice)."""
        if at >= len(self._phases(rule)):
            yield -1, p
            return
        phase = self._phases(rule)[at]
        spread = cache(partial(_spread, p, self.shards))
        av = self.plan.atom_vars
        index = np.arange(len(p))
        if phase.kind == "check":
            check = next(c for c in rule.checks if c.atom == phase.atom)
            vs = av[check.atom]
            key = (relation_trace_name(check.view.relation), check.view, tuple(range(len(vs))))
            values = p.cols[vs[1]] if len(vs) == 2 else None
            dest = self.placement(key).owner(p.cols[vs[0]], values, spread)
        elif phase.kind == "count":
            x = rule.steps[phase.step].extenders[phase.index]
            if x.key:
                keys = p.cols[av[x.atom][x.key[0]]]
                dest = self.placement(counts_source(x)).owner(keys, None, spread)
            else:  # the total count, on every shard
                dest = spread()
        elif phase.kind == "validate":
            y = rule.steps[phase.step].extenders[phase.index]
            values = p.cols[av[y.atom][y.value]]
            keys, values = (p.cols[av[y.atom][y.key[0]]], values) if y.key else (values, None)
            dest = self.placement(support_source(y)).owner(keys, values, spread)
        else:  # propose: to the shards holding the winner's key (each slice of a heavy one)
            start = np.zeros(len(p), dtype=I64)
            span = np.ones(len(p), dtype=I64)
            for j, x in enumerate(rule.steps[phase.step].extenders):
                mine = np.flatnonzero(p.cols[TAG] == j)
                if not x.key:  # proposes from the whole arrangement, anywhere
                    start[mine] = spread()[mine]
                    continue
                keys = p.cols[av[x.atom][x.key[0]]][mine]
                start[mine], span[mine] = self.placement(support_source(x)).spans(keys)
            index = np.repeat(index, span)
            offset = np.arange(len(index)) - np.repeat(np.cumsum(span) - span, span)
            dest = (np.repeat(start, span) + offset) % self.shards
        order = np.argsort(dest, kind="stable")
        ends = np.cumsum(np.bincount(dest, minlength=self.shards))
        q = p.take(index[order])
        for s in range(self.shards):
            a, b = (int(ends[s - 1]) if s else 0), int(ends[s])
            if b > a:
                yield s, Prefixes({v: c[a:b] for v, c in q.cols.items()}, q.weight[a:b])

    def _phases(self, rule: DeltaRule) -> list[Phase]:
        if id(rule) not in self._phase_cache:
            self._phase_cache[id(rule)] = phases(rule)
        return self._phase_cache[id(rule)]

    # -- the stages --

    def run(self) -> Simulation:
        """Every delta rule of the first load, its start rows read round-robin by the shards."""
        for rule in self.plan.rules:
            self._place(rule)
            view = self.plan.views[rule.delta]
            name = relation_trace_name(view.relation)
            d = self.whole.delta(name, view, tuple(range(view.arity)))
            for lo in range(0, len(d), self.budget):
                rows, diff = d.rows[lo : lo + self.budget], d.diff[lo : lo + self.budget]
                p = Prefixes({v: rows[:, i] for i, v in enumerate(rule.start)}, diff.copy())
                p = p.filtered(rule.start_filters)
                inbox: list[list[Prefixes]] = [[] for _ in range(self.shards)]
                for s in range(self.shards):
                    part = p.take(np.arange(s, len(p), self.shards))
                    self.tallies[s].rows += len(part)
                    for dest, out in self._routed(rule, 0, part):
                        inbox[dest].append(out)
                self._stage(rule, 0, inbox)
        return self

    def _place(self, rule: DeltaRule) -> None:
        """Cut every arrangement the rule reads before its stages run (not timed as theirs)."""
        for check in rule.checks:
            name = relation_trace_name(check.view.relation)
            self.layers((name, check.view, tuple(range(check.view.arity))), check.version, 0)
        for step in rule.steps:
            for x in step.extenders:
                self.layers(support_source(x), x.version, 0)
                self.layers(counts_source(x), x.version, 0)

    def _stage(self, rule: DeltaRule, at: int, inbox: list[list[Prefixes]]) -> None:
        """Stage `at` on every shard's rows, handing its output on a budget at a time."""
        if at == len(self._phases(rule)):
            for parts in inbox:
                for p in parts:
                    self._finish(p)
            return
        out: list[list[Prefixes]] = [[] for _ in range(self.shards)]
        held = 0
        for s, parts in enumerate(inbox):
            if not parts:
                continue
            p = _concat(parts)
            tally = self.tallies[s]
            tally.rows += len(p)
            tally.bytes_in += _nbytes(p)
            began = time.perf_counter()
            for made in self._run_phase(rule, at, s, p):
                tally.batch_peak = max(tally.batch_peak, _nbytes(p) + _nbytes(made))
                for dest, routed in self._routed(rule, at + 1, made):
                    out[dest].append(routed)
                    held += len(routed)
                if held > self.budget:
                    tally.seconds += time.perf_counter() - began
                    self._stage(rule, at + 1, out)
                    out, held = [[] for _ in range(self.shards)], 0
                    began = time.perf_counter()
            tally.seconds += time.perf_counter() - began
        if held:
            self._stage(rule, at + 1, out)

    def _finish(self, p: Prefixes) -> None:
        self.answer += int(p.weight.sum())
        if self.collect:
            head = [p.cols[v] for v in self.plan.query.head]
            for row, w in zip(zip(*head, strict=True), p.weight, strict=True):
                self.found[tuple(int(x) for x in row)] += int(w)

    def _run_phase(self, rule: DeltaRule, at: int, shard: int, p: Prefixes) -> Iterator[Prefixes]:
        """One stage on one shard: the same kernel calls `sharded` makes."""
        phase = self._phases(rule)[at]
        plan = self.plan

        def source(key: ArrangementKey, version: Version) -> list[Layer]:
            return self.layers(key, version, shard)

        if phase.kind == "check":
            check = next(c for c in rule.checks if c.atom == phase.atom)
            key = (relation_trace_name(check.view.relation), check.view)
            layers = source((*key, tuple(range(check.view.arity))), check.version)
            m = lookup_sum_of(layers, [p.cols[v] for v in plan.atom_vars[check.atom]], len(p))
            keep = np.flatnonzero(m)
            p = p.take(keep)
            p.scale(m[keep])
            check_overflow(plan, (p, None))
            yield p
            return
        step = rule.steps[phase.step]
        if phase.kind == "count":
            x = step.extenders[phase.index]
            n = count_of(plan, x, p, _ShardLayers(self, shard))
            keep = np.flatnonzero(n > 0)
            p = p.take(keep)
            p.cols[Var(f"_n{phase.index}")] = n[keep]
            if phase.index == len(step.extenders) - 1:
                names = [Var(f"_n{j}") for j in range(len(step.extenders))]
                counts = np.stack([p.cols.pop(v) for v in names])
                tag, least = pick(counts) if len(p) else (np.zeros(0, I64), np.zeros(0, I64))
                p.cols[TAG], p.cols[LEAST] = tag.astype(I64), least
            yield p
            return
        if phase.kind == "propose":
            for j, x in enumerate(step.extenders):
                mine = p.take(np.flatnonzero(p.cols[TAG] == j))
                # Without a key it enumerates its whole arrangement (read unsharded, as `sharded`).
                whole = self.whole.layers(*support_source(x), x.version)
                layers = source(support_source(x), x.version) if x.key else whole
                for a, b in pieces(mine.cols[LEAST], self.budget) if len(mine) else []:
                    part, made = propose(plan, step, x, mine.take(np.arange(a, b)), layers)
                    check_overflow(plan, (part, None))
                    self.tallies[shard].proposed += made
                    part.cols[TAG] = np.full(len(part), j, dtype=I64)
                    yield self._ended(rule, phase, part)
            return
        y = step.extenders[phase.index]
        own = p.cols[TAG] == phase.index
        checked = np.flatnonzero(~own)
        part = p.take(checked)
        kept, m = validate(plan, y, part, source(support_source(y), y.version))
        held = part.take(kept)
        if y.completes and m is not None:
            held.scale(m[kept])
        check_overflow(plan, (held, None))
        out = p.take(np.concatenate([np.flatnonzero(own), checked[kept]]))
        out.weight = np.concatenate([p.weight[own], held.weight])
        yield self._ended(rule, phase, out)

    def _ended(self, rule: DeltaRule, phase: Phase, p: Prefixes) -> Prefixes:
        """Rows out of a stage: its step's bookkeeping dropped once the step is done."""
        if ends_step(rule, phase):
            p.cols.pop(TAG, None)
            p.cols.pop(LEAST, None)
        return p


@dataclass(frozen=True, slots=True)
class _ShardLayers:
    """One shard's arrangements as the kernel's `Layers` (for `count_of`)."""

    sim: Simulation
    shard: int

    def layers(
        self, name: str, view: AtomView | None, order: tuple[int, ...], version: Version
    ) -> list[Layer]:
        return self.sim.layers((name, view, order), version, self.shard)

    def delta(self, name: str, view: AtomView | None, order: tuple[int, ...]) -> Layer:
        got = self.sim.layers((name, view, order), Version.DELTA, self.shard)
        return got[0] if got else Layer.empty(len(order))


# -- the part ---------------------------------------------------------------------------------


def simulate(
    query: str, edges: np.ndarray, shards: int, slice_rows: int | None, collect: bool = False
) -> Simulation:
    """One built-in query's first load of `edges` over `shards` shards (`slice_rows` None:
    placed by key, as `sharded` places it today)."""
    plan = plan_query(builtin(query), {"edge": 2 * len(edges)})
    return Simulation(plan, first_load(plan, edges), shards, slice_rows, collect).run()


def summary(sim: Simulation, seconds: float) -> dict[str, Any]:
    """One run's per-shard figures and their max/mean."""
    work = [t.work for t in sim.tallies]
    held = sim.held_bytes()
    peak = [h + t.batch_peak for h, t in zip(held, sim.tallies, strict=True)]

    def ratio(xs: Sequence[float]) -> float:
        mean = sum(xs) / len(xs)
        return round(max(xs) / mean, 3) if mean else 1.0

    return {
        "answer": sim.answer,
        "seconds": round(seconds, 2),
        "work": work,
        "work_max_mean": ratio(work),
        "kernel_seconds_max_mean": ratio([t.seconds for t in sim.tallies]),
        "bytes_in": [t.bytes_in for t in sim.tallies],
        "bytes_in_max_mean": ratio([t.bytes_in for t in sim.tallies]),
        "held_bytes_max": max(held),
        "held_bytes_total": sum(held),
        "peak_bytes_max": max(peak),
        "peak_max_mean": ratio(peak),
        "proposed": sum(t.proposed for t in sim.tallies),
    }


def run_shards(
    rmat: str,
    hubs: int,
    hub_degree: int,
    shards: Sequence[int],
    queries: Sequence[str],
    slice_rows: int,
    say: Say,
) -> dict[str, Any]:
    """Both placements at every k, for every query, each run's answer checked against an
    independent count of the graph."""
    import os

    edges = hub_graph(rmat, hubs, hub_degree)
    degree = np.bincount(edges.ravel())
    least = int(degree[:hubs].min()) if hubs else 0
    say(f"graph: {len(edges):,} edges, hubs of degree {least:,} or more")
    report: dict[str, Any] = {
        "graph": {
            "rmat": rmat,
            "hubs": hubs,
            "hub_degree": hub_degree,
            "edges": len(edges),
            "max_degree": int(degree.max()),
            "min_hub_degree": least,
        },
        "slice_rows": slice_rows,
        "load_before": [round(v, 2) for v in os.getloadavg()],
        "queries": {},
    }
    for query in queries:
        began = time.perf_counter()
        if query == "triangles":
            from wcoj_bench.infra.probes import forward_triangles

            truth = forward_triangles(edges[:, 0], edges[:, 1])
        elif query == "4-cliques":
            truth = four_cliques(edges)
        else:
            raise ValueError(f"no independent count of {query} (triangles, 4-cliques)")
        say(f"{query}: {truth:,} by the independent count ({time.perf_counter() - began:.1f} s)")
        runs = []
        for k in shards:
            for placement in PLACEMENTS:
                began = time.perf_counter()
                sim = simulate(query, edges, k, slice_rows if placement == "split" else None)
                got = {"shards": k, "placement": placement, **summary(sim, 0.0)}
                got["seconds"] = round(time.perf_counter() - began, 2)
                got["exact"] = got["answer"] == truth
                runs.append(got)
                say(
                    f"  k={k:>2} {placement:<6} work max/mean {got['work_max_mean']:.3f}, "
                    f"bytes in {got['bytes_in_max_mean']:.3f}, peak {got['peak_max_mean']:.3f}, "
                    f"{'exact' if got['exact'] else 'WRONG'} ({got['seconds']:.1f} s)"
                )
        report["queries"][query] = {"truth": truth, "runs": runs}
    report["load_after"] = [round(v, 2) for v in os.getloadavg()]
    report["targets"] = targets(report)
    return report


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's target: split, work max/mean ≤ 1.25 at every k of every query, exact."""
    out = []
    for query, q in report["queries"].items():
        for r in q["runs"]:
            if r["placement"] == "split":
                ok = r["exact"] and r["work_max_mean"] <= TARGET
                out.append(
                    {
                        "target": f"{query} k={r['shards']}: work max/mean ≤ {TARGET}, exact",
                        "measured": f"{r['work_max_mean']:.3f}, exact={r['exact']}",
                        "met": ok,
                    }
                )
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    """Per-shard work max/mean against k, both placements, every query."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for query, q in report["queries"].items():
        for placement, style in zip(PLACEMENTS, ("--", "-"), strict=True):
            runs = [r for r in q["runs"] if r["placement"] == placement]
            ks = [r["shards"] for r in runs]
            ax.plot(ks, [r["work_max_mean"] for r in runs], style, marker="o",
                    label=f"{query}, {placement}")  # fmt: skip
    ax.axhline(TARGET, color="grey", linewidth=0.8, label=f"target {TARGET}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("shards (k)")
    ax.set_ylabel("per-shard work, max / mean")
    g = report["graph"]
    ax.set_title(f"{g['edges']:,} edges, {g['hubs']} hubs of degree ≥ {g['min_hub_degree']:,}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
