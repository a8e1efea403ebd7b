"""Deterministic skewed graphs (R-MAT), generated in Spark.

Contract: `rmat_edges` returns a binary relation ``c0, c1, diff`` (all non-null longs, diff 1) of
exactly `edges` directed edges over the vertices ``0 .. 2**scale - 1``. Like a raw edge list it is
a multiset: duplicate edges and self-loops are kept (`wcoj_core.input_spark.canonical_undirected`
normalizes). Every row is a pure function of ``(seed, scale, a, b, c, row id)``, so the same
parameters give the same rows under any master, partition count or shuffle setting.

How an edge is drawn: at each of `scale` levels a 53-bit uniform number taken from
``xxhash64(seed, level, id)`` picks one quadrant of the adjacency matrix with probabilities
``a, b, c, d = 1 - a - b - c``, which fixes one more bit of the source and of the target. The
ids are then passed through `scramble`, a seeded bijection of ``0 .. 2**scale - 1``, so that the
hubs are spread over the id range instead of sitting at 0.

A generator is also reachable as a pseudo-path, ``rmat:scale=12,edges=20000,seed=1``, wherever a
relation file is expected; `parse_generator_spec` reads that syntax.
"""

from __future__ import annotations

import re
from typing import TypedDict

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from wcoj_core.errors import InputError

RMAT = "rmat"
DEFAULT_SCALE = 12
DEFAULT_SEED = 1
DEFAULT_A, DEFAULT_B, DEFAULT_C = 0.57, 0.19, 0.19
MAX_SCALE = 62
_U53 = 1 << 53
_M64 = (1 << 64) - 1
_INT_KEYS = ("scale", "edges", "seed")
_FLOAT_KEYS = ("a", "b", "c")
_INT_VALUE = re.compile(r"[0-9]+(_[0-9]+)*", re.ASCII)
_FLOAT_VALUE = re.compile(r"[0-9]*\.?[0-9]+([eE][+-]?[0-9]+)?", re.ASCII)


class RmatParams(TypedDict):
    """The parameters of an R-MAT graph, as `parse_generator_spec` returns them."""

    kind: str
    scale: int
    edges: int
    seed: int
    a: float
    b: float
    c: float


def is_generator_spec(path: str) -> bool:
    """True when `path` names a generator (``rmat:...``) rather than a file.

    >>> is_generator_spec("rmat:scale=10"), is_generator_spec("data/rmat.txt")
    (True, False)
    """
    return path.split(":", 1)[0].strip().lower() == RMAT and ":" in path


def parse_generator_spec(spec: str) -> RmatParams:
    """Parse ``rmat:key=value,...`` into the generator's parameters, filling in defaults.

    Keys: ``scale`` (default 12), ``edges`` (default ``16 * 2**scale``), ``seed`` (default 1) and
    the quadrant probabilities ``a``, ``b``, ``c`` (defaults 0.57, 0.19, 0.19).

    >>> parse_generator_spec("rmat:scale=4,seed=7")
    {'kind': 'rmat', 'scale': 4, 'edges': 256, 'seed': 7, 'a': 0.57, 'b': 0.19, 'c': 0.19}
    >>> parse_generator_spec("rmat:scale=4,edgs=10")
    Traceback (most recent call last):
      ...
    wcoj_core.errors.InputError: rmat:scale=4,edgs=10, column 14: unknown key 'edgs' (known: scale, edges, seed, a, b, c)
    """
    kind, _, body = spec.partition(":")
    if kind.strip().lower() != RMAT:
        raise InputError(f"unknown generator {kind.strip()!r} (known: {RMAT})", spec, column=1)
    ints: dict[str, int] = {}
    floats: dict[str, float] = {}
    position = len(kind) + 2
    for item in body.split(",") if body.strip() else []:
        key, sep, text = (part.strip() for part in item.partition("="))
        column = position + len(item) - len(item.lstrip())
        position += len(item) + 1
        if not sep or not key:
            raise InputError(f"expected key=value, got {item.strip()!r}", spec, column=column)
        if key not in _INT_KEYS + _FLOAT_KEYS:
            raise InputError(
                f"unknown key {key!r} (known: {', '.join(_INT_KEYS + _FLOAT_KEYS)})",
                spec,
                column=column,
            )
        if key in ints or key in floats:
            raise InputError(f"key {key!r} given twice", spec, column=column)
        if key in _INT_KEYS:
            if not _INT_VALUE.fullmatch(text):
                raise InputError(
                    f"{key} must be a non-negative integer, got {text!r}", spec, column=column
                )
            ints[key] = int(text)
        else:
            if not _FLOAT_VALUE.fullmatch(text):
                raise InputError(f"{key} must be a probability, got {text!r}", spec, column=column)
            floats[key] = float(text)
    scale = ints.get("scale", DEFAULT_SCALE)
    params = RmatParams(
        kind=RMAT,
        scale=scale,
        edges=ints.get("edges", 16 << min(scale, MAX_SCALE)),
        seed=ints.get("seed", DEFAULT_SEED),
        a=floats.get("a", DEFAULT_A),
        b=floats.get("b", DEFAULT_B),
        c=floats.get("c", DEFAULT_C),
    )
    _check_rmat(spec, scale, params["edges"], params["seed"], params["a"], params["b"], params["c"])
    return params


