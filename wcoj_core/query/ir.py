"""The query IR: immutable, hashable nodes that refuse bad construction.

A `Query` is a conjunctive query in Datalog style::

    head(a, b, c) :- rel(a, b), rel(b, c), other(a, c, 7), a < b, b != c

Terms are variables (`Var`) or integer constants (`Const`). Atoms name a relation and list one term
per column. Comparisons relate two terms. The validating constructors of `Query` check what makes a
query meaningful: at least one atom, every head and filter variable bound by some atom, and one
arity per relation.

A head may end with an `Aggregate`, ``count()`` or ``sum(x)``: the query's output is then one
value per group (the head's variables): the sum, over the group's bindings, of their weights
(``count()``) or of their weights times ``x`` (``sum(x)``). Both are linear in the weights, so
an aggregate's change is the aggregate of the join's change, and the delta rules carry over.

>>> q = Query("p", (Var("a"),), (Atom("e", (Var("a"), Const(1))),))
>>> q.relations
{'e': 2}
>>> Query("p", (Var("z"),), (Atom("e", (Var("a"),)),))
Traceback (most recent call last):
  ...
wcoj_core.errors.QueryError: head variable 'z' does not appear in any atom of the body
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from wcoj_core.errors import QueryError


@dataclass(frozen=True, slots=True)
class Var:
    """A query variable."""

    name: str

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise QueryError(f"variable name {self.name!r} is not an identifier")

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Const:
    """An integer constant (64-bit signed)."""

    value: int

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise QueryError(f"constant {self.value!r} is not an integer")
        if not -(2**63) <= self.value < 2**63:
            raise QueryError(f"constant {self.value} does not fit in 64 bits")

    def __str__(self) -> str:
        return str(self.value)


Term = Var | Const


class CmpOp(Enum):
    """A comparison operator of a filter."""

    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "="
    NE = "!="

    @property
    def fn(self) -> Callable[[int, int], bool]:
        """The Python function computing this comparison."""
        return _CMP_FN[self]

    def flipped(self) -> CmpOp:
        """The operator with its operands swapped: ``a < b`` is ``b > a``."""
        return _FLIPPED[self]


_CMP_FN: dict[CmpOp, Callable[[int, int], bool]] = {
    CmpOp.LT: operator.lt,
    CmpOp.LE: operator.le,
    CmpOp.GT: operator.gt,
    CmpOp.GE: operator.ge,
    CmpOp.EQ: operator.eq,
    CmpOp.NE: operator.ne,
}
_FLIPPED = {
    CmpOp.LT: CmpOp.GT,
    CmpOp.LE: CmpOp.GE,
    CmpOp.GT: CmpOp.LT,
    CmpOp.GE: CmpOp.LE,
    CmpOp.EQ: CmpOp.EQ,
    CmpOp.NE: CmpOp.NE,
}


@dataclass(frozen=True, slots=True)
class Atom:
    """One occurrence of a relation in a query body: ``rel(t0, t1, ...)``."""

    relation: str
    terms: tuple[Term, ...]
    _vars: tuple[Var, ...] = field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not self.relation.isidentifier():
            raise QueryError(f"relation name {self.relation!r} is not an identifier")
        seen: dict[Var, None] = {}
        for t in self.terms:
            if isinstance(t, Var):
                seen.setdefault(t, None)
        object.__setattr__(self, "_vars", tuple(seen))

    @property
    def arity(self) -> int:
        return len(self.terms)

    @property
    def vars(self) -> tuple[Var, ...]:
        """The distinct variables of the atom, in order of first occurrence (found once)."""
        return self._vars

    def __str__(self) -> str:
        return f"{self.relation}({', '.join(map(str, self.terms))})"


@dataclass(frozen=True, slots=True)
class Filter:
    """A comparison ``left op right`` between two terms, at least one of them a variable."""

    left: Term
    op: CmpOp
    right: Term

    def __post_init__(self) -> None:
        if not self.vars:
            raise QueryError(f"filter {self} compares two constants; it has no variable")

    @property
    def vars(self) -> frozenset[Var]:
        return frozenset(t for t in (self.left, self.right) if isinstance(t, Var))

    def holds(self, binding: dict[Var, int]) -> bool:
        """Evaluate the filter under a binding of (at least) its variables."""

        def value(t: Term) -> int:
            return binding[t] if isinstance(t, Var) else t.value

        return self.op.fn(value(self.left), value(self.right))

    def __str__(self) -> str:
        return f"{self.left} {self.op.value} {self.right}"


AGGREGATES = ("count", "sum")


@dataclass(frozen=True, slots=True)
class Aggregate:
    """A linear aggregate ending a head: ``count()`` (`var` None) or ``sum(var)``."""

    var: Var | None = None

    @property
    def name(self) -> str:
        """The value column's name: ``count`` or ``sum_<var>``."""
        return "count" if self.var is None else f"sum_{self.var}"

    def __str__(self) -> str:
        return "count()" if self.var is None else f"sum({self.var})"


@dataclass(frozen=True, slots=True)
class Query:
    """A conjunctive query: a head, body atoms and comparison filters."""

    name: str
    head: tuple[Var, ...]
    atoms: tuple[Atom, ...]
    filters: tuple[Filter, ...] = ()
    aggregate: Aggregate | None = None
    relations: dict[str, int] = field(init=False, compare=False, hash=False, repr=False)
    _vars: tuple[Var, ...] = field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise QueryError(f"query name {self.name!r} is not an identifier")
        if not self.atoms:
            raise QueryError("a query needs at least one atom in its body")
        arities: dict[str, int] = {}
        for atom in self.atoms:
            known = arities.setdefault(atom.relation, atom.arity)
            if known != atom.arity:
                raise QueryError(
                    f"relation {atom.relation!r} is used with arity {known} and with arity "
                    f"{atom.arity} ({atom}); a relation has one arity"
                )
        bound = {v for atom in self.atoms for v in atom.vars}
        used = (*self.head, *(() if self.aggregate is None else (self.aggregate.var,)))
        for v in used:
            if v is not None and v not in bound:
                raise QueryError(
                    f"head variable {v.name!r} does not appear in any atom of the body"
                )
        for f in self.filters:
            for v in sorted(f.vars, key=lambda v: v.name):
                if v not in bound:
                    raise QueryError(
                        f"filter {f} uses variable {v.name!r}, which no atom of the body binds"
                    )
        object.__setattr__(self, "relations", arities)
        seen: dict[Var, None] = {}
        for atom in self.atoms:
            for v in atom.vars:
                seen.setdefault(v, None)
        object.__setattr__(self, "_vars", tuple(seen))

    @property
    def vars(self) -> tuple[Var, ...]:
        """All variables of the body, in order of first occurrence (found once)."""
        return self._vars

    def __str__(self) -> str:
        body = [str(a) for a in self.atoms] + [str(f) for f in self.filters]
        head = [*map(str, self.head), *([] if self.aggregate is None else [str(self.aggregate)])]
        return f"{self.name}({', '.join(head)}) :- {', '.join(body)}"
