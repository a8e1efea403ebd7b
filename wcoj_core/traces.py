"""The names of a state's traces (one per relation, counts arrangement, delta rule and query) and
of their columns.

A state directory holds named traces of update batches (see `wcoj_core.store`). Their names are
part of the stored format and of the Dagster metadata, so they are made in one place:

>>> from wcoj_core.query.plan import Arrangement, AtomView, Kind
>>> relation_trace_name("edge"), output_trace_name("tri"), rule_trace_name("tri", 2)
('rel/edge', 'out/tri', 'rule/tri/2')
>>> counts_trace_name(Arrangement(Kind.COUNTS, AtomView("edge", (0, 1)), (1,)))
'counts/edge/1'
"""

from __future__ import annotations

from wcoj_core.query.plan import Arrangement

TIME = "time"  # the epoch column of stored update triples
DIFF = "diff"  # the signed multiplicity column


def relation_columns(arity: int) -> list[str]:
    """Canonical data column names of a relation of the given arity: ``c0 .. c{arity-1}``.

    >>> relation_columns(3)
    ['c0', 'c1', 'c2']
    """
    return [f"c{i}" for i in range(arity)]


def relation_trace_name(relation: str) -> str:
    """The trace of a relation's changes."""
    return f"rel/{relation}"


def counts_trace_name(arrangement: Arrangement) -> str:
    """The trace of a counts arrangement: view tuples with a non-zero multiplicity, per key."""
    return f"counts/{arrangement.view}/{','.join(map(str, arrangement.key))}"


def output_trace_name(query: str) -> str:
    """The trace of a query's output changes."""
    return f"out/{query}"


def rule_trace_name(query: str, rule: int) -> str:
    """The trace of one delta rule's output changes (kept by epoch-addressed steps only)."""
    return f"rule/{query}/{rule}"
