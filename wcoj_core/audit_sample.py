"""The per-epoch audit at any epoch size (`audit_epoch`): a random sample of the output change
checked tuple by tuple, and what is cheap to check exactly checked exactly (its default mode);
every tuple of a small epoch, or of any epoch asked for in full, recomputed by the binary joins
of `wcoj_core.audit`.

A large epoch is checked with the same independent joins by:

* **stored tuples, sampled**: positions drawn at random (a tuple with chance ``p = 1 - (1 -
  1/n)^s``), each tuple's multiplicity recomputed whole with the head bound (`_Rules.run_bound`);
* **missing tuples, sampled**: per rule, change rows drawn and the rule run from them; every
  output tuple reached (at most `REACHED`) recomputed whole and compared;
* **exactly**: the stored change streamed once (digests, rows), its sum, and the output's
  figures as of the epoch against those before plus the change;
* **the sum, recounted** (`Engine.recount`, local states): a missing or extra tuple or a wrong
  multiplicity moves it, so `Audit.catch_sum` is 1; errors of the kernel's own joins that keep
  the sum are found by the sample only (`Audit.misses`).

`sample_sizes` follows the change, so the audit costs about the engine's pass. `Audit.catch` is
the chance one wrong tuple is found; the seed is named in the method. Joins stop at `JOINED`
rows (the sample is drawn again, smaller); an epoch within `EXACT_DELTA` change rows and
`EXACT_STORED` stored tuples is audited in full.
"""

from __future__ import annotations

import time as clock
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from wcoj_core.arrow import longs
from wcoj_core.audit import (
    I64,
    LIMIT,
    Audit,
    AuditMode,
    Block,
    TooMuch,
    _Bindings,
    _compare,
    _groups,
    _joined,
    _magnitude,
    _positions,
    _probe,
    _recompute,
    _Relation,
    _relations,
    _Rules,
    _Side,
    _summed,
)
from wcoj_core.errors import WcojError
from wcoj_core.meaning import Figures
from wcoj_core.query.ir import Atom, Query, Var
from wcoj_core.store.manifest import Batch, Manifest, Trace
from wcoj_core.traces import DIFF, output_trace_name, relation_trace_name

if TYPE_CHECKING:
    from wcoj_core.engine import Engine

# The sample follows the change: it holds `SHARE` of as many items as the change has rows (the
# engine's work grows with them, the audit's with its items), half of them stored tuples, half
# change rows split over the delta rules, within these bounds.
SHARE = 0.25
STORED_SAMPLE = 1 << 16  # stored tuples drawn, at most ...
STORED_FLOOR = 1 << 11  # ... and at least (all of them when there are fewer)
DELTA_SAMPLE = 1 << 14  # change rows drawn per delta rule, at most ...
DELTA_FLOOR = 1 << 9  # ... and at least
REACHED = 1 << 16  # output tuples reached from them, at most, recomputed
JOINED = 1 << 22  # rows the joins of one pass may produce
EXACT_DELTA = 1 << 12  # an epoch with at most this many change rows ...
EXACT_STORED = 1 << 20  # ... and at most this many stored tuples is audited in full


def change_rows(manifest: Manifest, query: Query, epoch: int) -> int:
    """The rows of the changes of a query's relations at an epoch, as the manifest counts them
    (what an audit's size is chosen by: a wrong count costs time, not a wrong answer)."""
    return sum(
        b.rows
        for r in query.relations
        if (t := manifest.trace(relation_trace_name(r))) is not None
        for b in t.batches
        if b.time == epoch
    )


def sample_sizes(rows: int, rules: int) -> tuple[int, int]:
    """How many stored tuples, and change rows per delta rule, an audit draws for an epoch of
    `rows` change rows over `rules` delta rules (see `SHARE`).

    >>> sample_sizes(2_000_000, 3), sample_sizes(40_000, 3)
    ((65536, 16384), (5000, 1666))
    """
    items = SHARE * rows
    stored = int(min(STORED_SAMPLE, max(STORED_FLOOR, items / 2)))
    delta = int(min(DELTA_SAMPLE, max(DELTA_FLOOR, items / 2 / max(1, rules))))
    return stored, delta


