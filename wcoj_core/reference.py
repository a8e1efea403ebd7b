"""An independent reference: a query compiled to plain Spark SQL binary joins, and an exact diff.

The correctness check recomputes a query from the relations as of an epoch with no WCOJ machinery
at all — one self-join per atom, equality conditions for shared variables, constants and repeated
variables, the filters, and a ``GROUP BY`` of the head summing the product of the atoms'
multiplicities (bag semantics, as the tests' oracle evaluates it; an aggregate's groups, a
sum(x) times x) — and compares the result
with the maintained output as multisets: a full outer join on the head, a mismatch wherever the
two multiplicities differ.

>>> from wcoj_core.query.parse import parse_query
>>> print(reference_sql(parse_query("p(a, c) :- e(a, b), e(b, c), e(c, 7), a < c")))
SELECT a0.c0 AS c0, a1.c1 AS c1, SUM(a0.diff * a1.diff * a2.diff) AS diff
FROM {r_e} AS a0
JOIN {r_e} AS a1 ON a1.c0 = a0.c1
JOIN {r_e} AS a2 ON a2.c0 = a1.c1 AND a2.c1 = CAST('7' AS BIGINT)
WHERE a0.c0 < a1.c1
GROUP BY a0.c0, a1.c1
HAVING SUM(a0.diff * a1.diff * a2.diff) <> 0
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wcoj_core.query.ir import CmpOp, Const, Query, Term, Var
from wcoj_core.traces import DIFF, relation_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_SQL_OP = {CmpOp.EQ: "=", CmpOp.NE: "<>"}


def _literal(value: int) -> str:
    return f"CAST('{value}' AS BIGINT)"


def reference_sql(
    query: Query,
    table: Callable[[int, str], str] | None = None,
    start: int | None = None,
) -> str:
    """Spark SQL for `query`; relation ``r`` is the placeholder ``{r_<r>}`` (c0.., diff).

    `table(i, r)` names the placeholder of atom ``i`` (over relation ``r``) instead: delta rules
    read one atom from the changes and the others from old or new states. The joins follow the
    atoms in query order, or with `start` begin at that atom and go on with connected atoms
    (`join_order`) — how a delta rule is written by hand, starting from the changes.
    """
    name = table or (lambda _i, rel: f"r_{rel}")
    first: dict[Var, str] = {}
    joins: list[str] = []
    where: list[str] = []
    order = join_order(query, start) if start is not None else range(len(query.atoms))
    for i in order:
        atom = query.atoms[i]
        alias = f"a{i}"
        conditions: list[str] = []
        for col, term in enumerate(atom.terms):
            here = f"{alias}.c{col}"
            if isinstance(term, Const):
                conditions.append(f"{here} = {_literal(term.value)}")
            elif term in first:
                conditions.append(f"{here} = {first[term]}")
            else:
                first[term] = here
        source = f"{{{name(i, atom.relation)}}} AS {alias}"
        if not joins:
            joins.append(f"FROM {source}")
            where.extend(conditions)
        elif conditions:
            joins.append(f"JOIN {source} ON {' AND '.join(conditions)}")
        else:
            joins.append(f"CROSS JOIN {source}")

    def term_sql(t: Term) -> str:
        return first[t] if isinstance(t, Var) else _literal(t.value)

    for f in query.filters:
        where.append(f"{term_sql(f.left)} {_SQL_OP.get(f.op, f.op.value)} {term_sql(f.right)}")
    factors = [f"a{i}.{DIFF}" for i in range(len(query.atoms))]
    if query.aggregate is not None and query.aggregate.var is not None:
        factors.append(first[query.aggregate.var])  # sum(x): each binding's weight times x
    weight = " * ".join(factors)
    head = [first[v] for v in query.head]
    select = [f"{h} AS c{i}" for i, h in enumerate(head)] + [f"SUM({weight}) AS {DIFF}"]
    lines = [f"SELECT {', '.join(select)}", *joins]
    if where:
        lines.append(f"WHERE {' AND '.join(where)}")
    if head:
        lines.append(f"GROUP BY {', '.join(head)}")
    lines.append(f"HAVING SUM({weight}) <> 0")
    return "\n".join(lines)


def join_order(query: Query, start: int) -> list[int]:
    """Atom `start`, then repeatedly the first atom sharing a variable with those before it.

    >>> from wcoj_core.query.parse import parse_query
    >>> join_order(parse_query("q(a, d) :- r(a, b), s(c, d), t(b, c)"), 1)
    [1, 2, 0]
    """
    order = [start]
    bound = {t for t in query.atoms[start].terms if isinstance(t, Var)}
    while len(order) < len(query.atoms):
        rest = [i for i in range(len(query.atoms)) if i not in order]
        linked = [i for i in rest if bound & set(query.atoms[i].terms)]
        nxt = (linked or rest)[0]
        order.append(nxt)
        bound |= {t for t in query.atoms[nxt].terms if isinstance(t, Var)}
    return order


def reference_output(
    spark: SparkSession, query: Query, relations: Mapping[str, DataFrame]
) -> DataFrame:
    """The query over accumulated relations (c0.., diff each) by binary joins: (c0.., diff)."""
    frames = {f"r_{rel}": relations[rel] for rel in query.relations}
    return spark.sql(reference_sql(query), None, **frames)


@dataclass(frozen=True, slots=True)
class Comparison:
    """How a maintained output differs from the reference, as multisets."""

    mismatches: int
    expected_rows: int
    actual_rows: int
    expected_total: int
    actual_total: int
    examples: tuple[tuple[tuple[int, ...], int, int], ...]  # (tuple, expected, actual)

    @property
    def equal(self) -> bool:
        return self.mismatches == 0


def compare(
    expected: DataFrame, actual: DataFrame, columns: Sequence[str], examples: int = 5
) -> Comparison:
    """Full outer join on the data columns; one aggregate, plus a few examples on a mismatch."""
    from pyspark.sql import functions as F

    key = "_wcoj_key"  # a constant key also joins the zero-column (boolean) queries
    e = expected.select(*columns, F.col(DIFF).alias("_e")).withColumn(key, F.lit(1))
    a = actual.select(*columns, F.col(DIFF).alias("_a")).withColumn(key, F.lit(1))
    joined = e.join(a, [*columns, key], "full_outer")
    differs = F.coalesce(F.col("_e"), F.lit(0)) != F.coalesce(F.col("_a"), F.lit(0))
    row = joined.agg(
        F.count(F.when(differs, 1)).alias("mismatches"),
        F.count("_e").alias("expected_rows"),
        F.count("_a").alias("actual_rows"),
        F.coalesce(F.sum("_e"), F.lit(0)).alias("expected_total"),
        F.coalesce(F.sum("_a"), F.lit(0)).alias("actual_total"),
    ).first()
    assert row is not None
    found: tuple[tuple[tuple[int, ...], int, int], ...] = ()
    if row["mismatches"]:
        rows = joined.where(differs).orderBy(*columns).limit(examples).collect()
        found = tuple((tuple(r[c] for c in columns), r["_e"] or 0, r["_a"] or 0) for r in rows)
    return Comparison(
        int(row["mismatches"]),
        int(row["expected_rows"]),
        int(row["actual_rows"]),
        int(row["expected_total"]),
        int(row["actual_total"]),
        found,
    )


def output_columns(query: Query) -> list[str]:
    return relation_columns(len(query.head))
