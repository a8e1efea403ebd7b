"""The executors deployment, sharded: for traces larger than one executor holds, on storage the
tasks cannot map.

When a work's traces do not fit an executor (`Choice.shards` > 1) and its tasks cannot search
mapped arrangement files instead (`wcoj_core.deploy.spark_job.routes`: a state on other
storage, or routing asked for), no task holds a whole arrangement. Every arrangement a rule reads (a trace through an atom's view, its columns in the
order the rule searches them) is cut into `shards` by its first column (`shard_of`), and the
prefixes travel to the shard owning the key of each lookup, as in BigJoin: a rule becomes a
chain of Spark stages, one per lookup, each a `repartition` on a routing column followed by a
`mapInArrow` that runs one phase of the kernel — count (per extender), propose (the winner's),
validate (per other extender) — against the shard it owns (`ShardLayers`, read from the state's
storage: the arrangement files mapped, or a state without them read from its batches a record
batch at a time and kept by the worker). Nothing but one Arrow batch of prefixes (and its
proposals, cut by the kernel's budget) — and, from batches, the shards — is ever held by a task.

Hub keys are not one giant group: a shard is served by `replicas` partitions, and each prefix
goes to one of them by a hash of its bindings, so a hub's prefixes spread over as many tasks
(each loading the hub's shard). The routing column holds, for partition ``p``, a value Spark's
hash partitioning sends to ``p`` (`Router`), so each task sees exactly one shard.

Counts changes are computed the same way (the old multiplicity of each changed tuple, looked up
in its shard), then summed per key by Spark; every output is summed by Spark before it is
written (an aggregate's per group: its full bindings, each weighed, are what the stages make).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from wcoj_core.deploy.resident import Resident, Shape, resident_for, shard_of
from wcoj_core.deploy.work import RuleJob, Work, opened_trace
from wcoj_core.kernel.changes import data_rows
from wcoj_core.kernel.join import RuleTally, check_overflow, weighed
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import Layer, lookup_sum_of
from wcoj_core.kernel.step import (
    Prefixes,
    StepCounts,
    count_of,
    pick,
    pieces,
    propose,
    support_source,
    validate,
)
from wcoj_core.query.ir import Var
from wcoj_core.query.plan import AtomView, DeltaRule, Plan, Version
from wcoj_core.traces import DIFF, relation_trace_name


def murmur3_long(value: int, seed: int = 42) -> int:
    """Spark's ``hash`` of a long (Murmur3 x86 32-bit, as `HashPartitioning` computes it).

    >>> murmur3_long(0), murmur3_long(1), murmur3_long(-7)
    (-1670924195, -1712319331, 222034016)
    """
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    def mix(h: int, k: int) -> int:
        k = (k * 0xCC9E2D51) & mask
        k = rotl(k, 15)
        k = (k * 0x1B873593) & mask
        h ^= k
        h = rotl(h, 13)
        return (h * 5 + 0xE6546B64) & mask

    v = value & 0xFFFFFFFFFFFFFFFF
    h = mix(mix(seed & mask, v & mask), v >> 32)
    h ^= 8
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


@dataclass(frozen=True, slots=True)
class Router:
    """Rows to partitions: shard ``s`` of `shards` is served by the `replicas` partitions
    ``s, s + shards, ...``; `values[p]` is a long Spark's hash partitioning sends to ``p``."""

    shards: int
    replicas: int
    values: tuple[int, ...]

    @classmethod
    def of(cls, shards: int, replicas: int) -> Router:
        partitions = shards * replicas
        values: dict[int, int] = {}
        candidate = 0
        while len(values) < partitions:
            values.setdefault(murmur3_long(candidate) % partitions, candidate)
            candidate += 1
        return cls(shards, replicas, tuple(values[p] for p in range(partitions)))

    @property
    def partitions(self) -> int:
        return self.shards * self.replicas

    def route(self, keys: np.ndarray | None, salt: np.ndarray) -> np.ndarray:
        """The routing value of each row: the shard of its key (shard 0 without a key), and
        one of the shard's partitions by its salt."""
        shard = np.zeros(len(salt), dtype=I64) if keys is None else shard_of(keys, self.shards)
        replica = (salt.view(np.uint64) % np.uint64(self.replicas)).astype(I64)
        return np.asarray(self.values, dtype=I64)[shard + self.shards * replica]

    def shard(self, partition: int) -> int:
        return partition % self.shards


