"""One GenericJoin step on Spark: count, pick the fewest, propose, validate.

The input is a DataFrame of prefixes: one column per bound variable (``v_<name>``) and a weight
``_w`` (the product of the multiplicities met so far). The step binds one more variable:

1. **count** — every extender joins its ``counts[key]`` view on its bound columns; a prefix that
   finds no candidates in some extender dies (inner joins);
2. **pick** — per prefix, the extender with the fewest candidates wins (ties to the lowest
   index, so the choice is deterministic);
3. **propose** — one join of the prefixes with the union of all extenders' proposal views, tagged
   by extender: each prefix meets exactly the candidates of its winner. Weights multiply by the
   proposed tuple's multiplicity when the step completes the atom;
4. **validate** — every other extender looks the extended tuple up: when the step completes its
   atom the weight multiplies by that tuple's multiplicity (a validation is a multiplication, not
   a membership test), otherwise the tuple's key must be in the atom's support.

Filters whose variables are now bound apply right after proposing, before validation. The
pipeline is a straight line (no DataFrame is read twice), so one Spark job runs a whole rule and
`Observation`s count rows at each phase without an extra action.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from wcoj_core.query.ir import CmpOp, Filter, Term, Var
from wcoj_core.query.plan import Extender, Step
from wcoj_core.updates import DIFF

WEIGHT = "_w"


def var_col(v: Var) -> str:
    """The prefix column of a variable."""
    return f"v_{v.name}"


def filter_column(f: Filter) -> Column:
    """A filter as a Spark predicate over prefix columns."""

    def term(t: Term) -> Column:
        return F.col(var_col(t)) if isinstance(t, Var) else F.lit(t.value)

    left, right = term(f.left), term(f.right)
    match f.op:
        case CmpOp.LT:
            return left < right
        case CmpOp.LE:
            return left <= right
        case CmpOp.GT:
            return left > right
        case CmpOp.GE:
            return left >= right
        case CmpOp.EQ:
            return left == right
        case CmpOp.NE:
            return left != right


def apply_filters(df: DataFrame, filters: Sequence[Filter]) -> DataFrame:
    for f in filters:
        df = df.where(filter_column(f))
    return df


def count_rows(df: DataFrame, label: str, sink: list[tuple[str, Observation]]) -> DataFrame:
    """Observe the number of rows flowing through `df` (no extra Spark action)."""
    obs = Observation()
    sink.append((label, obs))
    return df.observe(obs, F.count(F.lit(1)).alias("rows"))


@dataclass(frozen=True, slots=True)
class StepViews:
    """Where a step reads its arrangements: functions from an extender to a DataFrame.

    `counts(x)` gives ``(c<k>.., diff=count)`` over the extender's key columns; `support(x)` gives
    the tuples proposals come from and validations look up: the atom's tuples
    ``(c0.., diff=multiplicity)`` when `x.completes`, else ``counts[key + value]``.
    """

    counts: Callable[[Extender], DataFrame]
    support: Callable[[Extender], DataFrame]
    # For small epochs: computes a DataFrame once and keeps it (the caller releases it), so a
    # step can read its proposals twice and broadcast them; None keeps one straight pipeline.
    materialize: Callable[[DataFrame], DataFrame] | None = None


@dataclass(slots=True)
class StepObservations:
    """Observations of one step, read after the job that runs it has finished."""

    var: str
    prefixes: Observation = field(default_factory=Observation)
    proposed: Observation = field(default_factory=Observation)
    validated: Observation = field(default_factory=Observation)


def _key_cols(x: Extender, atom_vars: Sequence[Var]) -> list[str]:
    return [var_col(atom_vars[k]) for k in x.key]


def _weight_of(x: Extender) -> Column:
    # A completing extender carries multiplicities; a support set only says "exists".
    return F.col(DIFF) if x.completes else F.lit(1).cast("long")


def extend(
    prefixes: DataFrame,
    step: Step,
    atom_vars: Sequence[Sequence[Var]],
    views: StepViews,
    obs: StepObservations,
) -> DataFrame:
    """Bind `step.var` for every prefix: count, pick the fewest, propose, validate."""
    xs = step.extenders
    bound = [c for c in prefixes.columns if c != WEIGHT]
    new = var_col(step.var)
    small = views.materialize is not None

    def side(df: DataFrame) -> DataFrame:
        """The prefix side of a join: broadcast when the epoch is small."""
        return F.broadcast(df) if small else df

    # 1. count: one inner join per extender; a missing key means zero candidates.
    counted = prefixes
    for j, x in enumerate(xs):
        keys = _key_cols(x, atom_vars[x.atom])
        cnt = views.counts(x).select(
            *[F.col(f"c{k}").alias(c) for k, c in zip(x.key, keys, strict=True)],
            F.col(DIFF).alias(f"_n{j}"),
        )
        counted = side(counted).join(cnt, keys, "inner") if keys else counted.crossJoin(cnt)

    # 2. pick: the fewest candidates, ties to the lowest extender index.
    best = (
        F.least(
            *[F.struct(F.col(f"_n{j}").alias("n"), F.lit(j).alias("i")) for j in range(len(xs))]
        )
        if len(xs) > 1
        else F.struct(F.col("_n0").alias("n"), F.lit(0).alias("i"))
    )
    counted = counted.withColumn("_best", best)
    counted = counted.select(
        *bound, WEIGHT, F.col("_best.i").alias("_tag"), F.col("_best.n").alias("_min")
    ).observe(obs.prefixes, F.count(F.lit(1)).alias("rows"), F.sum("_min").alias("min_sum"))

    # 3. propose: one join against every extender's proposals, tagged by extender.
    width = max((len(x.key) for x in xs), default=0)
    kcols = [f"_k{i}" for i in range(width)]

    def padded(values: Sequence[Column]) -> list[Column]:
        return [
            (values[i] if i < len(values) else F.lit(0)).cast("long").alias(kcols[i])
            for i in range(width)
        ]

    proposals = None
    for j, x in enumerate(xs):
        src = views.support(x)
        part = src.select(
            F.lit(j).alias("_tag"),
            *padded([F.col(f"c{k}") for k in x.key]),
            F.col(f"c{x.value}").alias(new),
            _weight_of(x).alias("_m"),
        )
        proposals = part if proposals is None else proposals.unionByName(part)
    assert proposals is not None
    keyed = counted
    for i, c in enumerate(kcols):
        expr: Column = F.lit(0)
        for j, x in enumerate(xs):
            keys = _key_cols(x, atom_vars[x.atom])
            if i < len(keys):
                expr = F.when(F.col("_tag") == j, F.col(keys[i])).otherwise(expr)
        keyed = keyed.withColumn(c, expr.cast("long"))
    extended = (
        side(keyed)
        .join(proposals, ["_tag", *kcols], "inner")
        .select(*bound, new, (F.col(WEIGHT) * F.col("_m")).alias(WEIGHT), "_tag")
    )
    extended = extended.observe(obs.proposed, F.count(F.lit(1)).alias("rows"))
    extended = apply_filters(extended, step.filters)

    # 4. validate: every non-winning extender multiplies in (or checks support).
    if views.materialize is not None:
        out = _validate_small(views.materialize(extended), xs, atom_vars, views, bound, new)
        return out.observe(obs.validated, F.count(F.lit(1)).alias("rows"))
    for j, x in enumerate(xs):
        cols = [var_col(atom_vars[x.atom][k]) for k in (*x.key, x.value)]
        src = views.support(x)
        look = src.select(
            *[F.col(f"c{k}").alias(c) for k, c in zip((*x.key, x.value), cols, strict=True)],
            _weight_of(x).alias(f"_m{j}"),
        )
        extended = (
            extended.join(look, cols, "left")
            .where((F.col("_tag") == j) | F.col(f"_m{j}").isNotNull())
            .withColumn(
                WEIGHT,
                F.when(F.col("_tag") == j, F.col(WEIGHT)).otherwise(
                    F.col(WEIGHT) * F.col(f"_m{j}")
                ),
            )
            .drop(f"_m{j}")
        )
    out = extended.select(*bound, new, WEIGHT)
    return out.observe(obs.validated, F.count(F.lit(1)).alias("rows"))


def _validate_small(
    extended: DataFrame,
    xs: Sequence[Extender],
    atom_vars: Sequence[Sequence[Var]],
    views: StepViews,
    bound: Sequence[str],
    new: str,
) -> DataFrame:
    """Validation of a materialized, small `extended`: per winner, inner joins broadcasting it.

    Each proposal is looked up in every extender but its winner, so the proposals are split by
    winner and each part joins the others' tuples as the broadcast side: the arrangements are
    streamed, never shuffled or broadcast.
    """
    parts: list[DataFrame] = []
    for w in range(len(xs)):
        part = extended.where(F.col("_tag") == w)
        for j, x in enumerate(xs):
            if j == w:
                continue
            cols = [var_col(atom_vars[x.atom][k]) for k in (*x.key, x.value)]
            look = views.support(x).select(
                *[F.col(f"c{k}").alias(c) for k, c in zip((*x.key, x.value), cols, strict=True)],
                _weight_of(x).alias("_m"),
            )
            part = (
                F.broadcast(part)
                .join(look, cols, "inner")
                .withColumn(WEIGHT, F.col(WEIGHT) * F.col("_m"))
                .drop("_m")
            )
        parts.append(part.select(*bound, new, WEIGHT))
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def check(prefixes: DataFrame, cols: Sequence[str], tuples: DataFrame) -> DataFrame:
    """Multiply in an atom whose variables are all bound: join its tuples on every column."""
    look = tuples.withColumnRenamed(DIFF, "_m")
    joined = prefixes.join(look, list(cols), "inner") if cols else prefixes.crossJoin(look)
    return joined.withColumn(WEIGHT, F.col(WEIGHT) * F.col("_m")).drop("_m")
