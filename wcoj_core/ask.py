"""Ask a kept state anything: a conjunctive query answered from its arrangements, as of an epoch.

`Snapshot.open(state, epoch)` reads one manifest generation and nothing else: the traces a
question reads are opened as of the epoch when first asked for (their segments mapped,
corrected by the batches the index lacks or holds beyond the epoch: `wcoj_core.indexes`), and
held — a mapped file stays readable after a later commit prunes it. Nothing is written and no
lock is taken: an ``apply`` beside it commits as it would alone, and the snapshot answers from
the generation it read. A file a later commit pruned before it was opened is met by reading the
current generation again (`Snapshot.ask`, once per commit, a few times at most).

`Question.of(query, given)` prepares a query once: its constants and the variables a caller
binds (`given`) become the columns of one relation of bindings, ``_given``, whose delta rule
the kernel runs (`wcoj_core.kernel.join.run_rule`): it starts from the bindings, so a question
about a vertex costs a lookup of the vertex's key range and the work of its candidates — never
a scan — and a thousand vertices are one run. A question with nothing bound is evaluated whole:
the delta rule of its last atom, every atom reading the relations as of the epoch.

`Snapshot.ask` answers with the output's rows summed: a pyarrow table of the head's variables
and ``diff`` (an aggregate's value column named after it, `wcoj_core.aggregates.value_name`).
Counts arrangements a question needs that the state does not keep are made from the relation
as of the epoch, once per snapshot. `ask` is the same for one call over a state's path.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from wcoj_core.errors import DamagedFile, QueryError, StateError
from wcoj_core.indexes import KEPT, Opened, ViewKey, identity, open_trace, view_key
from wcoj_core.kernel.join import (
    PROPOSAL_BUDGET,
    Pace,
    Part,
    RuleTally,
    check_overflow,
    prepare,
    run_from,
    run_rule,
)
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import Layer, summed_sorted, usable_cores
from wcoj_core.kernel.step import (
    NativeExtender,
    Prefixes,
    StepCounts,
    count,
    extend,
    native_extenders,
)
from wcoj_core.query.ir import Atom, Const, Query, Term, Var
from wcoj_core.query.plan import Arrangement, AtomView, DeltaRule, Kind, Plan, Version, plan_query
from wcoj_core.store.manifest import Manifest, Trace
from wcoj_core.store.store import Store
from wcoj_core.traces import DIFF, counts_trace_name, relation_trace_name

if TYPE_CHECKING:  # Arrow, Parquet and the changes' module are imported when first needed:
    import pyarrow as pa  # a question of one vertex answered as numbers never needs them

__all__ = ["GIVEN", "Question", "Snapshot", "ask", "table_of"]

# The relation of bindings a question starts from (its given variables, then its constants).
GIVEN = "_given"
# Bindings of a question's given variables: a row each (a value each, for one variable).
Values = np.ndarray | Sequence[Sequence[int]] | Sequence[int]
# The threads a question's compiled loops may use (a small one stays on one: `Pace`).
PACE = Pace(threads=max(1, min(4, usable_cores())))
# Bindings this few are asked step by step with each step's extenders made once per question
# (`Snapshot.few`): what a question about one vertex costs is then mostly the kernel's own.
FEW = 64
# How many times a question is tried again when a commit beside it pruned a file it had not
# opened yet (each try reads the current generation).
RETRIES = 3


@dataclass(frozen=True, slots=True)
class Question:
    """A query prepared for asking (see the module): `plan` is the query with its constants
    and `given` variables bound by the ``_given`` atom (when any), `rule` the rule that runs,
    `given` the bindings' columns (the caller's variables, then one per constant)."""

    query: Query
    plan: Plan
    rule: DeltaRule
    given: tuple[Var, ...]
    constants: tuple[int, ...]
    # Whether the answer's rows are the rule's full bindings projected on their non-constant
    # variables, each binding made once (the kernel makes each binding of one rule once, its
    # candidates merged over the layers): then they are not sorted or summed again.
    distinct: bool = False

    @classmethod
    def of(
        cls, query: Query, given: Sequence[str] = (), sizes: Mapping[str, int] | None = None
    ) -> Question:
        """`query` with the variables named in `given` bound by the caller.

        >>> from wcoj_core.query.parse import parse_query
        >>> q = Question.of(parse_query("q(b, c) :- edge(7, b), edge(b, c), edge(7, c)"))
        >>> str(q.plan.query), q.constants
        ('q(b, c) :- _given(_k0), edge(_k0, b), edge(b, c), edge(_k0, c)', (7,))
        >>> [str(s.var) for s in q.rule.steps]
        ['b', 'c']
        """
        if GIVEN in query.relations:
            raise QueryError(f"{GIVEN} names the bindings of a question: rename that relation")
        known = {v.name: v for v in query.vars}
        unknown = [g for g in given if g not in known]
        if unknown or len(set(given)) != len(given):
            raise QueryError(
                f"cannot bind {', '.join(unknown) or 'a variable twice'}: give each of the "
                f"query's variables ({', '.join(known)}) at most once"
            )
        fresh: dict[int, Var] = {}
        names = (f"_k{i}" for i in itertools.count())

        def term(t: Term) -> Term:
            if isinstance(t, Var):
                return t
            if t.value not in fresh:
                fresh[t.value] = Var(next(n for n in names if n not in known))
            return fresh[t.value]

        atoms = tuple(Atom(a.relation, tuple(term(t) for t in a.terms)) for a in query.atoms)
        bound = (*(known[g] for g in given), *fresh.values())
        head = query.head
        distinct = query.aggregate is None and len(set(head)) == len(head) == len(query.vars)
        if not bound:
            plan = plan_query(query, sizes)
            return cls(query, plan, plan.rules[-1], (), (), distinct)
        body = (Atom(GIVEN, bound), *atoms)
        rewritten = Query(query.name, query.head, body, query.filters, query.aggregate)
        plan = plan_query(rewritten, {**(sizes or {}), GIVEN: 1})
        return cls(query, plan, plan.rules[0], bound, tuple(fresh), distinct)

    @property
    def names(self) -> list[str]:
        """The answer's columns: the head's variables, then ``diff`` or the aggregate's."""
        agg = self.query.aggregate
        return [*(v.name for v in self.query.head), DIFF if agg is None else agg.name]