class ShardLayers:
    """The `Layers` a task reads: every arrangement's shard `shard` (of `shards`), as of the
    work's old state plus the epoch's changes.

    A trace read with its index (`TraceRead.trace`: a state every executor reaches as files)
    is opened from its arrangement files, mapped (`opened_trace`, as the replicated tasks open
    it): the task searches only its shard's keys, so only their pages are read, and they are
    file pages, not the worker's memory — an executor smaller than the arrangements holds
    none of them, and a fresh Python worker (Spark ends one idle for a minute) opens them in
    milliseconds. Without an index, the shard is cut from the batches, read a record batch at a
    time, and kept by the worker (`Resident.index` with a `Shape`)."""

    def __init__(self, work: Work, resident: Resident, shard: int, shards: int) -> None:
        self.work = work
        self.reads = {r.name: r for r in work.reads}
        self.resident = resident
        self.shard = shard
        self.shards = shards

    def unsharded(self) -> ShardLayers:
        """The same arrangements whole (for a lookup no shard owns)."""
        return ShardLayers(self.work, self.resident, 0, 1)

    def _shape(self, view: AtomView | None, order: tuple[int, ...]) -> Shape:
        return Shape(view, order, self.shard, self.shards)

    def layers(
        self, name: str, view: AtomView | None, order: tuple[int, ...], version: Version
    ) -> list[Layer]:
        read = self.reads[name]
        ident = tuple(range(len(order)))
        out: list[Layer] = []
        if version is not Version.DELTA:
            if read.trace is not None:
                out += opened_trace(self.work, read, self.resident).layers(view, order)
            else:
                shape = self._shape(view, order)
                out += self.resident.index(name, read.columns, read.old, shape).layers(None, ident)
        if version is not Version.OLD and any(b.rows for b in read.delta):
            out.append(self.delta(name, view, order))
        return out

    def delta(self, name: str, view: AtomView | None, order: tuple[int, ...]) -> Layer:
        read = self.reads[name]
        return self.resident.read(read.columns, read.delta, self._shape(view, order))


# -- the phases of a rule, as routed stages ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Phase:
    """One routed stage of a rule: ``check`` (atom `atom`), ``count`` (extender `index` of step
    `step`; the last one also picks), ``propose`` or ``validate`` (extender `index`)."""

    kind: str
    step: int = -1
    index: int = -1
    atom: int = -1


def phases(rule: DeltaRule) -> list[Phase]:
    """The stages of a rule, in order (no validation where the proposer is alone)."""
    out = [Phase("check", atom=c.atom) for c in rule.checks]
    for k, step in enumerate(rule.steps):
        n = len(step.extenders)
        out += [Phase("count", k, j) for j in range(n)]
        out.append(Phase("propose", k))
        out += [Phase("validate", k, j) for j in range(n) if n > 1]
    return out


def ends_step(rule: DeltaRule, phase: Phase) -> bool:
    """Whether the rows out of `phase` are its step's validated bindings."""
    n = len(rule.steps[phase.step].extenders) if phase.step >= 0 else 0
    if phase.kind == "propose":
        return n == 1
    return phase.kind == "validate" and phase.index == n - 1


def _key(plan: Plan, rule: DeltaRule, phase: Phase, p: Prefixes) -> np.ndarray | None:
    """The values a phase looks up first, per row: they say which shard each row goes to."""
    if phase.kind == "check":
        check = next(c for c in rule.checks if c.atom == phase.atom)
        vs = plan.atom_vars[check.atom]
        return p.cols[vs[0]] if vs else None
    step = rule.steps[phase.step]
    if phase.kind == "propose":
        tags = p.cols[TAG]
        keys = np.zeros(len(p), dtype=I64)
        routed = False
        for j, x in enumerate(step.extenders):
            if x.key:
                mine = tags == j
                keys[mine] = p.cols[plan.atom_vars[x.atom][x.key[0]]][mine]
                routed = True
        return keys if routed else None
    x = step.extenders[phase.index]
    first = x.key[0] if x.key else (x.value if phase.kind == "validate" else None)
    return None if first is None else p.cols[plan.atom_vars[x.atom][first]]


