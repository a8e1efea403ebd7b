"""Queries attached to a kept state after its first epoch, and detached from it.

`attach(served, access, names)` adds queries to a state that holds epochs, in one commit. Each
query's output is made as of the state's latest epoch ``E`` from the arrangements the state
keeps (`wcoj_core.ask.Snapshot`: the relations' mapped segments; no change landed again, no
relation copied), within the memory budget and on the driver's threads
(`wcoj_core.deploy.driver`), and written as its output trace's batch at ``E``: its whole output
as of ``E``, with its figures, and its index when the output is indexed. A counts arrangement
the query reads that the state does not keep yet is made from the relation's batches, one
batch per epoch the relation holds (the counts as of that epoch less those before it: the state
stays whole as of every epoch it holds); a view of a relation its index lacks is arranged from
the relation as of the index. The plan records the query with ``since`` = ``E``. From then on
every epoch maintains it with the others (`wcoj_core.epoch`): an epoch before ``E`` derived again
(after a correction) leaves it alone, and epoch ``E`` derived again makes its whole output again.

`detach(store, names)` removes queries from the plan, in one commit, with the traces only they
read: their output, their rules', the counts arrangements no other query reads, and a relation
no other query reads. Pruning then removes their files.
"""

from __future__ import annotations

import time as clock
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from wcoj_core import lineage
from wcoj_core.ask import Question, Snapshot
from wcoj_core.deploy.driver import run_on_driver
from wcoj_core.deploy.work import RuleJob, Work
from wcoj_core.errors import QueryError, StateError
from wcoj_core.indexes import Opened, advance
from wcoj_core.kernel.changes import counts_delta
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import Layer, arranged, merged, summed_sorted
from wcoj_core.meaning import Meaning
from wcoj_core.query.plan import Arrangement, Kind
from wcoj_core.served import Served, StateAccess
from wcoj_core.spill import Scratch, Spill, chunks, merge_into
from wcoj_core.store import manifest as mf
from wcoj_core.store.batches import BatchWriter
from wcoj_core.store.names import new_batch_path, new_segment_path
from wcoj_core.store.segments import write_segment
from wcoj_core.store.store import Store
from wcoj_core.traces import counts_trace_name, output_trace_name, relation_trace_name

__all__ = ["Attached", "attach", "detach"]


@dataclass(frozen=True, slots=True)
class Attached:
    """What an attach did: the queries, the epoch they were attached at, the generation
    committed, each output's rows and count, the bytes written and the seconds taken."""

    queries: tuple[str, ...]
    epoch: int
    generation: int
    rows: dict[str, int]
    counts: dict[str, int]
    written_bytes: int
    seconds: float


def attach(served: Served, access: StateAccess, names: Sequence[str]) -> Attached:
    """Attach the queries `names` of `served` to its state (see the module)."""
    started = clock.perf_counter()
    store = access.store
    m = store.current()
    held = m.plan or mf.StatePlan()
    if m.epoch is None:
        raise StateError(
            f"the state at {store.root} holds no epoch: its first epoch makes every query"
        )
    for name in names:
        if name in held.queries:
            raise QueryError(f"the state at {store.root} keeps query {name!r} already")
        missing = sorted(set(served.queries[name].relations) - set(held.relations))
        if missing:
            raise QueryError(
                f"query {name} reads {', '.join(missing)}, which the state at {store.root} does "
                f"not hold (it holds {', '.join(sorted(held.relations)) or 'no relation'})"
            )
    if not access.local:
        raise StateError(f"queries are attached to a local state; {store.root} is not")
    epoch, written = m.epoch, []
    snapshot = Snapshot(store, m, epoch)
    scratch = Scratch(access.scratch_root(), lambda _n: None)
    spill = Spill.of(scratch, served.shares)
    chain = lineage.chains(m, [relation_trace_name(r) for r in held.relations]).get(epoch, "")
    traces = dict(m.traces)
    try:
        for a in _new_counts(served, names, m):
            traces[counts_trace_name(a)] = _counts_history(served, access, m, epoch, a, written)
        for rel in {r for n in names for r in served.queries[n].relations}:
            traces[relation_trace_name(rel)] = _views(served, snapshot, rel, written)
        for name in names:
            out = output_trace_name(name)
            traces[out] = _output(served, access, snapshot, name, spill, chain, written)
        queries = {**held.queries}
        for name in names:
            queries[name] = replace(served.record.queries[name], since=epoch)
        relations = {**held.relations, **served.record.relations}
        new = replace(m, traces=traces, plan=mf.StatePlan(relations, queries))
        committed = store.commit(new, expected=m)
    except BaseException:
        store.discard(written)
        raise
    finally:
        scratch.close()
    outs = {n: committed.traces[output_trace_name(n)] for n in names}
    return Attached(
        tuple(names),
        epoch,
        committed.generation,
        {n: t.figures_at(epoch)[0] for n, t in outs.items()},
        {n: t.figures_at(epoch)[1] for n, t in outs.items()},
        sum(
            committed.traces[n].bytes() - (m.traces[n].bytes() if n in m.traces else 0)
            for n in committed.traces
        ),
        clock.perf_counter() - started,
    )