class Snapshot:
    """A state as of an epoch, read-only: what the kernel reads a question from (it is the
    kernel's `Layers`; see the module)."""

    def __init__(self, store: Store, manifest: Manifest, epoch: int) -> None:
        self.store = store
        self.manifest = manifest
        self.epoch = epoch
        self._opened: dict[str, Opened] = {}
        self._layers: dict[tuple[str, ViewKey], list[Layer]] = {}
        self._counts: dict[str, Arrangement] = {}
        self._whole: dict[tuple[str, ViewKey], Layer] = {}
        self._prepared: dict[int, Question] = {}
        self._extenders: dict[int, list[list[NativeExtender]]] = {}

    @classmethod
    def open(cls, state: str, epoch: int | None = None) -> Snapshot:
        """The state at `state` as of `epoch` (default: its latest), refused in one line when
        the state holds no such epoch."""
        store = Store.open(state, create=False)
        m = store.current()
        return cls(store, m, _epoch_of(store, m, epoch))

    @property
    def generation(self) -> int:
        return self.manifest.generation

    def relations(self) -> dict[str, int]:
        """Each relation the state holds, with its arity."""
        plan = self.manifest.plan
        return {} if plan is None else {r: p.arity for r, p in plan.relations.items()}

    def question(self, query: Query, given: Sequence[str] = ()) -> Question:
        """`query` prepared over this state: its relations checked against the state's."""
        held = self.relations()
        for rel, arity in query.relations.items():
            if rel not in held:
                raise QueryError(
                    f"query {query.name} reads {rel!r}, which the state at {self.store.root} "
                    f"does not hold (it holds {', '.join(sorted(held)) or 'no relation'})"
                )
            if held[rel] != arity:
                raise QueryError(
                    f"query {query.name} reads {rel!r} with arity {arity}; the state holds it "
                    f"with arity {held[rel]}"
                )
        sizes = {r: self._trace(relation_trace_name(r)).rows(self.epoch) for r in query.relations}
        return Question.of(query, given, sizes)

    def ask(self, question: Question, values: Values | None = None) -> pa.Table:
        """The answer to `question` (see the module); `values` one row per binding of its
        given variables (none: the question binds no variable of the caller's)."""
        for attempt in range(RETRIES + 1):
            try:
                return table_of(question, self.answer(question, values))
            except (DamagedFile, FileNotFoundError):
                latest = self.store.current()
                if attempt == RETRIES or latest.generation == self.generation:
                    raise
                self._reopen(latest)
        raise AssertionError("unreachable")

    def answer(
        self, question: Question, values: Values | None = None
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """The answer's columns (the head's) and each row's weight, summed: consolidated, in
        the order the kernel makes them (see `Question.distinct`)."""
        given = _bindings(question, values)
        self.prepare(question)
        plan, rule = question.plan, question.rule
        few = self.few(question, given) if question.given and len(given) <= FEW else None
        if few is not None:
            parts: Iterable[Part] = [(few, None)]
        elif question.given:
            parts = run_from(plan, rule, given, self, RuleTally.of(rule), pace=PACE)
        else:
            parts = run_rule(plan, rule, self, RuleTally.of(rule), pace=PACE)
        made = [p if kept is None else p.take(kept) for p, kept in parts]
        head = plan.query.head
        if not question.distinct:
            from wcoj_core.kernel.changes import output_changes

            rows, diff = output_changes(made, head)
            return [rows[:, j] for j in range(len(head))], diff
        cols = [_joined([p.cols[v] for p in made]) for v in head]
        diff = _joined([p.weight for p in made])
        if not diff.all():
            keep = np.flatnonzero(diff)
            cols, diff = [c[keep] for c in cols], diff[keep]
        return cols, diff

    def few(self, question: Question, given: Prefixes) -> Prefixes | None:
        """`run_from`'s full bindings for a few bindings (`FEW`), step by step, each step's
        extenders made once per question; None for a question this path does not take (an
        aggregate, atoms checked before the first step) or bindings whose candidates exceed
        the proposal budget (`run_from` cuts those in pieces)."""
        plan, rule = question.plan, question.rule
        if plan.query.aggregate is not None or rule.checks:
            return None
        xs = self._extenders.get(id(question))
        if xs is None:
            names = [*question.given]
            xs = []
            for step in rule.steps:
                xs.append(native_extenders(plan, step, names, self, 1))
                names.append(step.var)
            self._extenders[id(question)] = xs
        p = given.filtered(rule.start_filters)
        for step, x in zip(rule.steps, xs, strict=True):
            live = count(plan, step, p, self, 1, x)
            if int(live.least.sum()) > PROPOSAL_BUDGET:
                return None
            p = extend(plan, step, p, live, (0, len(live)), self, StepCounts("")).made
        check_overflow(plan, (p, None))
        return p

    def prepare(self, question: Question) -> None:
        """Open every trace `question` reads (a file pruned by a commit beside this one is
        met here, before any work), once per question."""
        if id(question) in self._prepared:
            return
        self._counts.update(
            {counts_trace_name(a): a for a in question.plan.arrangements if a.kind is Kind.COUNTS}
        )
        prepare(question.plan, question.rule, self)
        self._prepared[id(question)] = question

    # -- the kernel's `Layers` ---------------------------------------------------------------
    def layers(
        self, name: str, view: AtomView | None, order: tuple[int, ...], version: Version
    ) -> list[Layer]:
        """A trace as of the epoch through a view (every version reads the same state)."""
        key = (name, view_key(view, order))
        found = self._layers.get(key)
        if found is None:
            found = self._layers[key] = self._find(name, view, order)
        return found

    def delta(self, name: str, view: AtomView | None, order: tuple[int, ...]) -> Layer:
        """The tuples a whole question's rule starts from: its relation as of the epoch."""
        return _whole(self, name, view, order)

    def _find(self, name: str, view: AtomView | None, order: tuple[int, ...]) -> list[Layer]:
        if name in self.manifest.traces and self._trace(name).batches:
            return self._open(name).layers(view, order)
        arrangement = self._counts.get(name)
        if arrangement is None:
            return []  # a trace with nothing in it: nothing as of any epoch
        return [_counts_of(self, arrangement).permuted(order)]

    def _trace(self, name: str) -> Trace:
        trace = self.manifest.trace(name)
        if trace is None:
            raise StateError(f"{name!r} is not in the state at {self.store.root}")
        return trace

    def _open(self, name: str) -> Opened:
        opened = self._opened.get(name)
        if opened is None:
            trace = self._trace(name)
            keys: set[ViewKey] = {identity(len(trace.columns))}
            if trace.index is not None:
                keys |= {(_pattern(s.view), tuple(s.order)) for s in trace.index.segments}
            opened = open_trace(
                self.store.root,
                trace,
                self.epoch + 1,
                keys,
                self._read_batch,
                kept=KEPT,
                mirror=self._undirected(name),
            )
            self._opened[name] = opened
        return opened

    def _undirected(self, name: str) -> bool:
        plan = self.manifest.plan
        kind, _, rel = name.partition("/")
        spec = plan.relations.get(rel) if plan is not None and kind == "rel" else None
        return spec is not None and spec.undirected

    def _read_batch(self, trace: Trace, batch: Any) -> Layer:
        from wcoj_core.store.batches import Batches

        return Batches(self.store.files).read_verified(
            batch.path, trace.columns, batch.files, batch.rows, batch.time
        )

    def _reopen(self, manifest: Manifest) -> None:
        """Read another generation (what `ask` does when a commit pruned a file beside it)."""
        self.manifest = manifest
        self.epoch = _epoch_of(self.store, manifest, self.epoch)
        self._opened.clear()
        self._layers.clear()
        self._whole.clear()
        self._prepared.clear()
        self._extenders.clear()


class Whole:
    """What a whole evaluation reads from an epoch's layers (`wcoj_core.kernel.index.Layers`):
    every atom as of the new state, the rule's delta atom whole (a query attached at the epoch,
    `wcoj_core.epoch`)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._whole: dict[tuple[str, ViewKey], Layer] = {}

    def layers(
        self, name: str, view: AtomView | None, order: tuple[int, ...], version: Version
    ) -> list[Layer]:
        return self.inner.layers(name, view, order, Version.NEW)

    def delta(self, name: str, view: AtomView | None, order: tuple[int, ...]) -> Layer:
        return _whole(self, name, view, order)


def _whole(layers: Any, name: str, view: AtomView | None, order: tuple[int, ...]) -> Layer:
    """A trace as of a state, summed into one layer (made once per reader)."""
    key = (name, view_key(view, order))
    found = layers._whole.get(key)
    if found is None:
        found = layers._whole[key] = summed_sorted(layers.layers(name, view, order, Version.NEW))
    return found


def _pattern(view: Iterable[Any] | None) -> tuple[int | Const, ...] | None:
    return None if view is None else tuple(view)


def _epoch_of(store: Store, m: Manifest, epoch: int | None) -> int:
    """The epoch a snapshot reads, checked against what the state holds."""
    if m.epoch is None:
        raise StateError(f"the state at {store.root} holds no epoch yet: apply one first")
    if epoch is None:
        return m.epoch
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise StateError(f"epoch {epoch!r} is not a whole number from 0")
    if epoch > m.epoch:
        raise StateError(
            f"the state at {store.root} holds epochs up to {m.epoch}; epoch {epoch} is not "
            "applied yet"
        )
    if m.frontier is not None and epoch < m.frontier:
        raise StateError(
            f"history before epoch {m.frontier} was compacted in {store.root} (its compaction "
            f"frontier); ask as of epoch {m.frontier} or later"
        )
    return epoch


def _bindings(question: Question, values: Values | None) -> Prefixes:
    """The bindings a question starts from: one per binding of its given variables, each once,
    with the constants appended (weights 1)."""
    width = len(question.given) - len(question.constants)
    if values is None:
        if width:
            names = ", ".join(v.name for v in question.given[:width])
            raise QueryError(f"give values for {names}: the question binds them")
        rows = np.zeros((1, 0), dtype=I64)
    else:
        rows = np.asarray(values, dtype=I64)
        if rows.ndim == 1 and width == 1:
            rows = rows.reshape(-1, 1)
        if rows.ndim != 2 or rows.shape[1] != width:
            raise QueryError(f"give {width} value(s) per binding, as many as the given variables")
    if width == 1:
        cols = [rows[:, 0].copy() if len(rows) == 1 else np.unique(rows[:, 0])]
    elif width:
        unique = Layer.build(rows, np.ones(len(rows), dtype=I64))
        cols = [np.ascontiguousarray(unique.col(j)) for j in range(width)]
    else:
        cols = []
    m = len(cols[0]) if cols else 1
    cols += [np.full(m, c, dtype=I64) for c in question.constants]
    return Prefixes(dict(zip(question.given, cols, strict=True)), np.ones(m, dtype=I64))


def _counts_of(snapshot: Snapshot, a: Arrangement) -> Layer:
    """A counts arrangement the state does not keep, made from its relation as of the
    snapshot's epoch: every view tuple's key, counted (the number of distinct view tuples when
    the key is empty and the view the relation's own: its figures say it)."""
    name = relation_trace_name(a.view.relation)
    if not a.key and a.view.is_identity:
        rows = snapshot._trace(name).figures_at(snapshot.epoch)[0]
        return Layer(np.zeros((1, 0), dtype=I64), np.array([rows], dtype=I64))
    from wcoj_core.kernel.changes import counts_delta

    whole = summed_sorted(snapshot.layers(name, a.view, tuple(range(a.view.arity)), Version.NEW))
    support = whole.with_diff(np.ones(len(whole), dtype=I64))
    return counts_delta(support, a.key)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=I64)


def table_of(question: Question, answer: tuple[list[np.ndarray], np.ndarray]) -> pa.Table:
    """`Snapshot.answer`'s columns as the answer's table (`Question.names`), each an Arrow
    array over the column's memory (``pa.array`` goes through its pandas shim: many times the
    cost of a small answer)."""
    import pyarrow as pa

    cols, diff = answer
    longs = pa.int64()  # (made once: each call costs as much as an array's wrapping)
    arrays = [
        pa.Array.from_buffers(longs, len(c), [None, pa.py_buffer(c)])
        for c in (np.ascontiguousarray(c, dtype=I64) for c in (*cols, diff))
    ]
    return pa.Table.from_arrays(arrays, names=question.names)


def ask(
    state: str,
    query: Query | str,
    *,
    epoch: int | None = None,
    bind: Mapping[str, Sequence[int]] | None = None,
) -> pa.Table:
    """The answer to `query` (a `Query`, a built-in's name or query text) over the state at
    `state` as of `epoch` (default: the latest), its variables in `bind` bound to each of the
    values given (all lists of one length: one binding per position).

    >>> ask("/nowhere", "q(a) :- e(a)")
    Traceback (most recent call last):
      ...
    wcoj_core.errors.StateError: no wcoj state at /nowhere
    """
    from wcoj_core.query.builtins import resolve_query

    q = resolve_query(query) if isinstance(query, str) else query
    snapshot = Snapshot.open(state, epoch)
    names = list(bind or {})
    question = snapshot.question(q, names)
    values = np.column_stack([np.asarray(bind[n], dtype=I64) for n in names]) if bind else None
    return snapshot.ask(question, values)
