"""One epoch: one pass over the traces it touches, one commit (see docs/state.md).

`EpochPass(served, access, base, epoch, changes).run()` applies epoch ``t`` — new, or in place of
what ``t`` held — to the manifest `base`, for what an engine serves (`wcoj_core.served.Served`)
over the state it reaches (`StateAccess`):

1. **open** every trace the epoch reads as of just before ``t`` (`wcoj_core.indexes`: mapped
   segments, corrected by the batches the index lacks or holds beyond ``t - 1``);
2. **land** each relation's changes (`wcoj_core.input_land`) and turn them into the relation's
   change (`wcoj_core.meaning.effect`: a set's presence, a bag's multiplicities);
3. **derive** every counts change and every delta rule of every query, on the driver or in
   Spark's executors (`wcoj_core.deploy`), each query's change the sum of its rules';
4. **write** a batch per changed trace at ``t`` with its figures as of ``t``, and every indexed
   trace's index advanced to ``t``;
5. **commit** one manifest generation. A failure anywhere discards what was written: the state
   stays exactly as it was.

Every step keeps to the process's memory budget (`Served.shares`, `wcoj_core.budget`): what is
larger than a step's share is spilled into the epoch's scratch folder and read back through
mapped files (`wcoj_core.spill`; removed when the pass ends), and the pass's metrics say the
budget, the sampled peak of the process's anonymous memory, its VmHWM and the bytes spilled per
step (`EpochMetrics.memory`). Before the rules run, an epoch whose output changes cannot fit the
disk they are written to is refused (`_room`).
"""

from __future__ import annotations

import time as clock
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from wcoj_core import deploy, lineage
from wcoj_core.budget import BudgetError, MemoryFigures, MemoryMeter, format_size
from wcoj_core.deploy import Choice
from wcoj_core.deploy.driver import estimate_rows, run_on_driver
from wcoj_core.deploy.output import OutputChange
from wcoj_core.deploy.work import RuleJob, Work
from wcoj_core.errors import DamagedFile, MultiplicityOverflow, StateError
from wcoj_core.indexes import KEPT, Opened, Streamed, advance, identity, open_trace
from wcoj_core.input_land import Changes, Landed, land
from wcoj_core.kernel.changes import counted_by, counts_delta, support_delta
from wcoj_core.kernel.index import EpochLayers
from wcoj_core.kernel.join import RuleTally
from wcoj_core.kernel.layer import Layer, lookup_sum
from wcoj_core.kernel.multiplicity import exact_sum
from wcoj_core.kernel.stored import DAMAGED_FILES
from wcoj_core.meaning import (
    Effect,
    Figures,
    Meaning,
    effects,
    figures_change,
    landed_digest,
)
from wcoj_core.query.plan import AtomView, DeltaRule, Kind, Plan, Version, order_free, oriented
from wcoj_core.served import Served, StateAccess
from wcoj_core.spill import Scratch, Spill, chunks, merge, merge_into
from wcoj_core.store.batches import BatchWriter
from wcoj_core.store.files import sync_soon
from wcoj_core.store.manifest import Batch, Index, Level, Manifest, Segment, Trace
from wcoj_core.store.names import new_batch_path, new_segment_path
from wcoj_core.store.segments import write_segment
from wcoj_core.traces import (
    counts_trace_name,
    output_trace_name,
    relation_trace_name,
    rule_trace_name,
)

# Progress on a long epoch is reported once it has run this long, then at most this often.
PROGRESS_AFTER = 2.0
PROGRESS_EVERY = 1.0
# An epoch changing at least this many rows is sampled for the size of its output changes
# before its rules run (`EpochPass._room`).
ESTIMATE_ROWS = 50_000


def ignored_trace_name(relation: str) -> str:
    """The trace of a set relation's landed changes that changed nothing."""
    return f"ignored/{relation}"


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """Rows through one step of one rule."""

    query: str
    rule: int
    var: str
    prefixes: int
    min_count_sum: int
    proposed: int
    validated: int


@dataclass(frozen=True, slots=True)
class EpochMetrics:
    """What one epoch did: changes in, rows proposed and validated, output rows, seconds per
    phase, where the kernel ran (`deployment`) and why (`reason`), and what opening the state
    cost (`mapped_bytes` of arrangement files mapped, `read_bytes` of batches read)."""

    epoch: int
    changes: dict[str, int]
    outputs: dict[str, int]
    steps: tuple[StepMetrics, ...]
    seconds: dict[str, float]
    deployment: str = "driver"
    reason: str = ""
    # Rows out of every lookup the kernel made (its analogue of a binary plan's join rows).
    join_rows: int = 0
    mapped_bytes: int = 0
    read_bytes: int = 0
    rebuilt: tuple[str, ...] = ()
    # The memory budget, the process's sampled peak anonymous memory, its VmHWM and the bytes
    # spilled to scratch files (`wcoj_core.budget.MemoryFigures`).
    memory: MemoryFigures | None = None
    # CPU seconds of the process (every thread, user and system) per phase: beside the wall
    # seconds, what a phase cost on a machine others load.
    cpu_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def proposed(self) -> int:
        return sum(s.proposed for s in self.steps)

    @property
    def validated(self) -> int:
        return sum(s.validated for s in self.steps)

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "changes": self.changes,
            "outputs": self.outputs,
            "proposed": self.proposed,
            "validated": self.validated,
            "seconds": {k: round(v, 4) for k, v in self.seconds.items()},
            "cpu_seconds": {k: round(v, 4) for k, v in self.cpu_seconds.items()},
            "deployment": self.deployment,
            "reason": self.reason,
            "hydration": {
                "seconds": round(self.seconds.get("open", 0.0), 4),
                "mapped_bytes": self.mapped_bytes,
                "read_bytes": self.read_bytes,
                "rebuilt": list(self.rebuilt),
            },
            **({} if self.memory is None else {"memory": self.memory.to_dict()}),
        }