def _output(
    served: Served,
    access: StateAccess,
    snapshot: Snapshot,
    name: str,
    spill: Spill,
    chain: str,
    written: list[str],
) -> mf.Trace:
    """Query `name`'s output trace: its whole output as of the snapshot's epoch, one batch."""
    query, epoch = served.queries[name], snapshot.epoch
    out = output_trace_name(name)
    columns = tuple(served.trace_columns(out))
    question = Question.of(query)
    sets = all(served.specs[r].meaning is Meaning.SET for r in query.relations)
    distinct = sets and set(query.head) == set(query.vars) and query.aggregate is None
    folder = new_batch_path(out, epoch, "k")
    written.append(folder)
    writer = BatchWriter(access.batches, folder, columns, epoch)
    work = Work(
        access.store.root,
        epoch,
        {name: question.plan},
        (),
        rules=(RuleJob(name, question.rule.delta, out),),
        distinct=frozenset({out}) if distinct else frozenset(),
    )
    snapshot.prepare(question)
    done = run_on_driver(
        work,
        snapshot,  # type: ignore[arg-type]
        shares_of=served.shares,
        spill=spill,
        streams={out: lambda: writer},
    ).changes[out]
    layer: Layer | None = None
    if done.arrays is not None:
        layer = Layer.sort(*done.arrays) if distinct else Layer(*done.arrays)
    elif done.runs is not None:
        width = len(columns)
        layer = merge_into(
            spill.scratch, done.runs, width, spill.layer_bytes, spill.merge_bytes, "an output"
        )
    negative = 0
    if layer is not None:
        for piece in chunks(layer, spill.chunk_rows(layer.width)):
            writer.write(np.asarray(piece.rows), np.asarray(piece.diff))
            negative += int(np.count_nonzero(np.asarray(piece.diff) < 0))
    figures = (writer.rows, writer.total, negative)
    batch = mf.Batch(folder, epoch, writer.rows, writer.close(), figures, inputs=chain)
    trace = mf.Trace(out, columns, (batch,))
    if out in served.views and layer is not None:
        empty = Opened(trace, epoch + 1, {}, Layer.empty(len(columns)), None)
        root = access.store.root
        index = advance(root, empty, layer, epoch, served.views[out], written, access.read_batch)
        trace = replace(trace, index=index)
    return trace


def _new_counts(served: Served, names: Sequence[str], m: mf.Manifest) -> list[Arrangement]:
    """The counts arrangements the queries read that the state does not keep."""
    out: dict[str, Arrangement] = {}
    for name in names:
        for a in served.plans[name].arrangements:
            if a.kind is Kind.COUNTS and counts_trace_name(a) not in m.traces:
                out.setdefault(counts_trace_name(a), a)
    return list(out.values())


