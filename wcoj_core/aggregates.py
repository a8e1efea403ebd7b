"""An aggregate query's table, read from its arrangement, and what is made of several.

An aggregate query (``tri(a, count()) :- ...``, `wcoj_core.query.ir.Aggregate`) keeps one value
per group: its output trace ``out/<q>`` holds each group's key as a tuple whose multiplicity is
the group's value, so the trace's index is the arrangement key -> value (a group whose value is
0 is not held) and each epoch's batch is the change of the values (a diff per changed key).
`table` reads the values as of an epoch from that arrangement (its mapped segments, corrected by
the batches it does not cover): the group's columns ``c0 ..``, then the value column named after
the aggregate (``count``, ``sum_<x>``). `summary` gives what a reader shows of it: the groups,
the values' sum and the largest values.

The local clustering coefficient of a vertex combines two aggregates of an undirected graph,
``degrees`` (d(v)) and ``triangles-per-vertex`` (T(v), the triangles holding v): `clustering`
is 2 T(v) / (d(v) (d(v) - 1)), the share of pairs of v's neighbours that are adjacent (0 for a
vertex of degree below 2). Both are counted and kept up to date by the kernel; the quotient is
not linear, so it is made from their tables when read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from wcoj_core.errors import QueryError
from wcoj_core.query.ir import Query
from wcoj_core.traces import DIFF, output_trace_name

if TYPE_CHECKING:
    from wcoj_core.state_read import Reach

TOP = 10


def value_name(query: Query) -> str:
    """The name of an output's value column: the aggregate's (``diff`` for other queries).

    >>> from wcoj_core.query.parse import parse_query
    >>> value_name(parse_query("p(a, sum(b)) :- e(a, b)")), value_name(parse_query("p(a) :- e(a)"))
    ('sum_b', 'diff')
    """
    return DIFF if query.aggregate is None else query.aggregate.name


def table(state: Reach, query: Query, time: int | None = None) -> pa.Table:
    """Aggregate query `query`'s values as of `time` (default: the last epoch): ``c0 ..`` and
    the value column, one row per group, sorted by key (see the module)."""
    from wcoj_core.indexes import identity, open_trace
    from wcoj_core.state_read import trace_as_of

    if query.aggregate is None:
        raise QueryError(f"query {query.name} has no aggregate in its head; read its output")
    trace, _ = trace_as_of(state, output_trace_name(query.name), time)
    width = len(trace.columns)
    latest = state.store.current().epoch
    epoch = time if time is not None else -1 if latest is None else latest
    opened = open_trace(
        state.store.root,
        trace,
        epoch + 1,
        [identity(width)],
        lambda t, b: state.batches.read_verified(b.path, t.columns, b.files, b.rows, b.time),
    )
    layer = opened.whole()
    rows = np.asarray(layer.rows)
    names = [*trace.columns, value_name(query)]
    return pa.table([*(rows[:, j] for j in range(width)), np.asarray(layer.diff)], names=names)


def summary(values: pa.Table, top: int = TOP) -> dict[str, Any]:
    """An aggregate's table in a few figures: its groups, the exact sum of its values and the
    `top` groups of the largest values (each a list of its key, then its value), largest first.

    >>> summary(pa.table({"c0": [1, 2, 3], "count": [5, 9, 5]}), 2)
    {'groups': 3, 'total': 19, 'top': [[2, 9], [1, 5]]}
    """
    from wcoj_core.kernel.multiplicity import exact_sum

    cols = [values.column(j).to_numpy() for j in range(values.num_columns)]
    value = cols[-1]
    best = np.lexsort([*reversed(cols[:-1]), -value])[:top] if len(value) else []
    rows = [[int(c[i]) for c in cols] for i in best]
    return {"groups": values.num_rows, "total": exact_sum(value), "top": rows}


def clustering(triangles: pa.Table, degrees: pa.Table) -> pa.Table:
    """Each vertex's local clustering coefficient (see the module) from the tables of
    ``triangles-per-vertex`` and ``degrees`` (`table`): ``c0``, ``degree``, ``triangles``,
    ``clustering``, by vertex.

    >>> t = pa.table({"c0": [1], "count": [1]})
    >>> d = pa.table({"c0": [1, 2, 3], "count": [2, 1, 1]})
    >>> clustering(t, d).column("clustering").to_pylist()
    [1.0, 0.0, 0.0]
    """
    d = degrees.rename_columns(["c0", "degree"])
    t = triangles.rename_columns(["c0", "triangles"])
    both = d.join(t, "c0", join_type="left outer").sort_by("c0")
    deg = both.column("degree").to_numpy().astype(np.float64)
    tri = both.column("triangles").fill_null(0).to_numpy().astype(np.float64)
    pairs = deg * (deg - 1)
    coefficient = np.divide(2 * tri, pairs, out=np.zeros_like(tri), where=pairs > 0)
    return pa.table(
        {
            "c0": both.column("c0"),
            "degree": both.column("degree"),
            "triangles": both.column("triangles").fill_null(0),
            "clustering": coefficient,
        }
    )