@dataclass(frozen=True, slots=True)
class RelationReport:
    """What an epoch's landed changes did to a relation (see `wcoj_core.meaning.Effect`)."""

    landed: int
    changed: int
    self_loops: int
    inserted_present: int
    deleted_absent: int
    ignored_examples: tuple[tuple[tuple[int, ...], int], ...]
    negative: int
    negative_examples: tuple[tuple[tuple[int, ...], int], ...]
    # The relation's change split by sign: summed positive and (absolute) negative multiplicity.
    inserted: int = 0
    deleted: int = 0


@dataclass(frozen=True, slots=True)
class SegmentReport:
    """One segment of a trace's index after the epoch: its folder, level (``base`` or
    ``recent``), the view pattern (None: the trace as stored) and column order it serves, its
    rows and bytes."""

    path: str
    level: str
    view: tuple[Any, ...] | None
    order: tuple[int, ...]
    rows: int
    bytes: int


@dataclass(frozen=True, slots=True)
class TraceReport:
    """A trace after the epoch: its batch at the epoch (None: none written), its figures as of
    the epoch, and its index's segments."""

    name: str
    batch: Batch | None
    figures: Figures
    segments: tuple[SegmentReport, ...] = ()


@dataclass(frozen=True, slots=True)
class RuleReport:
    rows: int
    proposed: int
    validated: int


@dataclass(frozen=True)
class EpochResult:
    """The exact change of every query's output at an epoch, and what the epoch did.

    `changes` holds each query's change as (rows, diffs) arrays when the driver computed it in
    memory (None otherwise — the executors, or a change spilled beyond the memory budget: read
    the batch, `Engine.change` or `Engine.change_batches`); `totals` the sum of each change's
    multiplicities; `traces` every trace after the epoch; `rules` each rule's output per query.
    """

    epoch: int
    metrics: EpochMetrics
    relations: dict[str, RelationReport]
    traces: dict[str, TraceReport]
    totals: dict[str, int]
    changes: dict[str, tuple[np.ndarray, np.ndarray] | None]
    rules: dict[str, dict[int, RuleReport]]
    generation: int
    # Stale epochs derived again before this one, oldest first (see `Engine.apply`).
    rebuilt: tuple[EpochResult, ...] = ()

    @property
    def rebuilt_epochs(self) -> tuple[int, ...]:
        return tuple(r.epoch for r in self.rebuilt)

    def total(self, query: str) -> int:
        """The sum of the multiplicities of `query`'s output change (0 for a query attached
        at a later epoch)."""
        return self.totals.get(query, 0)

    def count(self, query: str) -> int:
        """`query`'s output count (summed multiplicity) as of the epoch (0 for a query
        attached at a later epoch)."""
        trace = self.traces.get(output_trace_name(query))
        return 0 if trace is None else trace.figures.count


@dataclass
class _Timer:
    seconds: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    stage: Any = None  # told each phase's name as it starts (the scratch folder's `stage`)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start, cpu = clock.perf_counter(), clock.process_time()
        if self.stage is not None:
            self.stage.stage = name
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + clock.perf_counter() - start
            self.cpu[name] = self.cpu.get(name, 0.0) + clock.process_time() - cpu


