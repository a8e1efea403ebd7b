"""Which epochs a state derived from landed changes it no longer holds: stale epochs.

Every batch an epoch writes (a relation's change, a counts change, a rule's or a query's change)
records `inputs`: the *chain* of the epoch, a running digest of every relation's landed changes
at every epoch up to it (`Batch.landed`, a digest of the landed changes as the relation reads
them). Correcting an epoch (landing other changes at it) changes the chain from that epoch on,
so every later epoch's batches then record a chain that is no longer the state's: those epochs
are *stale*, and are derived again, oldest first, before any later epoch is applied
(`wcoj_core.engine.Engine.apply`). Re-landing identical changes changes no digest: nothing goes
stale.

A compacted batch (history merged up to a frontier) records the chain at the frontier in
`Batch.chain`; the chain goes on from it.

>>> from wcoj_core.store.manifest import Manifest
>>> chains(Manifest(), ["rel/e"])
{}
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from wcoj_core.store.manifest import Manifest


def epochs_of(manifest: Manifest) -> list[int]:
    """Every epoch some trace holds a batch for, in order."""
    return sorted({b.time for t in manifest.traces.values() for b in t.batches})


def chains(manifest: Manifest, relations: Sequence[str]) -> dict[int, str]:
    """The chain of every epoch of the state (see the module); `relations` are the relation
    trace names, whose batches' `landed` digests feed it."""
    landed: dict[int, dict[str, str]] = {}
    start: tuple[int, str] | None = None
    for name in sorted(relations):
        trace = manifest.trace(name)
        for b in trace.batches if trace is not None else ():
            if b.chain:
                if start is None or b.time > start[0]:
                    start = (b.time, b.chain)
                continue
            landed.setdefault(b.time, {})[name] = b.landed
    out: dict[int, str] = {}
    previous = ""
    for t in epochs_of(manifest):
        if start is not None and t <= start[0]:
            previous = start[1] if t == start[0] else previous
            out[t] = start[1] if t == start[0] else ""
            continue
        at = landed.get(t, {})
        text = ";".join(f"{n}={at.get(n, '')}" for n in sorted(relations))
        previous = hashlib.sha256(f"{previous}|{t}|{text}".encode()).hexdigest()[:32]
        out[t] = previous
    return out


def stale_epochs(manifest: Manifest, relations: Sequence[str]) -> list[int]:
    """The epochs whose batches record another chain than the state's now (see the module)."""
    chain = chains(manifest, relations)
    stale: set[int] = set()
    for trace in manifest.traces.values():
        for b in trace.batches:
            if b.chain or b.time not in chain:
                continue
            if b.inputs != chain[b.time]:
                stale.add(b.time)
    return sorted(stale)


def next_chain(previous: str, epoch: int, landed: dict[str, str], relations: Sequence[str]) -> str:
    """The chain of `epoch` given the previous epoch's and the epoch's landed digests (the same
    formula as `chains`)."""
    text = ";".join(f"{n}={landed.get(n, '')}" for n in sorted(relations))
    return hashlib.sha256(f"{previous}|{epoch}|{text}".encode()).hexdigest()[:32]
