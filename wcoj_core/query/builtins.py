"""Built-in queries over a binary ``edge`` relation, by name.

`BUILTINS` maps a name (what a user types, e.g. ``--query 3-cycles``) to query text; `builtin`
parses one; `resolve_query` takes a name or query text (what ``--query`` takes). The names may hold hyphens and start with digits; the query names inside the texts
are identifiers. Symmetry-breaking filters make each pattern appear once where noted.

>>> list(BUILTINS)[:2]
['triangles', 'directed-triangles']
>>> str(builtin("2-paths"))
'paths2(a, b, c) :- edge(a, b), edge(b, c)'
"""

from __future__ import annotations

import re

from wcoj_core.errors import QueryError
from wcoj_core.query.ir import Query
from wcoj_core.query.parse import parse_query

BUILTINS: dict[str, str] = {
    # Undirected triangles: each appears once when `edge` is symmetric.
    "triangles": "triangles(a, b, c) :- edge(a, b), edge(b, c), edge(a, c), a < b, b < c",
    # a -> b -> c together with the shortcut a -> c.
    "directed-triangles": "directed_triangles(a, b, c) :- edge(a, b), edge(b, c), edge(a, c)",
    # Directed 3-cycles, each once, rotated so that its smallest vertex comes first.
    "3-cycles": "cycles3(a, b, c) :- edge(a, b), edge(b, c), edge(c, a), a < b, a < c",
    # Undirected 4-cycles, each once over a symmetric `edge`: smallest vertex first, and the
    # smaller of its two neighbours second.
    "4-cycles": (
        "cycles4(a, b, c, d) :- edge(a, b), edge(b, c), edge(c, d), edge(d, a), "
        "a < b, a < c, a < d, b < d"
    ),
    # 4-cliques, each once with its vertices in increasing order.
    "4-cliques": (
        "cliques4(a, b, c, d) :- edge(a, b), edge(a, c), edge(a, d), edge(b, c), edge(b, d), "
        "edge(c, d), a < b, b < c, c < d"
    ),
    # Paths of two edges.
    "2-paths": "paths2(a, b, c) :- edge(a, b), edge(b, c)",
    # Aggregates (counted, never enumerated), over a symmetric `edge`: the triangles,
    "triangle-count": (
        "triangle_count(count()) :- edge(a, b), edge(b, c), edge(a, c), a < b, b < c"
    ),
    # the triangles holding each vertex (each pair of its neighbours b < c that are adjacent),
    "triangles-per-vertex": (
        "triangles_per_vertex(a, count()) :- edge(a, b), edge(b, c), edge(a, c), b < c"
    ),
    # the triangles holding each edge a < b (its support, as truss decomposition peels it),
    "edge-support": "edge_support(a, b, count()) :- edge(a, b), edge(b, c), edge(a, c), a < b",
    # and each vertex's degree: with triangles-per-vertex, its local clustering coefficient
    # (`wcoj_core.aggregates.clustering`).
    "degrees": "degrees(a, count()) :- edge(a, b)",
}

# What a name given to `resolve_query` looks like: no parentheses, no ':-', no spaces.
_NAME_LIKE = re.compile(r"[A-Za-z0-9_-]+")


def builtin(name: str) -> Query:
    """Parse the built-in query called `name`.

    >>> builtin("triangles").relations
    {'edge': 2}
    >>> builtin("5-cycles")
    Traceback (most recent call last):
      ...
    wcoj_core.errors.QueryError: unknown built-in query '5-cycles'; the built-in queries are triangles, directed-triangles, 3-cycles, 4-cycles, 4-cliques, 2-paths, triangle-count, triangles-per-vertex, edge-support, degrees
    """
    text = BUILTINS.get(name)
    if text is None:
        raise QueryError(
            f"unknown built-in query {name!r}; the built-in queries are {', '.join(BUILTINS)}"
        )
    return parse_query(text)


def resolve_query(spec: str) -> Query:
    """A built-in query when `spec` names one, else `spec` parsed as query text.

    >>> resolve_query("2-paths").name
    'paths2'
    >>> resolve_query("p(b) :- e(a, b)").head
    (Var(name='b'),)
    >>> resolve_query("triangle")
    Traceback (most recent call last):
      ...
    wcoj_core.errors.QueryError: unknown built-in query 'triangle'; the built-in queries are triangles, directed-triangles, 3-cycles, 4-cycles, 4-cliques, 2-paths, triangle-count, triangles-per-vertex, edge-support, degrees; or pass query text such as 'p(a, b) :- edge(a, b)'
    """
    name = spec.strip()
    if name in BUILTINS:
        return builtin(name)
    if _NAME_LIKE.fullmatch(name):
        raise QueryError(
            f"unknown built-in query {name!r}; the built-in queries are "
            f"{', '.join(BUILTINS)}; or pass query text such as 'p(a, b) :- edge(a, b)'"
        )
    return parse_query(spec)