class EpochPass:
    """One epoch applied to a manifest (see the module)."""

    def __init__(
        self,
        served: Served,
        access: StateAccess,
        base: Manifest,
        epoch: int,
        changes: Mapping[str, Changes],
        *,
        dry: bool = False,
        count_only: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.served = served
        self.access = access
        # Told, on one line, how a long pass goes (`_report`).
        self.progress = progress
        self._reported = 0.0
        # A dry pass whose outputs are only counted (`wcoj count` keeping nothing): a distinct
        # output no lookup reads is counted by the kernel, never made (`Work.counted`).
        self.count_only = dry and count_only
        self.dry = dry  # compute the epoch, write and commit nothing (a static evaluation)
        self.base = base
        self.epoch = epoch
        self.changes = changes
        self.timer = _Timer()
        self.written: list[str] = []  # folders staged (batches, segments)
        self.opened: dict[str, Opened] = {}
        self.deltas: dict[str, Layer] = {}
        self.effects: dict[str, tuple[Landed, Effect]] = {}
        self.landings: dict[str, Landed] = {}  # each relation's landed changes (kept: `run`)
        self.met: set[str] = set()  # segments found damaged by this pass
        self.pre: dict[str, Batch] = {}  # changes written before the rules ran (executors)
        # Each layer written as a batch, by its id (the layer kept alive beside it): a layer
        # two traces hold (a query's change that is its one rule's) is written once.
        self.layer_batches: dict[int, tuple[Layer, tuple[str, ...], Batch]] = {}
        self.landed: dict[str, str] = {}  # each relation trace's landed digest
        self.chain = ""  # the epoch's chain (`wcoj_core.lineage`)
        # The memory budget's meter, and the scratch folder work beyond it spills into.
        self.meter = MemoryMeter(served.budget)
        scratch_root = access.scratch_root()
        self.scratch = Scratch(scratch_root, self.meter.add_spilled)
        shares = served.shares
        self.spill = Spill.of(self.scratch, shares)
        self.memory: MemoryFigures | None = None
        self.started = clock.monotonic()
        self.distinct: frozenset[str] = frozenset()  # outputs made consolidated (`_distinct`)
        self.mirrors: set[str] = set()  # traces that are their own mirror (undirected)
        self.timer.stage = self.scratch
        # A query attached at a later epoch is left alone; one attached at this epoch has its
        # whole output made again (`_whole`), not a change (`wcoj_core.attach`).
        since = {q: served.since(q) for q in served.queries}
        self.live = frozenset(q for q, s in since.items() if s is None or s <= epoch)
        self.whole = frozenset(q for q, s in since.items() if s == epoch)

    def _report(self, what: str) -> None:
        """Tell `progress` how the pass goes (`what`, the bytes spilled, the memory peak), once
        it has run `PROGRESS_AFTER` seconds, at most every `PROGRESS_EVERY`."""
        if self.progress is None:
            return
        now = clock.monotonic()
        if now - self.started < PROGRESS_AFTER or now - self._reported < PROGRESS_EVERY:
            return
        self._reported = now
        self.progress(
            f"{what}; spilled {format_size(self.scratch.spilled)}, memory "
            f"{format_size(self.meter.peak)} of {format_size(self.served.budget.bytes)}"
        )

    # -- the pass -----------------------------------------------------------------------------
    def run(self) -> EpochResult:
        """The pass (see the module). A segment found damaged as the pass reads it (a block
        that does not match its checksum) stops the pass before anything is committed; the
        pass is then made again from its landed changes, the segment's trace rebuilt from its
        batches (`open_trace`), as often as segments are found damaged."""
        self.meter.start()
        try:
            while True:
                try:
                    return self._run()
                except DamagedFile as e:
                    if e.path not in DAMAGED_FILES or e.path in self.met:
                        raise
                    self.met.add(e.path)
                    self._again()
        finally:
            self.memory = self._figures()
            self.scratch.close()

    def _figures(self) -> MemoryFigures:
        figures = self.meter.stop()
        figures.stages = dict(self.scratch.by_stage)
        return figures

    def _run(self) -> EpochResult:
        served, access, t = self.served, self.access, self.epoch
        m = served.registered(self.base)
        try:
            with self.timer.phase("open"):
                # An undirected relation's trace is its own mirror (`open_trace`, `advance`).
                self.mirrors = {
                    relation_trace_name(r) for r, spec in served.specs.items() if spec.undirected
                }
                for name in served.indexed():
                    if name.startswith("out/") and name[4:] not in self.live:
                        continue
                    self.opened[name] = open_trace(
                        access.store.root,
                        m.traces[name],
                        t,
                        served.views[name],
                        access.read_batch,
                        kept=KEPT,
                        streamed=Streamed(access.read_chunks, self.spill),
                        mirror=name in self.mirrors,
                    )
                KEPT.keep_only(access.store.root, _segment_paths(m))
            with self.timer.phase("land"):
                self._land()
            with self.timer.phase("rules"):
                choice, outputs, tallies = self._derive(m)
            with self.timer.phase("write"):
                new, reports = self._write(m, outputs)
            frontier = None if self.dry else served.compaction_due(new, t)
            if frontier is not None:
                from wcoj_core.compaction import compacted

                with self.timer.phase("compact"):
                    relations = [relation_trace_name(r) for r in served.specs]
                    new = compacted(
                        new,
                        frontier,
                        relations,
                        access.batches,
                        access.read_batch,
                        self.written,
                        self.spill,
                    )
            if self.dry:
                self._discard()  # what the executors wrote, if they ran
                committed = new
            else:
                with self.timer.phase("commit"):
                    committed = access.store.commit(new, expected=self.base)
        except MultiplicityOverflow as e:
            self._discard()
            raise e.with_epoch(t) from None
        except BaseException:
            self._discard()
            raise
        self.memory = self._figures()
        return self._result(committed, choice, outputs, tallies, reports)

    def _discard(self) -> None:
        self.access.store.discard(self.written)

    def _again(self) -> None:
        """Forget what a pass stopped by a damaged segment made, but its landed changes."""
        self.written, self.opened, self.deltas, self.effects = [], {}, {}, {}
        self.pre, self.layer_batches, self.landed = {}, {}, {}

    # -- land ---------------------------------------------------------------------------------
    def _land(self) -> None:
        served = self.served
        # A count of cliques from nothing, atoms oriented, reads its relation relabelled by
        # (degree, id) rank, each edge once: the same count, fewer candidates (`by_rank`).
        ranked = (
            self.count_only
            and len(served.specs) == 1
            and not any(n.startswith("out/") for n in self.opened)
            and all(self._held_nothing(r) for r in served.specs)
            and all(
                order_free(q, [r for r, s in served.specs.items() if s.undirected]) and oriented(q)
                for q in served.queries.values()
            )
        )
        for rel, changes in sorted(self.changes.items()):
            spec = served.specs[rel]
            landed = self.landings.get(rel) or land(
                spec,
                changes,
                served.landing_rows,
                self.spill,
                lambda n, rel=rel: self._report(f"epoch {self.epoch}: {rel} {n:,} rows landed"),
                ranked,
            )
            if landed is None:
                raise StateError(
                    f"epoch {self.epoch}: relation {rel!r} changes by more than "
                    f"{served.landing_rows:,} rows; apply it in smaller epochs"
                )
            self.landings[rel] = landed
            name = relation_trace_name(rel)
            before = self.opened[name].at(identity(spec.arity))
            eff = effects(spec, landed.layer, before, self.spill)
            self.effects[rel] = (landed, eff)
            if not self.dry:  # provenance of the batches written (a dry run writes none)
                self.landed[name] = landed_digest(landed.layer, sign=spec.meaning is Meaning.SET)
            if len(eff.change):
                self.deltas[name] = eff.change
        if not self.dry:
            relations = [relation_trace_name(r) for r in served.specs]
            self.chain = lineage.next_chain(
                self._previous_chain(), self.epoch, self.landed, relations
            )

    # -- derive -------------------------------------------------------------------------------
    def _derive(self, m: Manifest) -> tuple[Choice, dict[str, _Out], dict[RuleJob, RuleTally]]:
        """Counts changes (here), then every rule (here, or in the executors); each output
        trace's change, as arrays, a layer, or a batch written as it was made."""
        served, access = self.served, self.access
        layers = EpochLayers(self.opened, self.deltas, arrange=self.spill.arranged)  # type: ignore[arg-type]
        self._counts(layers)
        held = sum(o.trace.rows(self.epoch, strict=True) for o in self.opened.values())
        changed = sum(len(d) for d in self.deltas.values())
        choice = deploy.choose(served.limits, local=self.access.local, held=held, changed=changed)
        jobs = self._jobs(m)
        outputs: dict[str, _Out] = {}
        distinct = self.distinct = self._distinct(jobs)
        counted = frozenset(n for n in distinct if self.count_only and n not in self.opened)
        if choice.on_driver or not jobs:
            work = Work(
                access.store.root,
                self.epoch,
                served.plans,
                (),
                rules=tuple(jobs),
                distinct=distinct,
                counted=counted,
            )
            streams = {name: self._stream(m, name) for name in distinct}
            self._room(work, layers, counted)
            result = run_on_driver(
                work,
                layers,
                shares_of=served.shares,
                spill=self.spill,
                streams=streams,
                progress=lambda done, total: self._report(
                    f"epoch {self.epoch}: rules {done}/{total} tasks"
                ),
            )
            for name, change in result.changes.items():
                outputs[name] = self._output(m, name, change, streams.get(name))
            tallies = dict(result.tallies)
        else:
            choice, tallies = self._in_executors(m, choice, jobs, distinct, counted, outputs)
        self._query_outputs(m, jobs, outputs, layers)
        return choice, outputs, tallies

    def _in_executors(
        self,
        m: Manifest,
        choice: Choice,
        jobs: list[RuleJob],
        distinct: frozenset[str],
        counted: frozenset[str],
        outputs: dict[str, _Out],
    ) -> tuple[Choice, dict[RuleJob, RuleTally]]:
        """Every rule in one Spark job in the executors; their outputs into `outputs`."""
        served, access = self.served, self.access
        from wcoj_core.deploy.spark_job import routes, run_rules

        # Tasks on a state every executor reaches as files (not routed stages) map the
        # changes the driver consolidated (`TraceRead.mapped`): the batches, which only the
        # commit reads then, are written on a thread while the job runs (a dry pass writes
        # none).
        ship = self.access.local and not routes(served, access, m, self.epoch, choice)
        mapped = {name: self._shipped(name, layer) for name, layer in self.deltas.items() if ship}
        if not ship:
            self._batches(m)
        later = ThreadPoolExecutor(1) if ship and not self.dry else None
        try:
            pending = later.submit(self._batches, m) if later is not None else None
            try:
                outcome = run_rules(
                    served,
                    self.access,
                    m,
                    self.epoch,
                    choice,
                    jobs,
                    {} if ship else self.pre,
                    self.written,
                    distinct=distinct,
                    counted=counted,
                    mapped=mapped,
                    symmetric=frozenset(n for n in mapped if self.deltas[n].symmetric),
                )
            finally:
                if pending is not None:
                    wait([pending])  # written (or failed) before anything is discarded
                self.access.store.discard([s.path for s in mapped.values() if s.rows])
            if pending is not None:
                pending.result()  # a batch that could not be written fails the epoch
        finally:
            if later is not None:
                later.shutdown()
        for name, batch in outcome.batches.items():
            outputs[name] = _Out(None, batch, outcome.totals.get(name, 0))
        for name, (rows, total) in outcome.counted.items():
            outputs[name] = _Out(None, None, total, count=rows)
        tallies = dict(outcome.tallies)
        if outcome.how:
            choice = replace(choice, reason=f"{choice.reason}; {outcome.how}")
        return choice, tallies

    def _query_outputs(
        self, m: Manifest, jobs: list[RuleJob], outputs: dict[str, _Out], layers: EpochLayers
    ) -> None:
        """Each query's output change into `outputs`: made whole, its one rule's, or its rules'
        summed."""
        served = self.served
        for q in served.queries:
            out = output_trace_name(q)
            width = len(served.queries[q].head)
            ran = [j for j in jobs if j.query == q]
            if q in self.whole:
                outputs[out] = self._whole(m, q, layers)
            elif q not in self.live:
                continue
            elif served.keep_rules and len(ran) == 1:
                # One rule ran (a first load, or one relation of several changed): the query's
                # change is that rule's, as it is (a distinct one unsorted), the same batch.
                outputs[out] = outputs[ran[0].output].shared()
            elif served.keep_rules:
                parts = [self._arrays(m, j.output, outputs[j.output]) for j in ran]
                outputs[out] = _Out(self.spill.merged(parts, width, "summing the output change"))
            elif out not in outputs:
                outputs[out] = _Out(Layer.empty(width))

    def _room(self, work: Work, layers: EpochLayers, counting: frozenset[str]) -> None:
        """Refuse up front, in one line, an epoch whose output changes cannot fit the disk they
        are written to (estimated from a sample of each rule's delta: `estimate_rows`): written
        as Parquet, at least a byte per value; summed through sorted runs, eight per value and
        the diff. A small epoch is not sampled, nor one whose outputs are all only counted
        (nothing is written: a static count's sample took a fifth of ca-HepPh's rules)."""
        if sum(len(d) for d in self.deltas.values()) < ESTIMATE_ROWS:
            return
        plans = self.served.plans
        if all(job.output in counting or plans[job.query].query.aggregate for job in work.rules):
            return  # (an aggregate's change is summed as it is made: a row per changed group)
        estimates = estimate_rows(work, layers, self.served.shares)
        free = self.scratch.free_bytes()
        aggregated = {j.output for j in work.rules if plans[j.query].query.aggregate}
        for name, rows in sorted(estimates.items()):
            if name in counting or name in aggregated:
                continue
            width = len(_columns(self.served, name))
            need = rows * width if name in work.distinct else rows * 8 * (width + 1)
            if need > 0 and need > free - self.scratch.reserve():
                raise BudgetError(
                    f"epoch {self.epoch}: the output change of {name} is estimated at "
                    f"{rows:,.0f} rows (from a sample of its rules' delta tuples), at least "
                    f"{format_size(int(need))} to write; {format_size(free)} are free at "
                    f"{self.scratch.root or 'the temporary folder'}: nothing was applied"
                )

    def _counts(self, layers: EpochLayers) -> None:
        """Every counts change from the relations' changes (a large change a piece at a time:
        each piece's support changes grouped by key, the pieces' counts summed)."""
        by_view: dict[AtomView, list[Any]] = {}
        for a in self.served.arrangements:
            if a.kind is Kind.COUNTS:
                by_view.setdefault(a.view, []).append(a)
        for view, arrangements in by_view.items():
            name = relation_trace_name(view.relation)
            delta = self.deltas.get(name)
            if delta is None:
                continue
            if not self.spill.big(delta):
                _, eff = self.effects[view.relation]
                known = None if eff.held is None else (eff.change, eff.held)
                support = support_delta(layers, view, known)
                made: dict[tuple[int, ...], Layer] = {}  # arrangements that count alike
                for a in arrangements:
                    by = counted_by(support, a.key)
                    counts = (
                        made[by] if by in made else made.setdefault(by, counts_delta(support, by))
                    )
                    if len(counts):
                        self.deltas[counts_trace_name(a)] = counts
                continue
            sorters = {
                a: self.spill.sorter(len(a.key), "summing a counts change") for a in arrangements
            }
            for piece in chunks(delta, self.spill.chunk_rows(delta.width)):
                sub = EpochLayers(self.opened, {name: piece}, arrange=self.spill.arranged)  # type: ignore[arg-type]
                support = support_delta(sub, view)
                for a in arrangements:
                    counts = counts_delta(support, a.key)
                    sorters[a].add(np.asarray(counts.rows), np.asarray(counts.diff))
            for a, sorter in sorters.items():
                counts = sorter.layer()
                if len(counts):
                    self.deltas[counts_trace_name(a)] = counts

    def _stream(self, m: Manifest, name: str) -> Any:
        """A factory of the one stream a distinct output's spilled rows are written into: the
        output's batch at the epoch (a dry run: a stream that only counts)."""
        made: list[Any] = []

        def stream() -> Any:
            if not made:
                if self.dry:
                    made.append(_Counting())
                else:
                    trace = m.trace(name) or Trace(name, _columns(self.served, name))
                    made.append(self._writer(trace))
            return made[0]

        return stream

    def _writer(self, trace: Trace) -> BatchWriter:
        folder = new_batch_path(trace.name, self.epoch, "k")
        self.written.append(folder)
        return BatchWriter(self.access.batches, folder, trace.columns, self.epoch)

    def _output(self, m: Manifest, name: str, change: OutputChange, stream: Any) -> _Out:
        """An output's change as the epoch keeps it: in memory; a spilled distinct output's
        batch (written by the rules); spilled runs merged into a layer when something reads it
        again (an indexed output, a rule's output summed into its query's), else merged
        straight into the output's batch."""
        if change.arrays is not None:
            rows, diff = change.arrays
            if name in self.opened and name in self.distinct:
                # Made unsorted (distinct), but an indexed output is read again in order (its
                # figures, its arrangement): sorted here, summing nothing.
                return _Out(Layer.sort(rows, diff))
            # A distinct output comes unsorted: it is sorted only where a layer is needed.
            return _Out(Layer(rows, diff), ordered=name not in self.distinct)
        if change.counted is not None:
            return _Out(None, None, change.counted[1], count=change.counted[0])
        if change.written is not None:
            return self._closed(change.written.stream)
        runs = change.runs or []
        trace = m.trace(name) or Trace(name, _columns(self.served, name))
        if name in self.opened or self.served.keep_rules or len(runs) <= 1:
            layer = merge_into(
                self.scratch,
                runs,
                change.width,
                self.spill.layer_bytes,
                self.spill.merge_bytes,
                "summing the output change",
            )
            return _Out(layer)
        out = _Counting() if self.dry else self._writer(trace)
        for rows, diff, _ in merge(
            runs, change.width, block_bytes=self.spill.merge_bytes, what="summing the output change"
        ):
            out.write(rows, diff)
            self._report(f"epoch {self.epoch}: {name}: {out.rows:,} rows summed")
        return self._closed(out)

    def _closed(self, out: Any) -> _Out:
        """A stream's output as a batch (a dry run's: counted only)."""
        if isinstance(out, _Counting):
            return _Out(None, None, out.total, count=out.rows, negative=out.negative)
        refs = out.close()
        return _Out(None, Batch(out.rel, self.epoch, out.rows, refs), out.total)

    def _arrays(self, m: Manifest, name: str, out: _Out) -> Layer:
        """An output's change as a layer, sorted (read back when the executors or a spilled rule
        wrote it: a large batch a file at a time, summed through sorted runs; sorted now when
        the rules made it distinct, unsorted)."""
        if out.layer is not None and not out.ordered:
            out.layer = Layer.sort(np.asarray(out.layer.rows), np.asarray(out.layer.diff))
            out.ordered = True
        if out.layer is None:
            assert out.batch is not None
            trace = m.trace(name) or Trace(name, _columns(self.served, name))
            if out.batch.rows * 8 * (len(trace.columns) + 2) <= self.spill.run_bytes:
                out.layer = self.access.read_batch(trace, out.batch)
            else:
                sorter = self.spill.sorter(len(trace.columns), "summing the output change")
                for ref in out.batch.files:
                    layer = self.access.batches.read_verified(out.batch.path, trace.columns, (ref,))
                    sorter.add(np.asarray(layer.rows), np.asarray(layer.diff))
                out.layer = sorter.layer()
        return out.layer

    def _jobs(self, m: Manifest) -> list[RuleJob]:
        """The rules to run: those whose delta relation changed and whose other atoms all read
        something (on a new state only each query's last rule reads no empty old state)."""
        served = self.served
        changed = {r for r in served.specs if relation_trace_name(r) in self.deltas}
        jobs: list[RuleJob] = []
        for name, plan in served.plans.items():
            if name not in self.live or name in self.whole:
                continue
            for rule in plan.rules:
                if plan.query.atoms[rule.delta].relation not in changed:
                    continue
                if self._reads_empty(plan, rule, changed):
                    continue
                output = (
                    rule_trace_name(name, rule.delta)
                    if served.keep_rules
                    else output_trace_name(name)
                )
                jobs.append(RuleJob(name, rule.delta, output))
        return jobs

    def _whole(self, m: Manifest, query: str, layers: EpochLayers) -> _Out:
        """The whole output of a query attached at this epoch, as of its new state: what the
        query's trace holds at the epoch it was attached at (`wcoj_core.attach`)."""
        from wcoj_core.ask import Question, Whole

        question = Question.of(self.served.queries[query])
        out = output_trace_name(query)
        work = Work(self.access.store.root, self.epoch, {query: question.plan}, ())
        work = replace(work, rules=(RuleJob(query, question.rule.delta, out),))
        done = run_on_driver(work, Whole(layers), shares_of=self.served.shares, spill=self.spill)  # type: ignore[arg-type]
        return self._output(m, out, done.changes[out], None)

    def _reads_empty(self, plan: Plan, rule: DeltaRule, changed: set[str]) -> bool:
        """Whether an atom of `rule` other than its delta reads a relation holding nothing at
        the version it reads (the rule then derives nothing)."""
        for j, version in enumerate(rule.versions):
            if version is Version.DELTA:
                continue
            rel = plan.query.atoms[j].relation
            if version is Version.NEW and rel in changed:
                continue
            if self._held_nothing(rel):
                return True
        return False

    def _held_nothing(self, relation: str) -> bool:
        """Whether a relation held nothing before the epoch: it has no batch before it, or its
        opened arrangements hold no row (their files' sizes are checked as they are mapped),
        never a batch's row count alone (that is the manifest's word)."""
        opened = self.opened[relation_trace_name(relation)]
        if not any(b.time < self.epoch for b in opened.trace.batches):
            return True  # no batch before the epoch (a correction of the first epoch, say)
        width = self.served.relations[relation]
        return not any(len(layer) for layer in opened.at(identity(width)))

    def _distinct(self, jobs: Sequence[RuleJob]) -> frozenset[str]:
        """Outputs the rules make already consolidated, so that summing them would change
        nothing: one rule of a query whose relations held nothing before the epoch (a static
        evaluation), its head keeping every variable. Every layer that rule reads is then one
        consolidated batch, so its delta tuples, proposals and validations are distinct: each
        full binding is made once, with a product of non-zero multiplicities, and a head with
        every variable maps distinct bindings to distinct tuples (an aggregate's are summed per
        group, and its values are not 1: never distinct). Skipping the sum spares
        sorting the whole output (8.9 M triangles for web-NotreDame)."""
        out: set[str] = set()
        for name, plan in self.served.plans.items():
            ran = [j for j in jobs if j.query == name]
            fresh = all(self._held_nothing(r) for r in plan.query.relations)
            whole = set(plan.query.head) == set(plan.query.vars) and not plan.query.aggregate
            if fresh and len(ran) == 1 and whole:
                out.add(ran[0].output)
        return frozenset(out)

    # -- write --------------------------------------------------------------------------------
    def _write(
        self, m: Manifest, outputs: Mapping[str, _Out]
    ) -> tuple[Manifest, dict[str, TraceReport]]:
        """The manifest after the epoch: a batch per changed trace at the epoch (replacing what
        it held), figures as of the epoch, every opened trace's index advanced to it."""
        served, access, t = self.served, self.access, self.epoch
        staged = self._staged(m, outputs)
        traces = dict(m.traces)
        reports: dict[str, TraceReport] = {}
        at_epoch = {n for n, tr in m.traces.items() if any(b.time == t for b in tr.batches)}
        indexed: dict[int, tuple[Figures, frozenset[Any], Index]] = {}  # counts, by change
        for name in sorted(set(staged) | at_epoch | set(self.opened)):
            self._report(f"epoch {t}: writing {name}")
            trace = traces.get(name) or Trace(name, _columns(served, name))
            out = staged.get(name)
            kept = tuple(b for b in trace.batches if b.time != t)
            batch: Batch | None = None
            if out is not None and not self.dry:
                batch = self._stamped(trace, out)
                kept = tuple(sorted((*kept, batch), key=lambda b: b.time))
            trace = replace(trace, batches=kept)
            if name in self.opened and access.persist_index and not self.dry:
                opened = self.opened[name]
                change = (
                    self._arrays(m, name, out)
                    if out is not None
                    else Layer.empty(len(trace.columns))
                )
                twin = indexed.get(id(change)) if len(change) else None
                before = self._figures_before(m, name)
                if twin is not None and twin[:2] == (before, served.views[name]):
                    # An undirected relation's counts by its second column: the same change
                    # (`counted_by`) of a trace that holds what its twin by the first column
                    # holds, seen through the same keys. Its index is the twin's segments.
                    index = twin[2]
                elif len(change) or len(opened.correction) or opened.rebuilt or trace.index is None:
                    index = advance(
                        access.store.root,
                        opened,
                        change,
                        t,
                        served.views[name],
                        self.written,
                        access.read_batch,
                        streamed=Streamed(access.read_chunks, self.spill),
                        mirror=name in self.mirrors,
                    )
                    if name.startswith("counts/") and len(change):
                        indexed[id(change)] = (before, served.views[name], index)
                else:
                    index = replace(trace.index, time=t)
                trace = replace(trace, index=index)
            traces[name] = trace
            figures = (
                out.figures
                if out is not None and out.figures is not None
                else self._figures_before(m, name, upto=True)
            )
            reports[name] = TraceReport(name, batch, figures, _segments(trace))
        epoch = t if m.epoch is None else max(m.epoch, t)
        return replace(m, epoch=epoch, traces=traces, plan=served.record), reports

    def _staged(self, m: Manifest, outputs: Mapping[str, _Out]) -> dict[str, _Out]:
        """Every trace the epoch changes, with its change and its figures as of the epoch: the
        relations' (and their ignored changes), the counts', the rules' and outputs'."""
        staged: dict[str, _Out] = {}
        for rel, (_, eff) in self.effects.items():
            name = relation_trace_name(rel)
            staged[name] = _Out(eff.change, self.pre.get(name))
            staged[name].figures = self._figures_before(m, name).plus(
                eff.figures, f"relation {rel!r}"
            )
            if len(eff.ignored):
                staged[ignored_trace_name(rel)] = _Out(eff.ignored, figures=Figures())
        # An undirected relation's counts by its first and by its second column are one change
        # (`counted_by`: the same layer) of traces that hold the same (the relation is its own
        # mirror in every epoch, which the state's plan records): the lookup of the keys'
        # old counts is made once, for traces whose figures before agree.
        twins: dict[int, tuple[Figures, Figures]] = {}
        for name, layer in self.deltas.items():
            if name.startswith("counts/"):
                out = _Out(layer, self.pre.get(name))
                before = self._figures_before(m, name)
                known = twins.get(id(layer))
                if known is not None and known[0] == before:
                    change = known[1]
                else:
                    change = self._change(m, name, out)
                    twins[id(layer)] = (before, change)
                out.figures = before.plus(change, name)
                staged[name] = out
        for name, out in outputs.items():
            figures = self._figures_before(m, name)
            if name.startswith("out/"):
                figures = figures.plus(self._change(m, name, out), f"query {name[4:]!r}'s output")
            out.figures = figures
            staged[name] = out
        return staged

    def _stamped(self, trace: Trace, out: _Out) -> Batch:
        """The trace's batch at the epoch (written now unless the executors or the derive step
        wrote it), with its figures and provenance."""
        batch = out.batch
        if batch is None:
            assert out.layer is not None
            batch = self._batch_of(trace, out.layer)
        figures = out.figures if out.figures is not None else Figures()
        landed = self.landed.get(trace.name, "")
        return replace(batch, figures=figures.as_tuple(), landed=landed, inputs=self.chain)

    def _batch_of(self, trace: Trace, layer: Layer) -> Batch:
        """The batch of a layer: written once, whatever traces of its columns hold it (a
        query's change that is its one rule's: both traces' batches name the same files, which
        pruning keeps while any kept manifest names them)."""
        known = self.layer_batches.get(id(layer))
        if known is not None and known[0] is layer and known[1] == trace.columns:
            return known[2]
        batch = self._batch(trace, layer)
        self.layer_batches[id(layer)] = (layer, trace.columns, batch)
        return batch

    def _batches(self, m: Manifest) -> None:
        """The epoch's changes written as their traces' batches (`pre`), for the commit."""
        for name, layer in self.deltas.items():
            self.pre[name] = self._batch(m.traces[name], layer)

    def _shipped(self, name: str, layer: Layer) -> Segment:
        """The epoch's change of a trace as one segment file for the executors' tasks to map
        (removed once they ran: no manifest names it)."""
        path = new_segment_path(name)
        self.written.append(path)
        identity_order = tuple(range(layer.width))
        root = self.access.store.root
        return write_segment(root, path, layer, level=Level.RECENT, view=None, order=identity_order)

    def _batch(self, trace: Trace, layer: Layer) -> Batch:
        """Write a layer as the trace's batch at the epoch (figures and provenance added when
        the manifest is made): a large one a chunk at a time."""
        if len(layer) * 8 * (layer.width + 2) > self.spill.run_bytes:
            out = self._writer(trace)
            for piece in chunks(layer, self.spill.chunk_rows(layer.width)):
                out.write(np.asarray(piece.rows), np.asarray(piece.diff))
            return Batch(out.rel, self.epoch, out.rows, out.close())
        folder = new_batch_path(trace.name, self.epoch, "k")
        self.written.append(folder)
        files = self.access.batches.write(
            folder,
            trace.columns,
            np.asarray(layer.rows),
            np.asarray(layer.diff),
            self.epoch,
            threads=True,
        )
        if self.access.store.local_root is not None:
            sync_soon(self.access.store.root, folder)  # fsynced while the epoch goes on
        return Batch(folder, self.epoch, len(layer), files)

    def _previous_chain(self) -> str:
        relations = [relation_trace_name(r) for r in self.served.specs]
        chains = lineage.chains(self.base, relations)
        earlier = [e for e in chains if e < self.epoch]
        return chains[max(earlier)] if earlier else ""

    def _figures_before(self, m: Manifest, name: str, upto: bool = False) -> Figures:
        """A trace's figures as of the epoch before this one (its last batch before it)."""
        trace = m.trace(name)
        batches = (
            []
            if trace is None
            else [
                b for b in trace.batches if b.time < self.epoch or (upto and b.time == self.epoch)
            ]
        )
        for b in reversed(batches):
            if b.figures is not None:
                return Figures(*b.figures)
        return Figures()

    def _change(self, m: Manifest, name: str, out: _Out) -> Figures:
        """How a derived trace's figures change by its change `out`: a lookup of its tuples in
        the trace as of before the epoch when it is indexed; else (an output whose tuples are
        held once or not at all) its summed diff."""
        opened = self.opened.get(name)
        if opened is None:
            total = out.sum
            return Figures(total, total, 0)
        if out.layer is None and out.batch is None:
            # Only counted (a dry run's distinct output, spilled): the rules made it distinct
            # on a state that held nothing, so no tuple was held before.
            return Figures(out.count, out.total, out.negative)
        layer = self._arrays(m, name, out)
        found = Figures()
        old = opened.at(identity(layer.width))
        for piece in chunks(layer, self.spill.chunk_rows(layer.width)):
            rows = np.asarray(piece.rows)
            before = lookup_sum(old, rows)
            change = figures_change(before, np.asarray(piece.diff), rows, f"trace {name!r}")
            found = found.plus(change, f"trace {name!r}")
        return found

    # -- the result ---------------------------------------------------------------------------
    def _result(
        self,
        committed: Manifest,
        choice: Choice,
        outputs: Mapping[str, _Out],
        tallies: Mapping[RuleJob, RuleTally],
        reports: dict[str, TraceReport],
    ) -> EpochResult:
        served = self.served
        steps = tuple(
            StepMetrics(job.query, job.rule, s.var, s.prefixes, s.min_sum, s.proposed, s.validated)
            for job, tally in tallies.items()
            for s in tally.steps
        )
        rules: dict[str, dict[int, RuleReport]] = {q: {} for q in served.queries if q in self.live}
        for job, tally in tallies.items():
            rows = outputs[job.output].rows if served.keep_rules else 0
            rules[job.query][job.rule] = RuleReport(
                rows, sum(s.proposed for s in tally.steps), sum(s.validated for s in tally.steps)
            )
        metrics = EpochMetrics(
            epoch=self.epoch,
            changes={rel: len(eff.change) for rel, (_, eff) in sorted(self.effects.items())},
            outputs={
                q: outputs[output_trace_name(q)].rows for q in served.queries if q in self.live
            },
            steps=steps,
            seconds=self.timer.seconds,
            deployment=choice.deployment.value,
            reason=choice.reason,
            join_rows=sum(tally.joins for tally in tallies.values()),
            # each file once: an undirected relation's twin counts traces share theirs
            mapped_bytes=sum(
                {p: n for o in self.opened.values() for p, n in o.maps.items()}.values()
            ),
            read_bytes=sum(o.read_bytes for o in self.opened.values()),
            rebuilt=tuple(
                f"{n}: {o.rebuilt}" for n, o in self.opened.items() if o.rebuilt and o.damaged
            ),
            memory=self.memory,
            cpu_seconds=self.timer.cpu,
        )
        relations = {
            rel: RelationReport(
                len(eff.landed),
                len(eff.change),
                landed.self_loops,
                eff.inserted_present,
                eff.deleted_absent,
                eff.ignored_examples,
                eff.negative,
                eff.negative_examples,
                *_weights(eff.change),
            )
            for rel, (landed, eff) in sorted(self.effects.items())
        }
        live = [q for q in served.queries if q in self.live]
        totals = {q: outputs[output_trace_name(q)].sum for q in live}
        changes: dict[str, tuple[np.ndarray, np.ndarray] | None] = {
            q: outputs[output_trace_name(q)].arrays for q in live
        }
        return EpochResult(
            self.epoch,
            metrics,
            relations,
            reports,
            totals,
            changes,
            rules,
            committed.generation,
        )


@dataclass
class _Out:
    """A trace's change at the epoch: in memory or in mapped files (`layer`), or a batch
    written elsewhere (the executors, a spilled output) with the sum of its diffs (`total`)
    and, for an output only counted or a dry run's spilled output written nowhere, its rows
    (`count`); its figures once known.

    `ordered` False: `layer` holds distinct rows in the order the rules made them (not yet a
    sorted `Layer`: `EpochPass._distinct`); `EpochPass._arrays` sorts them before any lookup or
    index reads them, and a batch is written from them as they are."""

    layer: Layer | None
    batch: Batch | None = None
    total: int = 0
    figures: Figures | None = None
    count: int = 0
    negative: int = 0  # of an output only counted: its tuples of a negative weight
    ordered: bool = True

    def shared(self) -> _Out:
        """The same change for another trace (its own figures): the same layer or batch."""
        return replace(self, figures=None)

    @property
    def rows(self) -> int:
        if self.layer is not None:
            return len(self.layer)
        return self.batch.rows if self.batch is not None else self.count

    @property
    def sum(self) -> int:
        if self.layer is not None:
            return sum(exact_sum(np.asarray(p.diff)) for p in chunks(self.layer, 1 << 22))
        return self.total

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The change's rows and diffs, when they are in memory (None: read the batch)."""
        if self.layer is None or isinstance(self.layer.diff, np.memmap):
            return None
        return np.asarray(self.layer.rows), np.asarray(self.layer.diff)


class _Counting:
    """A stream that writes nothing: a dry run's spilled output, counted and summed."""

    def __init__(self) -> None:
        self.rows = 0
        self.total = 0
        self.negative = 0

    def write(self, rows: np.ndarray, diff: np.ndarray) -> None:
        self.rows += len(diff)
        if len(diff):
            self.total += exact_sum(diff)
            self.negative += int(np.count_nonzero(diff < 0))


def _weights(change: Layer) -> tuple[int, int]:
    """The weight a change inserts and the weight it deletes, a piece at a time: a spilled
    change is a mapped file, and a mask of it whole would be held past the epoch's budget."""
    up = down = 0
    for piece in chunks(change, 1 << 18):
        d = np.asarray(piece.diff)
        up, down = up + int(d[d > 0].sum()), down - int(d[d < 0].sum())
    return up, down


def _columns(served: Served, name: str) -> tuple[str, ...]:
    return tuple(served.trace_columns(name))


def _segment_paths(m: Manifest) -> set[str]:
    """Every segment folder a manifest's indexes name."""
    return {s.path for tr in m.traces.values() if tr.index is not None for s in tr.index.segments}


def _segments(trace: Trace) -> tuple[SegmentReport, ...]:
    if trace.index is None:
        return ()
    return tuple(
        SegmentReport(
            s.path,
            s.level.value,
            None if s.view is None else tuple(s.view),
            tuple(s.order),
            s.rows,
            sum(f.size for f in s.files.values()),
        )
        for s in trace.index.segments
    )