TAG = Var("_tag")
LEAST = Var("_least")


def _columns(rule: DeltaRule, at: int, all_phases: list[Phase]) -> list[Var]:
    """The columns (variables and bookkeeping) of the rows out of stage `at` (-1: the start)."""
    bound = list(rule.start)
    for phase in all_phases[: at + 1]:
        if phase.kind == "propose":
            bound.append(rule.steps[phase.step].var)
    bound = list(dict.fromkeys(bound))
    if at < 0:
        return bound
    here = all_phases[at]
    if here.kind == "count":
        last = here.index == len(rule.steps[here.step].extenders) - 1
        return bound + ([TAG, LEAST] if last else [Var(f"_n{j}") for j in range(here.index + 1)])
    if here.kind in ("propose", "validate") and not ends_step(rule, here):
        return [*bound, TAG, LEAST]
    return bound


def _schema(cols: Sequence[Var]) -> str:
    return ", ".join(
        ["route long", "w long", "j long", "p long", *(f"`{v.name}` long" for v in cols)]
    )


def _to_prefixes(batch: pa.RecordBatch, cols: Sequence[Var]) -> Prefixes:
    return Prefixes(
        {v: batch.column(v.name).to_numpy() for v in cols}, batch.column("w").to_numpy()
    )


def _batch(
    p: Prefixes, cols: Sequence[Var], route: np.ndarray, joins: int = 0, proposed: int = 0
) -> pa.RecordBatch:
    n = len(p)
    extra = np.zeros(n, dtype=I64)
    j, made = extra.copy(), extra.copy()
    if n:
        j[0], made[0] = joins, proposed
    arrays = [pa.array(route), pa.array(p.weight.astype(I64)), pa.array(j), pa.array(made)]
    arrays += [pa.array(np.asarray(p.cols[v], dtype=I64)) for v in cols]
    return pa.RecordBatch.from_arrays(
        arrays, names=["route", "w", "j", "p", *(v.name for v in cols)]
    )


def _salt(p: Prefixes, cols: Sequence[Var]) -> np.ndarray:
    """A hash of each row's bindings: which of a shard's partitions it goes to (deterministic,
    so a stage run again routes every row as before)."""
    h = np.full(len(p), 0x243F6A8885A308D3, dtype=np.uint64)
    for v in cols:
        h ^= np.asarray(p.cols[v], dtype=I64).view(np.uint64)
        h *= np.uint64(0x100000001B3)
        h ^= h >> np.uint64(29)
    return h.view(I64)