def generate(spark: SparkSession, spec: str, num_partitions: int | None = None) -> DataFrame:
    """The relation a generator spec describes."""
    p = parse_generator_spec(spec)
    return rmat_edges(
        spark, p["scale"], p["edges"], p["seed"], p["a"], p["b"], p["c"], num_partitions
    )


def rmat_edges(
    spark: SparkSession,
    scale: int,
    edges: int,
    seed: int = DEFAULT_SEED,
    a: float = DEFAULT_A,
    b: float = DEFAULT_B,
    c: float = DEFAULT_C,
    num_partitions: int | None = None,
) -> DataFrame:
    """`edges` R-MAT edges over ``2**scale`` vertices as ``c0, c1, diff``.

    `num_partitions` only sets how `spark.range` splits the ids; it never changes the rows.
    """
    source = f"{RMAT}:scale={scale},edges={edges},seed={seed},a={a},b={b},c={c}"
    _check_rmat(source, scale, edges, seed, a, b, c)
    # Quadrant thresholds on a 53-bit uniform integer: q = 0 (a), 1 (b), 2 (c), 3 (d).
    t_a, t_ab, t_abc = (int(p * _U53) for p in (a, a + b, a + b + c))
    seed_lit = F.lit(seed).cast("long")

    def quadrant(level: Column) -> Column:
        draw = F.shiftrightunsigned(F.xxhash64(seed_lit, level.cast("long"), F.col("id")), 11)
        return (F.when(draw < t_a, 0).when(draw < t_ab, 1).when(draw < t_abc, 2).otherwise(3)).cast(
            "long"
        )

    levels = F.transform(F.sequence(F.lit(0), F.lit(scale - 1)), quadrant)
    zero = F.lit(0).cast("long")
    src = F.aggregate(levels, zero, lambda acc, q: acc * 2 + F.shiftright(q, 1))
    dst = F.aggregate(levels, zero, lambda acc, q: acc * 2 + q.bitwiseAND(1))
    ids = spark.range(0, edges, 1, num_partitions)
    quadrants = ids.select(src.alias("src"), dst.alias("dst"))
    return quadrants.select(
        _non_null(_scramble_column(F.col("src"), scale, seed)).alias("c0"),
        _non_null(_scramble_column(F.col("dst"), scale, seed)).alias("c1"),
        F.lit(1).cast("long").alias("diff"),
    )


def scramble(vertex: int, scale: int, seed: int) -> int:
    """A seeded bijection of ``0 .. 2**scale - 1`` (xorshift, odd multiply, xor).

    >>> sorted(scramble(v, 4, 3) for v in range(16)) == list(range(16))
    True
    >>> [scramble(v, 4, 3) for v in range(4)] != [scramble(v, 4, 4) for v in range(4)]
    True
    """
    mask = (1 << scale) - 1
    multiplier, key = _scramble_keys(scale, seed)
    vertex ^= vertex >> ((scale + 1) // 2)
    return ((vertex * multiplier) & mask) ^ key


def _scramble_column(vertex: Column, scale: int, seed: int) -> Column:
    """`scramble` on a long column, never overflowing 64 bits (ANSI mode would raise).

    The product mod ``2**scale`` is assembled from half-width limbs: with ``v = vh*2**h + vl`` and
    ``m = mh*2**h + ml`` (``2h >= scale``), ``v*m = vl*ml + (vl*mh + vh*ml)*2**h  (mod 2**scale)``.
    """
    half = (scale + 1) // 2
    low = (1 << half) - 1
    mask = (1 << scale) - 1
    multiplier, key = _scramble_keys(scale, seed)
    m_low, m_high = F.lit(multiplier & low), F.lit(multiplier >> half)
    v = vertex.bitwiseXOR(F.shiftright(vertex, half))
    v_low, v_high = v.bitwiseAND(low), F.shiftright(v, half)
    cross = (v_low * m_high + v_high * m_low).bitwiseAND((1 << (scale - half)) - 1)
    product = (v_low * m_low + F.shiftleft(cross, half)).bitwiseAND(mask)
    return product.bitwiseXOR(F.lit(key))


def _scramble_keys(scale: int, seed: int) -> tuple[int, int]:
    """An odd multiplier and an xor key below ``2**scale``, both derived from the seed."""
    mask = (1 << scale) - 1
    return (_splitmix64(2 * seed) & mask) | 1, _splitmix64(2 * seed + 1) & mask


def _splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _non_null(value: Column) -> Column:
    # The value is never null; the coalesce records that in the schema, as the readers do.
    return F.coalesce(value.cast("long"), F.lit(0).cast("long"))


def _check_rmat(
    source: str, scale: int, edges: int, seed: int, a: float, b: float, c: float
) -> None:
    if not 1 <= scale <= MAX_SCALE:
        raise InputError(f"scale must be between 1 and {MAX_SCALE}, got {scale}", source)
    if not 1 <= edges < 2**63:
        raise InputError(f"edges must be a positive 64-bit integer, got {edges}", source)
    if not 0 <= seed < 2**63:
        raise InputError(f"seed must be a non-negative 64-bit integer, got {seed}", source)
    if min(a, b, c) < 0 or a + b + c > 1 + 1e-12:
        raise InputError(
            f"quadrant probabilities must be >= 0 with a + b + c <= 1, got a={a}, b={b}, c={c}",
            source,
        )