def _counts_history(
    served: Served,
    access: StateAccess,
    m: mf.Manifest,
    epoch: int,
    a: Arrangement,
    written: list[str],
) -> mf.Trace:
    """A counts arrangement made from its relation's batches: a batch per epoch the relation
    holds (the counts as of it less those before it) and an index as of `epoch`, the latest."""
    name = counts_trace_name(a)
    rel = m.traces[relation_trace_name(a.view.relation)]
    chains = lineage.chains(
        m, [relation_trace_name(r) for r in (m.plan or mf.StatePlan()).relations]
    )
    columns = tuple(served.trace_columns(name))
    held = Layer.empty(len(rel.columns))
    before = Layer.empty(len(a.key))
    batches: list[mf.Batch] = []
    for b in sorted(rel.batches, key=lambda b: b.time):
        if not a.key and a.view.is_identity:  # the number of distinct tuples: its figures
            tuples = rel.figures_at(b.time)[0]
            counts = Layer(
                np.zeros((1 if tuples else 0, 0), dtype=I64),
                np.array([tuples][: 1 if tuples else 0], dtype=I64),
            )
        else:
            held = merged(held, access.read_batch(rel, b))
            view = arranged(held, a.view, tuple(range(a.view.arity)))
            counts = counts_delta(view.with_diff(np.ones(len(view), dtype=I64)), a.key)
        change = summed_sorted([counts, before.with_diff(-before.diff)])
        before = counts
        if not len(change):
            continue
        folder = new_batch_path(name, b.time, "k")
        written.append(folder)
        files = access.batches.write(
            folder, columns, np.asarray(change.rows), np.asarray(change.diff), b.time
        )
        figures = (len(counts), int(counts.diff.sum()), 0)
        batches.append(
            mf.Batch(folder, b.time, len(change), files, figures, inputs=chains.get(b.time, ""))
        )
    trace = mf.Trace(name, columns, tuple(batches))
    empty = Opened(trace, epoch + 1, {}, Layer.empty(len(columns)), None)
    root = access.store.root
    index = advance(root, empty, before, epoch, served.views[name], written, access.read_batch)
    return replace(trace, index=index)


def _views(served: Served, snapshot: Snapshot, rel: str, written: list[str]) -> mf.Trace:
    """A relation's trace with a base segment for every view the served plans read that its
    index lacks (when its index is as of the snapshot's epoch: else the next epoch rebuilds
    the index from the batches)."""
    name = relation_trace_name(rel)
    trace = snapshot.manifest.traces[name]
    index = trace.index
    if index is None or index.time != snapshot.epoch:
        return trace
    have = {(None if s.view is None else tuple(s.view), tuple(s.order)) for s in index.segments}
    added = []
    for key in sorted(served.views[name] - have, key=repr):
        pattern, order = key
        layer = summed_sorted(snapshot._open(name).at(key))
        path = new_segment_path(name)
        written.append(path)
        root = snapshot.store.root
        added.append(
            write_segment(root, path, layer, level=mf.Level.BASE, view=pattern, order=order)
        )
    return replace(trace, index=replace(index, segments=(*index.segments, *added)))


def detach(store: Store, names: Sequence[str]) -> mf.Manifest:
    """Remove the queries `names` from the state's plan with the traces only they read (see
    the module); the committed manifest."""
    from wcoj_core.indexes import counts_names
    from wcoj_core.query.parse import parse_query
    from wcoj_core.query.plan import plan_query

    m = store.current()
    held = m.plan or mf.StatePlan()
    unknown = [n for n in names if n not in held.queries]
    if unknown:
        raise QueryError(
            f"the state at {store.root} keeps no query {unknown[0]!r} (it keeps "
            f"{', '.join(held.queries) or 'none'})"
        )
    kept = {n: q for n, q in held.queries.items() if n not in names}
    if not kept:
        raise StateError(
            f"{', '.join(names)} is every query the state at {store.root} keeps: a state keeps "
            "at least one (remove the state's folder instead)"
        )
    plans = [plan_query(parse_query(q.text)) for q in kept.values()]
    relations = {r for q in kept.values() for r in q.relations}
    counts = set(counts_names(plans))
    traces = {
        n: t
        for n, t in m.traces.items()
        if (n.partition("/")[0] not in ("out", "rule", "counts", "rel", "ignored"))
        or (n.startswith("out/") and n[4:] in kept)
        or (n.startswith("rule/") and n.split("/")[1] in kept)
        or n in counts
        or (n.partition("/")[0] in ("rel", "ignored") and n.partition("/")[2] in relations)
    }
    plan = mf.StatePlan({r: p for r, p in held.relations.items() if r in relations}, kept)
    return store.commit(replace(m, traces=traces, plan=plan), expected=m)