# -- the stored change, streamed ---------------------------------------------------------------


def stored_chunks(
    engine: Engine, trace: Trace, batch: Batch
) -> Iterator[tuple[list[np.ndarray], np.ndarray]]:
    """A stored batch's rows (as columns) and diffs, a record batch at a time: exactly the files
    it lists, each hashed whole first (`Batches.iter_chunks`: its size and digest against the
    manifest), their rows against the batch's. Raises `DamagedBatch` naming the file."""
    for part in engine.batches.iter_chunks(batch, trace.columns, digests=True):
        yield [longs(part.column(c)) for c in trace.columns], longs(part.column(DIFF))


def _exact_sum(a: np.ndarray) -> int:
    """The sum of int64 values as a Python int, never wrapped."""
    if not len(a):
        return 0
    if _magnitude(a) * len(a) < LIMIT:
        return int(a.sum())
    return int(a.astype(object).sum())


# -- figures -----------------------------------------------------------------------------------


def held_before(old: _Relation, width: int, cols: Sequence[np.ndarray], m: int) -> np.ndarray:
    """Each of `m` tuples' (given as columns) multiplicity in the trace `old` reads as its old
    state (before the epoch), found by the audit's own searches of its sorted sources."""
    names = tuple(Var(f"c{j}") for j in range(width))
    atom = Atom("trace", names)
    bound = set(names)
    b = _Bindings(dict(zip(names, cols, strict=True)), np.ones(m, dtype=I64))
    path = old.path(atom, _Side.OLD, bound) or old.scan(atom, _Side.OLD, bound)
    probe = _probe(0, path, b, [])
    parts: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    for src, (lo, hi) in zip(path.sources, probe.ranges, strict=True):
        sizes = hi - lo
        if sizes.any():
            pos, owner = _positions(lo, sizes)
            parts.append(src.diff[pos])
            owners.append(owner)
    if not parts:
        return np.zeros(m, dtype=I64)
    diff, owner = _joined(parts), np.concatenate(owners)
    out = np.zeros(m, dtype=object if diff.dtype == object else I64)
    if out.dtype != object and _magnitude(diff) * len(path.sources) >= LIMIT:
        out, diff = out.astype(object), diff.astype(object)
    np.add.at(out, owner, diff)
    return out


@dataclass
class FigureTally:
    """How a stored change moves its output's figures, summed a chunk at a time. `old` is the
    output's old state when it is indexed (None: each tuple held once or not at all)."""

    old: _Relation | None
    width: int
    change: Figures = field(default_factory=Figures)
    rows: int = 0
    not_unit: int = 0  # changes other than +1 and -1 (for an output held once or not at all)

    def add(self, cols: Sequence[np.ndarray], diff: np.ndarray) -> None:
        self.rows += len(diff)
        total = _exact_sum(diff)
        if self.old is None:
            self.not_unit += int(np.count_nonzero((diff != 1) & (diff != -1)))
            moved = Figures(total, total, 0)
        else:
            before = held_before(self.old, self.width, cols, len(diff))
            wide = before.dtype == object or max(_magnitude(before), _magnitude(diff)) >= LIMIT // 2
            after = before.astype(object) + diff.astype(object) if wide else before + diff
            rows = int(np.count_nonzero(after != 0)) - int(np.count_nonzero(before != 0))
            negative = int(np.count_nonzero(after < 0)) - int(np.count_nonzero(before < 0))
            moved = Figures(rows, total, negative)
        self.change = Figures(
            self.change.rows + moved.rows,
            self.change.count + moved.count,
            self.change.negative + moved.negative,
        )

    def read(self) -> str:
        """What reading the output's old state took, when it was read (for an audit's method)."""
        if self.old is None:
            return ""
        return f"; {self.old.trace.name if self.old.trace else 'output'}: " + ", ".join(
            ["its old state for the figures", *sorted(self.old.notes)]
        )

    def problems(self, epoch: int, before: Figures, recorded: Figures | None) -> list[str]:
        """What the recorded figures as of `epoch` get wrong, given those before it."""
        out = []
        if self.not_unit:
            out.append(
                f"{self.not_unit} change(s) at epoch {epoch} other than +1 or -1 in an output "
                "whose tuples are held once or not at all"
            )
        expected = Figures(
            before.rows + self.change.rows,
            before.count + self.change.count,
            before.negative + self.change.negative,
        )
        if recorded is not None and recorded != expected:
            out.append(
                f"figures as of epoch {epoch}: recorded (rows, count, negative) "
                f"{recorded.as_tuple()}, expected {expected.as_tuple()} (those of the epoch "
                f"before, {before.as_tuple()}, moved by the stored change)"
            )
        return out


