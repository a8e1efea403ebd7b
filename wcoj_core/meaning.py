"""What a relation's changes mean: a set or a bag, declared once per relation.

One `RelationSpec` per relation says whether it is a **bag** (signed multiplicities) or a
**set** (each tuple present or not), and whether it is **undirected** (each landed ``(a, b,
diff)`` read both ways, self-loops dropped); the state records it. Defaults (`relation_specs`):
an undirected relation is a set, any other a bag. `effect` turns an epoch's landed changes into
the relation's change with a lookup per changed tuple: for a set, the summed landed diff ``s``
per tuple makes it present (``s > 0``) or absent (``s < 0``), inserting a present tuple or
deleting an absent one counted (`Effect.ignored`); for a bag the landed changes are the change,
negative multiplicities counted and a few named.

>>> spec = RelationSpec("edge", 2, Meaning.SET)
>>> landed = Layer.build(np.array([[1, 2], [3, 4], [5, 6]]), np.array([2, -1, 1]))
>>> before = Layer.build(np.array([[1, 2], [5, 6]]), np.array([1, 1]))
>>> e = effect(spec, landed, [before])
>>> e.change.rows.tolist(), e.change.diff.tolist(), e.inserted_present, e.deleted_absent
([], [], 2, 1)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from wcoj_core.errors import MultiplicityOverflow, QueryError
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import Layer, mirrored_lookup_sum
from wcoj_core.kernel.multiplicity import LIMIT, exact_sum, total
from wcoj_core.store.manifest import Meaning

if TYPE_CHECKING:
    from wcoj_core.spill import Spill

# Tuples named in a warning about ignored changes or negative multiplicities.
EXAMPLES = 10


@dataclass(frozen=True, slots=True)
class RelationSpec:
    """A relation: its name, arity, meaning and whether its landed edges are undirected."""

    name: str
    arity: int
    meaning: Meaning
    undirected: bool = False

    def describe(self) -> str:
        """``set``, ``bag``, ``undirected set`` ...

        >>> RelationSpec("e", 2, Meaning.SET, True).describe()
        'undirected set'
        """
        return f"{'undirected ' if self.undirected else ''}{self.meaning.value}"


def relation_specs(
    arities: Mapping[str, int],
    *,
    undirected: Iterable[str] = (),
    sets: Iterable[str] = (),
    bags: Iterable[str] = (),
) -> dict[str, RelationSpec]:
    """The spec of every relation of `arities`: undirected ones binary, meanings as declared,
    else the defaults (a set when undirected, else a bag).

    >>> relation_specs({"edge": 2, "w": 3}, undirected=["edge"])["edge"].meaning
    <Meaning.SET: 'set'>
    >>> relation_specs({"edge": 2, "w": 3}, undirected=["edge"])["w"].meaning
    <Meaning.BAG: 'bag'>
    >>> relation_specs({"w": 3}, undirected=["w"])
    Traceback (most recent call last):
      ...
    wcoj_core.errors.QueryError: undirected relation 'w' has arity 3; only a binary relation can be undirected
    """
    undirected, sets, bags = set(undirected), set(sets), set(bags)
    known = ", ".join(sorted(arities)) or "none"
    for what, names in (("undirected", undirected), ("set", sets), ("bag", bags)):
        for name in sorted(names - set(arities)):
            raise QueryError(
                f"{what} relation {name!r} is read by no query (the relations: {known})"
            )
    for name in sorted(sets & bags):
        raise QueryError(f"relation {name!r} is declared both a set and a bag; pick one")
    for name in sorted(undirected):
        if arities[name] != 2:
            raise QueryError(
                f"undirected relation {name!r} has arity {arities[name]}; only a binary relation "
                "can be undirected"
            )
    out: dict[str, RelationSpec] = {}
    for name, arity in sorted(arities.items()):
        if name in sets or (name in undirected and name not in bags):
            meaning = Meaning.SET
        else:
            meaning = Meaning.BAG
        out[name] = RelationSpec(name, arity, meaning, name in undirected)
    return out


@dataclass(frozen=True, slots=True)
class Figures:
    """A trace as of an epoch: distinct tuples held, summed multiplicity, tuples held a negative
    number of times.

    >>> Figures(3, 4, 0).plus(Figures(-1, -1, 1))
    Figures(rows=2, count=3, negative=1)
    """

    rows: int = 0
    count: int = 0
    negative: int = 0

    def plus(self, change: Figures, what: str = "a trace") -> Figures:
        """The figures after `change`; a count that leaves int64 (a multiplicity summed over
        the whole trace) raises `MultiplicityOverflow`."""
        out = Figures(
            self.rows + change.rows, self.count + change.count, self.negative + change.negative
        )
        if not -LIMIT <= out.count < LIMIT:
            raise MultiplicityOverflow(f"the count (summed multiplicity) of {what}")
        return out

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.rows, self.count, self.negative)


def held_after(before: np.ndarray, diff: np.ndarray, rows: np.ndarray, what: str) -> np.ndarray:
    """``before + diff``, exact: a multiplicity leaving int64 raises `MultiplicityOverflow`
    naming the tuple (a row of `rows`)."""
    return total([np.array(before, dtype=I64), np.asarray(diff, dtype=I64)], _namer(rows), what)


def _namer(rows: np.ndarray) -> Any:
    return lambda i: tuple(int(v) for v in rows[i])


def figures_change(
    before: np.ndarray, diff: np.ndarray, rows: np.ndarray | None = None, what: str = "a trace"
) -> Figures:
    """How a trace's figures change when tuples held `before` times change by `diff`.

    >>> figures_change(np.array([0, 1, 2, -1]), np.array([1, -1, 1, 1]))
    Figures(rows=-1, count=2, negative=-1)
    """
    if rows is None:
        rows = np.zeros((len(diff), 0), dtype=I64)
    after = held_after(before, diff, rows, f"the multiplicity of a tuple of {what}")
    entering = int(np.count_nonzero((before == 0) & (after != 0)))
    leaving = int(np.count_nonzero((before != 0) & (after == 0)))
    negative = int(np.count_nonzero(after < 0)) - int(np.count_nonzero(before < 0))
    return Figures(entering - leaving, exact_sum(diff), negative)


@dataclass(frozen=True, slots=True)
class Effect:
    """What an epoch's landed changes do to a relation: `change` (its batch at the epoch),
    `landed` (as the relation reads them: a set's signs, or the landed layer), `ignored`,
    `figures` (their change) and `negative` (tuples now held negatively, the first `EXAMPLES`)."""

    change: Layer
    landed: Layer
    ignored: Layer
    figures: Figures
    inserted_present: int = 0
    deleted_absent: int = 0
    ignored_examples: tuple[tuple[tuple[int, ...], int], ...] = ()
    negative: int = 0
    negative_examples: tuple[tuple[tuple[int, ...], int], ...] = field(default=())
    # The multiplicities `change`'s tuples held before the epoch, in its row order, when the
    # lookup made them (None: not kept, e.g. a large change made a piece at a time): what the
    # counts' support change reads again (`wcoj_core.kernel.changes.support_delta`).
    held: np.ndarray | None = None


def effect(spec: RelationSpec, landed: Layer, before: Sequence[Layer]) -> Effect:
    """The effect of consolidated landed changes on a relation held as the sum of `before`."""
    first = spec.meaning is Meaning.SET and len(landed) and not any(len(b) for b in before)
    if first and bool((np.asarray(landed.diff) > 0).all()):
        # A set's first load, every tuple inserted: each enters once (no lookup, no array of
        # old multiplicities), as the general case below would find.
        n = len(landed)
        ones = landed if landed.unit else landed.with_diff(np.ones(n, dtype=I64), symmetric=True)
        return Effect(ones, ones, Layer.empty(landed.width), Figures(n, n, 0))
    # An undirected relation's changes are their own mirror, as it is: half of them looked up.
    held = mirrored_lookup_sum(before, landed) if len(landed) else np.zeros(0, dtype=I64)
    if spec.meaning is Meaning.BAG:
        what = f"relation {spec.name!r}"
        figures = figures_change(held, landed.diff, landed.rows, what)
        after = held_after(held, landed.diff, landed.rows, f"the multiplicity of a tuple of {what}")
        negative = np.flatnonzero(after < 0)
        return Effect(
            landed,
            landed,
            Layer.empty(landed.width),
            figures,
            negative=len(negative),
            negative_examples=_examples(landed.rows, after, negative),
            held=held,
        )
    sign = np.sign(landed.diff).astype(I64)
    if len(held) and not bool(((held == 0) | (held == 1)).all()):
        bad = int(np.flatnonzero((held != 0) & (held != 1))[0])
        raise QueryError(
            f"relation {spec.name!r} is a set but holds {tuple(int(v) for v in landed.rows[bad])} "
            f"{int(held[bad])} times; the state was written with another meaning"
        )
    change = (sign > 0).astype(I64) - held
    moved = change != 0
    inserted_present = int(np.count_nonzero((sign > 0) & (held == 1)))
    deleted_absent = int(np.count_nonzero((sign < 0) & (held == 0)))
    kept = np.flatnonzero(~moved)
    normalized = landed.with_diff(sign)
    picked = np.flatnonzero(moved)
    return Effect(
        _subset(landed, picked, change),
        normalized,
        _subset(landed, kept, sign),
        Figures(exact_sum(change), exact_sum(change), 0),
        inserted_present,
        deleted_absent,
        _examples(landed.rows, sign, kept),
        held=held if len(picked) == len(held) else held[picked],
    )


def _subset(layer: Layer, picked: np.ndarray, diff: np.ndarray) -> Layer:
    """The rows of a sorted layer at `picked` (increasing) with `diff` there: sorted,
    consolidated, and a `symmetric` layer's mirror pairs picked together."""
    if len(picked) == len(layer):
        return layer.with_diff(diff, symmetric=True)
    out = Layer(layer.rows[picked], diff[picked])
    return out.mirrored() if layer.symmetric and len(out) else out


def _examples(
    rows: np.ndarray, values: np.ndarray, picked: np.ndarray
) -> tuple[tuple[tuple[int, ...], int], ...]:
    return tuple(
        (tuple(int(v) for v in rows[i]), int(values[i])) for i in picked[:EXAMPLES].tolist()
    )


def landed_digest(landed: Layer, *, sign: bool = False, rows_at_once: int = 1 << 20) -> str:
    """A digest of landed changes (consolidated, sorted): equal changes, equal digests. With
    `sign`, of each tuple's sign rather than its diff (a set's landed changes). Read a piece at
    a time: a layer of any size is hashed in bounded memory.

    >>> a = Layer.build(np.array([[2, 1], [1, 2]]), np.array([1, 1]))
    >>> b = Layer.build(np.array([[1, 2], [2, 1]]), np.array([1, 1]))
    >>> landed_digest(a) == landed_digest(b), landed_digest(a) == landed_digest(Layer.empty(2))
    (True, False)
    >>> landed_digest(a, sign=True) == landed_digest(a.with_diff(np.array([5, 3])), sign=True)
    True
    """
    n = len(landed)
    h = hashlib.sha256(f"{landed.width}:{n}".encode())
    for lo in range(0, n, rows_at_once):
        h.update(np.ascontiguousarray(landed.rows[lo : lo + rows_at_once], dtype=I64).tobytes())
    for lo in range(0, n, rows_at_once):
        diff = np.asarray(landed.diff[lo : lo + rows_at_once], dtype=I64)
        h.update(np.ascontiguousarray(np.sign(diff) if sign else diff, dtype=I64).tobytes())
    return h.hexdigest()[:32]


def effects(
    spec: RelationSpec, landed: Layer, before: Sequence[Layer], spill: Spill | None
) -> Effect:
    """`effect` of landed changes of any size: a large layer a piece at a time, its change
    and ignored changes written a piece at a time (`wcoj_core.spill.LayerWriter`: in memory
    while they fit, else into mapped files). The same effect, field for field."""
    if spill is None or not spill.big(landed):
        return effect(spec, landed, before)
    from wcoj_core.spill import LayerWriter, chunks

    width, packing = landed.width, landed.packing
    change = LayerWriter(spill.scratch, width, packing, spill.layer_bytes)
    ignored = LayerWriter(spill.scratch, width, packing, spill.layer_bytes)
    figures = Figures()
    inserted = deleted = negative = 0
    ignored_examples: list[tuple[tuple[int, ...], int]] = []
    negative_examples: list[tuple[tuple[int, ...], int]] = []
    # While every piece's change is the piece itself (a first load: nothing held before, each
    # tuple once), nothing is written: the change is then the landed layer as it is.
    same: list[Layer] | None = []
    for piece in chunks(landed, spill.chunk_rows(width)):
        e = effect(spec, piece, before)
        if same is not None:
            if len(e.change) == len(piece) and np.array_equal(e.change.diff, piece.diff):
                same.append(piece)
            else:
                for p in same:
                    change.add(np.asarray(p.rows), np.asarray(p.diff))
                same = None
        if same is None:
            change.add(np.asarray(e.change.rows), np.asarray(e.change.diff))
        ignored.add(np.asarray(e.ignored.rows), np.asarray(e.ignored.diff))
        figures = figures.plus(e.figures, f"relation {spec.name!r}")
        inserted += e.inserted_present
        deleted += e.deleted_absent
        negative += e.negative
        ignored_examples += e.ignored_examples[: EXAMPLES - len(ignored_examples)]
        negative_examples += e.negative_examples[: EXAMPLES - len(negative_examples)]
    return Effect(
        landed if same is not None else change.finish(),
        landed,
        ignored.finish(),
        figures,
        inserted,
        deleted,
        tuple(ignored_examples),
        negative,
        tuple(negative_examples),
    )