def _start_task(
    work: Work,
    job: RuleJob,
    router: Router,
    all_phases: list[Phase],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """The rule's delta tuples (read by Spark) as prefixes, routed to the first stage."""
    from wcoj_core.kernel.layer import view_rows

    plan = work.plans[job.query]
    rule = plan.rules[job.rule]
    view = plan.views[rule.delta]
    cols = _columns(rule, -1, all_phases)
    width = len(work.plans[job.query].query.atoms[rule.delta].terms)
    for b in batches:
        rows = data_rows(b, [f"c{i}" for i in range(width)])
        got, picked = view_rows(view, rows)
        p = Prefixes(
            {v: got[:, i] for i, v in enumerate(rule.start)}, b.column(DIFF).to_numpy()[picked]
        )
        p = p.filtered(rule.start_filters)
        yield _routed(plan, rule, p, cols, 0, all_phases, router)


def _routed(
    plan: Plan,
    rule: DeltaRule,
    p: Prefixes,
    cols: Sequence[Var],
    nxt: int,
    all_phases: list[Phase],
    router: Router,
    joins: int = 0,
    proposed: int = 0,
) -> pa.RecordBatch:
    if nxt < len(all_phases):
        route = router.route(_key(plan, rule, all_phases[nxt], p), _salt(p, cols))
    else:  # the rule's bindings, summed by Spark per head tuple (a sum(x)'s weighed by x)
        p = weighed(plan, p)
        route = np.zeros(len(p), dtype=I64)
    return _batch(p, cols, route, joins, proposed)


def _phase_task(
    work: Work,
    job: RuleJob,
    router: Router,
    all_phases: list[Phase],
    at: int,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Stage `at` of a rule, on the shard this task's partition serves."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    shard = router.shard(ctx.partitionId() if ctx else 0)
    plan = work.plans[job.query]
    rule = plan.rules[job.rule]
    layers = ShardLayers(work, resident_for(work.root), shard, router.shards)
    phase = all_phases[at]
    before = _columns(rule, at - 1, all_phases)
    after = _columns(rule, at, all_phases)
    for b in batches:
        p = _to_prefixes(b, before)
        if len(p) == 0:
            continue
        if phase.kind == "check":
            check = next(c for c in rule.checks if c.atom == phase.atom)
            order = tuple(range(check.view.arity))
            name = relation_trace_name(check.view.relation)
            m = lookup_sum_of(
                layers.layers(name, check.view, order, check.version),
                [p.cols[v] for v in plan.atom_vars[check.atom]],
                len(p),
            )
            keep = np.flatnonzero(m)
            p = p.take(keep)
            p.scale(m[keep])
            check_overflow(plan, (p, None))  # the flags do not travel between stages
            yield _routed(plan, rule, p, after, at + 1, all_phases, router, len(p))
        elif phase.kind == "count":
            step = rule.steps[phase.step]
            n = count_of(plan, step.extenders[phase.index], p, layers)
            keep = np.flatnonzero(n > 0)
            p = p.take(keep)
            p.cols[Var(f"_n{phase.index}")] = n[keep]
            if phase.index == len(step.extenders) - 1:
                counts = np.stack([p.cols[Var(f"_n{j}")] for j in range(len(step.extenders))])
                tag, least = pick(counts) if len(p) else (np.zeros(0, I64), np.zeros(0, I64))
                p.cols[TAG], p.cols[LEAST] = tag.astype(I64), least
            yield _routed(plan, rule, p, after, at + 1, all_phases, router, len(p))
        elif phase.kind == "propose":
            yield from _propose(
                work.budget, plan, rule, phase, p, layers, after, at, all_phases, router
            )
        else:
            step = rule.steps[phase.step]
            y = step.extenders[phase.index]
            own = p.cols[TAG] == phase.index
            checked = np.flatnonzero(~own)
            part = p.take(checked)
            kept, m = validate(plan, y, part, layers.layers(*support_source(y), y.version))
            held = part.take(kept)
            if y.completes and m is not None:
                held.scale(m[kept])
            check_overflow(plan, (held, None))
            rows = np.concatenate([np.flatnonzero(own), checked[kept]])
            out = p.take(rows)
            out.weight = np.concatenate([p.weight[own], held.weight])
            yield _routed(plan, rule, out, after, at + 1, all_phases, router, len(kept))


def _propose(
    budget: int,
    plan: Plan,
    rule: DeltaRule,
    phase: Phase,
    p: Prefixes,
    layers: ShardLayers,
    after: Sequence[Var],
    at: int,
    all_phases: list[Phase],
    router: Router,
) -> Iterator[pa.RecordBatch]:
    """The winners propose, a budget of candidates at a time (a hub's prefixes in pieces)."""
    step = rule.steps[phase.step]
    tag = p.cols[TAG]
    for j, x in enumerate(step.extenders):
        mine = p.take(np.flatnonzero(tag == j))
        if len(mine) == 0:
            continue
        # Without a key the extender enumerates its whole arrangement (a product of
        # unconnected atoms): read unsharded.
        whole = layers if x.key else layers.unsharded()
        source = whole.layers(*support_source(x), x.version)
        for a, b in pieces(mine.cols[LEAST], budget):
            got = mine if (a, b) == (0, len(mine)) else mine.take(np.arange(a, b))
            part, made = propose(plan, step, x, got, source)
            check_overflow(plan, (part, None))
            part.cols[TAG] = np.full(len(part), j, dtype=I64)
            yield _routed(plan, rule, part, after, at + 1, all_phases, router, made, made)


# -- running a work --------------------------------------------------------------------------


def rule_frames(
    spark: SparkSession, work: Work, router: Router, read: Mapping[str, DataFrame]
) -> tuple[dict[str, DataFrame], dict[RuleJob, list[tuple[Phase, Observation]]]]:
    """Every rule of a work as a chain of routed stages; the rules' output changes summed per
    output (lazy), and the observations that will hold their counts once they ran.

    `read` gives each changed relation's stored changes at the epoch (c0.., diff), as Spark
    reads them.
    """
    frames: dict[str, list[DataFrame]] = {}
    observed: dict[RuleJob, list[tuple[Phase, Observation]]] = {}
    for job in work.rules:
        plan = work.plans[job.query]
        rule = plan.rules[job.rule]
        all_phases = phases(rule)
        source = read.get(plan.query.atoms[rule.delta].relation)
        if source is None:  # its relation did not change: the rule adds nothing
            continue
        start = partial(_start_task, work, job, router, all_phases)
        df = source.mapInArrow(start, _schema(_columns(rule, -1, all_phases)))
        marks: list[tuple[Phase, Observation]] = []
        for at, phase in enumerate(all_phases):
            task = partial(_phase_task, work, job, router, all_phases, at)
            schema = _schema(_columns(rule, at, all_phases))
            df = df.repartition(router.partitions, "route").mapInArrow(task, schema)
            obs = Observation()
            aggregates = [
                F.count(F.lit(1)).alias("rows"),
                F.sum("j").alias("joins"),
                F.sum("p").alias("proposed"),
            ]
            if LEAST in _columns(rule, at, all_phases) and phase.kind == "count":
                aggregates.append(F.sum(F.col(f"`{LEAST.name}`")).alias("least"))
            df = df.observe(obs, *aggregates)
            marks.append((phase, obs))
        observed[job] = marks
        head = plan.query.head
        out = df.select(
            *[F.col(f"`{v.name}`").alias(f"c{i}") for i, v in enumerate(head)],
            F.col("w").alias(DIFF),
        )
        frames.setdefault(job.output, []).append(out)
    summed = {}
    for name, parts in frames.items():
        total = parts[0]
        for more in parts[1:]:
            total = total.unionByName(more)
        cols = [c for c in total.columns if c != DIFF]
        grouped = total.groupBy(*cols) if cols else total.groupBy()
        summed[name] = grouped.agg(F.sum(DIFF).alias(DIFF)).where(F.col(DIFF) != 0)
    return summed, observed


def _observed(obs: Observation) -> dict[str, Any]:
    """An observation's metrics; none where Spark ran no stage for it (a plan whose input it
    proved empty is replaced by an empty relation, and its metrics row then has no schema)."""
    try:
        return dict(obs.get or {})
    except Py4JJavaError:
        return {}


def tallies_of(
    work: Work, observed: Mapping[RuleJob, list[tuple[Phase, Observation]]]
) -> dict[RuleJob, RuleTally]:
    """Each rule's tally from the observations of its stages (once its output was written)."""
    out: dict[RuleJob, RuleTally] = {}
    for job, marks in observed.items():
        rule = work.rule(job)
        tally = RuleTally.of(rule)
        for phase, obs in marks:
            got = _observed(obs)
            tally.joins += int(got.get("joins") or 0)
            if phase.step < 0:
                continue
            s: StepCounts = tally.steps[phase.step]
            if phase.kind == "count" and "least" in got:
                s.prefixes += int(got.get("rows") or 0)
                s.min_sum += int(got.get("least") or 0)
            if phase.kind == "propose":
                s.proposed += int(got.get("proposed") or 0)
            if ends_step(rule, phase):
                s.validated += int(got.get("rows") or 0)
        out[job] = tally
    return out