def figures_around(trace: Trace | None, epoch: int) -> tuple[Figures, Figures | None]:
    """A trace's recorded figures as of the epoch before `epoch` (its last batch before it) and
    as of `epoch` (its batch there; None without one)."""
    before, at = Figures(), None
    for b in trace.batches if trace is not None else ():
        if b.figures is None:
            continue
        if b.time < epoch:
            before = Figures(*b.figures)
        elif b.time == epoch:
            at = Figures(*b.figures)
    return before, at


# -- the sample ----------------------------------------------------------------------------------


def _draw(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """`k` positions of `n` drawn with replacement, sorted and distinct (all of them if k >= n)."""
    if k >= n:
        return np.arange(n, dtype=I64)
    return np.unique(rng.integers(0, n, k))


def _chance(n: int, k: int) -> float:
    """The chance one of `n` items is among `k` drawn with replacement (1 when k >= n)."""
    return 1.0 if k >= n or n == 0 else 1.0 - (1.0 - 1.0 / n) ** k


def _distinct(cols: Sequence[np.ndarray]) -> list[np.ndarray]:
    if not cols or not len(cols[0]):
        return list(cols)
    sorted_cols, _, starts = _groups(list(cols), np.zeros(len(cols[0]), dtype=I64))
    return [c[starts] for c in sorted_cols]


class _Wanted:
    """Distinct tuples (as columns) to find among stored rows, a chunk of rows at a time: by one
    binary search per row of its tuple packed into an int64 (each column's offset from the
    wanted least value in the bits the wanted span needs) when the wanted tuples pack — only for
    the rows whose packed tuple hashes to a wanted one's slot —, else by
    one sort of the rows whose first value is wanted together with the wanted tuples."""

    def __init__(self, wanted: Sequence[np.ndarray]) -> None:
        self.wanted = list(wanted)
        self.m = len(wanted[0]) if wanted else 0
        self.lows = [int(c.min()) for c in wanted] if self.m else []
        self.highs = [int(c.max()) for c in wanted] if self.m else []
        bits = [(h - lo).bit_length() for lo, h in zip(self.lows, self.highs, strict=True)]
        self.bits = bits if self.m and sum(bits) <= 63 else None
        self.keys: np.ndarray | None = None
        if self.bits is not None:
            keys = self._pack(self.wanted)
            self.order = np.argsort(keys, kind="stable")
            self.keys = keys[self.order]
            # A table of the wanted keys' hash slots, at least 16 slots a key: a row whose slot
            # is empty is not wanted, so most rows are ruled out by one lookup in a table that
            # stays in cache, and only the few left are searched (no wanted key is ruled out).
            self.slot_bits = max(10, (16 * self.m).bit_length())
            self.slots = np.zeros(1 << self.slot_bits, dtype=bool)
            self.slots[self._slot(self.keys)] = True
        self.firsts = np.unique(wanted[0]) if self.m else np.zeros(0, I64)

    def _pack(self, cols: Sequence[np.ndarray]) -> np.ndarray:
        assert self.bits is not None
        key = np.zeros(len(cols[0]), dtype=I64)
        for c, low, width in zip(cols, self.lows, self.bits, strict=True):
            key <<= width
            key |= c - I64(low)
        return key

    def _slot(self, keys: np.ndarray) -> np.ndarray:
        """Each key's slot in `slots` (Fibonacci hashing: the top bits of a multiple)."""
        mixed = keys.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        return mixed >> np.uint64(64 - self.slot_bits)

    def find(self, cols: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (i, j): wanted tuple i is row j of `cols`.

        >>> w = _Wanted([np.array([1, 5]), np.array([2, 2])])
        >>> i, j = w.find([np.array([5, 1, 1, 9]), np.array([2, 3, 2, 2])])
        >>> i.tolist(), j.tolist()
        ([1, 0], [0, 2])
        """
        n = len(cols[0]) if cols else 0
        if not self.m or not n:
            return np.zeros(0, I64), np.zeros(0, I64)
        if self.keys is None:
            at = np.minimum(np.searchsorted(self.firsts, cols[0]), len(self.firsts) - 1)
            rows = np.flatnonzero(self.firsts[at] == cols[0])
            i, j = _paired(self.wanted, [c[rows] for c in cols])
            return i, rows[j]
        inside = np.ones(n, dtype=bool)
        for c, low, high in zip(cols, self.lows, self.highs, strict=True):
            inside &= (c >= low) & (c <= high)
        rows = np.flatnonzero(inside)
        key = self._pack([c[rows] for c in cols])
        maybe = np.flatnonzero(self.slots[self._slot(key)])
        rows, key = rows[maybe], key[maybe]
        at = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
        hit = self.keys[at] == key
        return self.order[at[hit]], rows[hit]


def _paired(wanted: Sequence[np.ndarray], cols: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Pairs (i, j): wanted tuple i (distinct) is row j of `cols`, by one sort of both."""
    m, n = len(wanted[0]), len(cols[0])
    both = [np.concatenate([w, c]) for w, c in zip(wanted, cols, strict=True)]
    tags = np.concatenate([np.arange(m, dtype=I64), -1 - np.arange(n, dtype=I64)])
    _, tags, starts = _groups(both, tags)
    ends = np.append(starts[1:], len(tags))
    # A run of equal rows holds at most one wanted row; pair it with each stored row there.
    mine = np.full(len(starts), -1, dtype=I64)
    first = tags[starts]
    mine[first >= 0] = first[first >= 0]
    run = np.repeat(np.arange(len(starts)), ends - starts)
    keep = (tags < 0) & (mine[run] >= 0)
    return mine[run[keep]], -1 - tags[keep]


def _bound_start(query: Query, cols: Sequence[np.ndarray]) -> tuple[_Bindings, np.ndarray]:
    """Bindings of the head's variables to the given head tuples, and which tuples they are
    (a tuple whose repeated head variable has two values is reached by no binding)."""
    m = len(cols[0]) if cols else 0
    values: dict[Var, np.ndarray] = {}
    ok = np.ones(m, dtype=bool)
    for v, c in zip(query.head, cols, strict=True):
        if v in values:
            ok &= values[v] == c
        else:
            values[v] = c
    picked = np.flatnonzero(ok)
    return _Bindings({v: a[picked] for v, a in values.items()}, np.ones(len(picked), I64)), picked


@dataclass
class SampledAudit:
    """One sampled audit of a query's change at an epoch (see the module)."""

    engine: Engine
    query: Query
    epoch: int
    manifest: Manifest
    relations: dict[str, _Relation]
    rng: np.random.Generator
    seed: int
    joined: int = 0
    notes: list[str] = field(default_factory=list)

    def ran(self) -> list[int]:
        return [i for i, a in enumerate(self.query.atoms) if self.relations[a.relation].changed]

    def reached(self, ran: Sequence[int], k: int) -> tuple[list[np.ndarray], float]:
        """Output tuples reached from `k` change rows drawn per rule, and the chance a given
        reachable tuple is among them."""
        width = len(self.query.head)
        while True:
            rules = _Rules(self.query, self.relations, budget=JOINED)
            chance = 1.0
            try:
                for i in ran:
                    atom = self.query.atoms[i]
                    src = self.relations[atom.relation].path(atom, _Side.DELTA, set())
                    n = sum(len(s) for s in src.sources) if src is not None else 0
                    chance = min(chance, _chance(n, k))
                    rules.run(i, _draw(self.rng, n, k))
            except TooMuch:
                self.joined += rules.joined
                if k <= 16:
                    self.notes.append("no change row could be followed within the budget")
                    return [np.zeros(0, I64) for _ in range(width)], 0.0
                k //= 4
                self.notes.append(f"change rows drawn again, {k} per rule (joins past budget)")
                continue
            self.joined += rules.joined
            break
        live = [c for c, w in rules.out if len(w)]
        if not live:
            return [np.zeros(0, I64) for _ in range(width)], chance
        cols = _distinct([np.concatenate([c[j] for c in live]) for j in range(width)])
        if len(cols[0]) > REACHED:
            kept = _draw(self.rng, len(cols[0]), REACHED)
            chance *= len(kept) / len(cols[0])
            cols = [c[kept] for c in cols]
        return cols, chance

    def expected(self, ran: Sequence[int], cols: list[np.ndarray]) -> Block:
        """Each given head tuple's multiplicity in the change, recomputed whole: every rule
        evaluated with the head bound to it (consolidated: tuples of multiplicity 0 left out)."""
        rules = _Rules(self.query, self.relations, budget=JOINED)
        start, _ = _bound_start(self.query, cols)
        for i in ran:
            rules.run_bound(i, start)
        self.joined += rules.joined
        out, weights = _summed(rules.out, len(self.query.head))
        return list(out), weights


def sampled_audit(
    engine: Engine,
    query: str,
    epoch: int,
    manifest: Manifest,
    relations: dict[str, _Relation],
    seed: int,
) -> Audit:
    """Query `query`'s stored change at `epoch` audited by samples, its figures exactly (see
    the module)."""
    started = clock.perf_counter()
    q = engine.queries[query]
    width = len(q.head)
    audit = SampledAudit(engine, q, epoch, manifest, relations, np.random.default_rng(seed), seed)
    ran = audit.ran()
    stored_k, delta_k = sample_sizes(change_rows(manifest, q, epoch), len(ran))
    reached, missing_chance = audit.reached(ran, delta_k)
    name = output_trace_name(query)
    trace = manifest.trace(name)
    batch = next((b for b in trace.batches if b.time == epoch), None) if trace else None
    tally = FigureTally(old_state(engine, trace, width, epoch, query), width)
    n = batch.rows if batch is not None else 0
    picks = _draw(audit.rng, n, stored_k)
    drawn, drawn_w, reached_w = _read_stored(engine, trace, batch, tally, picks, reached)
    stored_chance = _chance(n, stored_k)
    # A tuple both reached and drawn is one stored tuple: its value is taken once (the reached
    # one, summed over every row holding it, comes first in its run: the sort is stable).
    cols = [np.concatenate([b, a]) for a, b in zip(drawn, reached, strict=True)]
    weights = np.concatenate([reached_w, drawn_w])
    checked, stored_w, starts = _groups(cols, weights)
    expected, starts, share = _recompute_within_budget(audit, ran, checked, starts)
    stored_chance, missing_chance = stored_chance * share, missing_chance * share
    stored: Block = ([c[starts] for c in checked], stored_w[starts])
    keep = np.flatnonzero(stored[1] != 0)
    stored = ([c[keep] for c in stored[0]], stored[1][keep])
    if expected is None:
        mismatches, examples = 0, []
        audit.notes.append("the sampled tuples could not be recomputed within the budget")
        catch = 0.0
    else:
        # Tuples reached but not stored and recomputed as 0 agree; compare the rest.
        mismatches, examples = _compare(expected, stored)
        catch = min(stored_chance, missing_chance)
    before, recorded = figures_around(trace, epoch)
    problems = tally.problems(epoch, before, recorded)
    method = (
        f"sampled (seed {seed}): {len(drawn_w):,} of {n:,} stored tuples drawn (each with "
        f"chance {stored_chance:.3g}), {len(reached[0]) if width else 0:,} tuples reached from "
        f"change rows drawn per rule (a missing tuple with chance {missing_chance:.3g}), each "
        f"recomputed whole by {len(ran)} delta rule(s) of {len(q.atoms)} with its head bound; "
        f"figures and the change's sum exact over all {n:,}"
    )
    if audit.notes:
        method += "; " + "; ".join(audit.notes)
    recount = Recount.of(engine, query, epoch, tally.change.count, catch)
    method += tally.read() + f"; {recount.note}"
    return Audit(
        passed=mismatches == 0 and not problems and not recount.wrong,
        mismatches=mismatches,
        examples=examples + recount.wrong + problems,
        expected_rows=len(starts),
        actual_rows=n,
        joined_rows=audit.joined,
        seconds=clock.perf_counter() - started,
        method=method,
        mode="sampled",
        figures="; ".join(problems) or "ok",
        catch=catch,
        catch_sum=recount.catch,
        misses=recount.misses,
    )


def _read_stored(
    engine: Engine,
    trace: Trace | None,
    batch: Batch | None,
    tally: FigureTally,
    picks: np.ndarray,
    reached: Sequence[np.ndarray],
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Read the stored change once: every row into `tally`, the rows at `picks` drawn, and each
    reached tuple's stored weight summed. Returns the drawn columns, their weights and the
    reached tuples' weights."""
    width = len(reached)
    drawn_cols: list[list[np.ndarray]] = []
    drawn_diff: list[np.ndarray] = []
    found_at: list[np.ndarray] = []
    found_diff: list[np.ndarray] = []
    at = 0
    wanted = _Wanted(reached)
    if batch is not None and trace is not None:
        for cols, diff in stored_chunks(engine, trace, batch):
            tally.add(cols, diff)
            mine = picks[(picks >= at) & (picks < at + len(diff))] - at
            drawn_cols.append([c[mine] for c in cols])
            drawn_diff.append(diff[mine])
            i, j = wanted.find(cols)
            found_at.append(i)
            found_diff.append(diff[j])
            at += len(diff)
    drawn = [
        np.concatenate([d[j] for d in drawn_cols]) if drawn_cols else np.zeros(0, I64)
        for j in range(width)
    ]
    drawn_w = np.concatenate(drawn_diff) if drawn_diff else np.zeros(0, I64)
    reached_w = np.zeros(len(reached[0]) if width else 0, dtype=I64)
    if found_at:
        np.add.at(reached_w, np.concatenate(found_at), np.concatenate(found_diff))
    return drawn, drawn_w, reached_w


def _recompute_within_budget(
    audit: SampledAudit, ran: Sequence[int], checked: list[np.ndarray], starts: np.ndarray
) -> tuple[Block | None, np.ndarray, float]:
    """The checked tuples at `starts` recomputed, a quarter of them at a time while their joins
    go past the budget (an aggregate's groups). Returns what was recomputed (None when even 16
    tuples go past it), the tuples kept and the share of the tuples kept."""
    share = 1.0
    while True:
        try:
            return audit.expected(ran, [c[starts] for c in checked]), starts, share
        except TooMuch:
            if len(starts) <= 16:
                return None, starts, share
            share *= len(starts) // 4 / len(starts)
            starts = np.sort(audit.rng.choice(starts, len(starts) // 4, replace=False))
            audit.notes.append(f"{len(starts):,} of the tuples recomputed (joins past budget)")


@dataclass(frozen=True, slots=True)
class Recount:
    """The stored change's sum against its recount (`Engine.recount`): what is wrong, what the
    audit's method says of it, its chance to find a missing or extra tuple and what it can
    miss. Not recounted (a state not on this machine, a pass that fails), the sample's chance
    (`catch`) is the check's."""

    wrong: list[str]
    note: str
    catch: float
    misses: str

    @classmethod
    def of(cls, engine: Engine, query: str, epoch: int, stored: int, catch: float) -> Recount:
        misses = f"a wrong tuple outside the sample (each found with chance {catch:.3g})"
        try:
            if not engine.local:
                raise WcojError("the state is not on this machine")
            total = engine.recount(epoch).get(query, 0)
        except WcojError as e:
            return cls([], f"the change's sum not recounted ({e})", catch, misses)
        wrong = (
            []
            if total == stored
            else [
                f"the change's sum at epoch {epoch}: stored {stored:,}, recounted {total:,} (a "
                "tuple missing, extra or of a wrong multiplicity)"
            ]
        )
        note = (
            "the change's sum recounted whole by the engine's kernel from the landed changes "
            "(independent of the stored change, its files and figures)"
        )
        misses = (
            "errors leaving the change's sum as it is (a tuple replaced by another of its "
            f"multiplicity, errors that cancel) outside the sample ({misses}); the recount is "
            "the kernel's: an error of its joins themselves only when sampled"
        )
        return cls(wrong, note, 1.0, misses)


def old_state(
    engine: Engine, trace: Trace | None, width: int, epoch: int, query: str
) -> _Relation | None:
    """The output's old state as the audit reads it, when its tuples may be held other than
    once (an indexed output); None otherwise. Read from its mapped segments when its index
    covers exactly the epochs up to this one (an epoch audited as it is applied); for an older
    epoch from its batches before the epoch (a scan), so that an epoch's check never depends on
    the batches after it."""
    if query not in engine.served.indexed_outputs():
        return None
    old = _Relation(engine, trace, width, epoch)
    if old.index is not None and old.index.time > epoch:
        old.index = None
        old.notes.add(f"its batches before epoch {epoch} read (its index covers later epochs)")
    return old


def audit_epoch(
    engine: Engine,
    query: str,
    epoch: int,
    mode: AuditMode = AuditMode.SAMPLED,
    seed: int | None = None,
) -> Audit:
    """Check query `query`'s stored change at `epoch` against its recomputation and its figures
    against those before plus the change (see the module): `SAMPLED` (the default, `seed` drawn
    when None) or `FULL`. A damaged batch raises `DamagedBatch`."""
    started = clock.perf_counter()
    manifest = engine.store.current()
    relations = _relations(engine, query, epoch, manifest)
    q = engine.queries[query]
    if seed is None:
        seed = int(np.random.SeedSequence().entropy) % (1 << 32)  # type: ignore[arg-type]
    trace = manifest.trace(output_trace_name(query))
    batch = next((b for b in trace.batches if b.time == epoch), None) if trace else None
    changed = change_rows(manifest, q, epoch)
    small = changed <= EXACT_DELTA and (batch.rows if batch else 0) <= EXACT_STORED
    if mode is AuditMode.SAMPLED and q.head and not small:
        return sampled_audit(engine, query, epoch, manifest, relations, seed)
    budget = JOINED if mode is AuditMode.SAMPLED and q.head else None
    try:
        expected = _recompute(engine, query, epoch, manifest, relations, budget)
    except TooMuch:  # a small change whose joins are not: a sample after all
        return sampled_audit(engine, query, epoch, manifest, relations, seed)
    width = len(q.head)
    stored: Block = ([np.zeros(0, I64) for _ in range(width)], np.zeros(0, I64))
    if trace is not None and batch is not None:
        layer = engine.read_batch(trace, batch)
        rows = np.asarray(layer.rows)
        stored = ([rows[:, k] for k in range(width)], np.asarray(layer.diff))
    mismatches, examples = _compare((list(expected.columns), expected.weights), stored)
    tally = FigureTally(old_state(engine, trace, width, epoch, query), width)
    tally.add(stored[0], stored[1])
    problems = tally.problems(epoch, *figures_around(trace, epoch))
    return Audit(
        passed=mismatches == 0 and not problems,
        mismatches=mismatches,
        examples=examples + problems,
        expected_rows=len(expected.weights),
        actual_rows=len(stored[1]),
        joined_rows=expected.joined_rows,
        seconds=clock.perf_counter() - started,
        method=expected.method + tally.read(),
        mode="full" if mode is AuditMode.FULL else "exact",
        figures="; ".join(problems) or "ok",
    )
