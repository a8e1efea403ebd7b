"""Scale curves: seconds per epoch against graph size and against epoch size, checked point by point.

Two curves, each a series of `wcoj_bench.parts.epochs` runs (one per point, each in its own state folder,
removed once the point is measured), each point checked and timed exactly as ``wcoj-bench epochs`` does:
every epoch's output changes must be identical across the methods before a figure is kept, and
a point's figure is the median seconds per epoch after the warm-up epoch.

* **size** — the graph grows, the epochs stay the same size (default 1,000 changes). The graphs
  are generated R-MAT graphs (`wcoj_core.generate`): the input names a generator without a size
  (``rmat:seed=1``) and each point sets ``edges`` to one of `DEFAULT_SIZES` and ``scale`` to
  keep about `EDGES_PER_VERTEX` edges per vertex. The target is that an epoch's cost grows by
  less than 3x per 10x of graph size, so the result reports each method's growth per decade
  (`growth_per_decade`).
* **epoch-size** — the graph stays (by default web-NotreDame), the epochs grow: 10 to 100,000
  changes (`DEFAULT_EPOCH_SIZES`).

Loading. Every point loads its graph as epoch 0 (untimed) and times the epochs after it. wcoj's
load computes its whole initial output too (the engine has no way to load a state without
deriving it; the curves used to skip it), on the driver, in epochs of at most
`wcoj_bench.parts.epochs.LOAD_ROWS` edges; binary-delta's load writes its tables only; recompute's load
computes a whole output, one more reason why the curves leave it out unless asked
(`CURVE_METHODS`).

Before a point runs, its relations are read once, normalized (undirected relations to their
edges, others consolidated) and written as Parquet, so that no method regenerates or re-reads
the source. A point's x is the number of rows of that normalized input (for the size curve: the
distinct undirected edges, a little below the generated ``edges`` because R-MAT repeats some) or
the epoch size. The module prints nothing: progress goes through the `say` callback.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from wcoj_bench.infra.machine import machine_facts, machine_label
from wcoj_bench.infra.measure import BenchError, Sample
from wcoj_bench.parts.epochs import bench, check_methods, make_workload
from wcoj_core import generate
from wcoj_core.input_spark import canonical_undirected, read_relation
from wcoj_core.query.ir import Query
from wcoj_core.traces import relation_columns
from wcoj_core.updates import consolidate


class Curve(Enum):
    """Which quantity a curve varies."""

    SIZE = "size"
    EPOCH_SIZE = "epoch-size"


CURVES = tuple(c.value for c in Curve)
CURVE_METHODS = ("binary-delta", "wcoj")
DEFAULT_SIZES = (200_000, 2_000_000, 20_000_000)
DEFAULT_EPOCH_SIZES = (10, 100, 1_000, 10_000, 100_000)
DEFAULT_EPOCH_SIZE = 1_000
DEFAULT_EPOCHS = 4
EDGES_PER_VERTEX = 16  # R-MAT's usual density, and `wcoj_core.generate`'s default
TARGET_GROWTH = 3.0  # the size curve's target: less than 3x per 10x of graph size
_SIZED_KEYS = ("scale", "edges")


# -- arguments ----------------------------------------------------------------------------------


def parse_curve(text: str) -> Curve:
    """The curve named `text`.

    >>> parse_curve("epoch-size")
    <Curve.EPOCH_SIZE: 'epoch-size'>
    >>> parse_curve("sizes")
    Traceback (most recent call last):
      ...
    wcoj_bench.infra.measure.BenchError: unknown curve 'sizes'; choose size or epoch-size
    """
    try:
        return Curve(text)
    except ValueError:
        raise BenchError(f"unknown curve {text!r}; choose {' or '.join(CURVES)}") from None


def parse_points(text: str, option: str) -> tuple[int, ...]:
    """A comma-separated list of at least two distinct positive integers, in increasing order.

    Underscores may group digits; duplicates are dropped.

    >>> parse_points("1_000,10,100,10", "--epoch-sizes")
    (10, 100, 1000)
    >>> parse_points("10,1e3", "--sizes")
    Traceback (most recent call last):
      ...
    wcoj_bench.infra.measure.BenchError: --sizes: '1e3' is not a positive integer; give a list such as 10,100,1000
    >>> parse_points("100", "--sizes")
    Traceback (most recent call last):
      ...
    wcoj_bench.infra.measure.BenchError: --sizes needs at least two different values to draw a curve, got 100
    """
    points: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        digits = item.replace("_", "")
        if not digits.isdigit() or item.startswith("_") or int(digits) < 1:
            raise BenchError(
                f"{option}: {item!r} is not a positive integer; give a list such as 10,100,1000"
            )
        points.add(int(digits))
    if len(points) < 2:
        raise BenchError(
            f"{option} needs at least two different values to draw a curve, got {text.strip()}"
        )
    return tuple(sorted(points))


def rmat_scale(edges: int) -> int:
    """The R-MAT scale (log2 of the vertices) nearest to `EDGES_PER_VERTEX` edges per vertex.

    >>> [rmat_scale(e) for e in (200_000, 2_000_000, 20_000_000, 10)]
    [14, 17, 20, 1]
    """
    return max(1, round(math.log2(max(1.0, edges / EDGES_PER_VERTEX))))


def sized_spec(template: str, edges: int) -> str:
    """The generator spec `template` with ``edges`` and ``scale`` set for one point of the curve.

    >>> sized_spec("rmat:seed=7,a=0.6", 200_000)
    'rmat:scale=14,edges=200000,seed=7,a=0.6'
    >>> sized_spec("rmat:scale=10", 1000)
    Traceback (most recent call last):
      ...
    wcoj_bench.infra.measure.BenchError: curve size sets each graph's scale and edges from --sizes; drop scale from rmat:scale=10
    """
    if not generate.is_generator_spec(template):
        raise BenchError(
            f"curve size generates its graphs: give a generator such as edge=rmat:seed=1 "
            f"(scale and edges come from --sizes), not the file {template}"
        )
    generate.parse_generator_spec(template)
    _, _, body = template.partition(":")
    items = [i.strip() for i in body.split(",") if i.strip()]
    fixed = [k for k in (i.partition("=")[0].strip() for i in items) if k in _SIZED_KEYS]
    if fixed:
        raise BenchError(
            f"curve size sets each graph's scale and edges from --sizes; drop "
            f"{' and '.join(fixed)} from {template}"
        )
    spec = ",".join([f"scale={rmat_scale(edges)}", f"edges={edges}", *items])
    return f"{generate.RMAT}:{spec}"


def check_curve_methods(methods: Sequence[str]) -> tuple[str, ...]:
    """The methods to run, in order, wcoj among them."""
    return check_methods(methods, "a curve")


def check_points(curve: Curve, points: Sequence[int], *, epochs: int, epoch_size: int) -> None:
    """Refuse points no workload can be built for, before anything runs.

    >>> check_points(Curve.SIZE, [1000, 10_000], epochs=4, epoch_size=1000)
    Traceback (most recent call last):
      ...
    wcoj_bench.infra.measure.BenchError: --sizes 1000: 4 epochs of 1000 changes need a graph of at least 4000 edges
    """
    if epochs < 2:
        raise BenchError(
            f"a curve needs at least 2 epochs per point (one is a warm-up), got {epochs}"
        )
    if curve is Curve.SIZE:
        if epoch_size < 2:
            raise BenchError(f"--epoch-size must be at least 2, got {epoch_size}")
        for size in points:
            if size < epochs * epoch_size:
                raise BenchError(
                    f"--sizes {size}: {epochs} epochs of {epoch_size} changes need a graph of "
                    f"at least {epochs * epoch_size} edges"
                )
    elif min(points) < 2:
        raise BenchError(f"--epoch-sizes: an epoch needs at least 2 changes, got {min(points)}")


# -- results ------------------------------------------------------------------------------------


def growth_per_decade(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    """How many times `ys` grows per 10x of `xs`: from a least-squares fit of log y on log x,
    and from the two end points alone (their ratio, scaled to one decade).

    >>> growth_per_decade([1e5, 1e6, 1e7], [1.0, 2.0, 4.0])
    {'fit': 2.0, 'end_points': 2.0}
    >>> growth_per_decade([10, 1000], [3.0, 3.0])
    {'fit': 1.0, 'end_points': 1.0}
    """
    if len(set(xs)) < 2:
        raise BenchError(f"a growth needs at least two different x values, got {list(xs)}")
    lx = [math.log10(x) for x in xs]
    ly = [math.log10(max(y, 1e-9)) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    slope = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )
    ends = (ly[-1] - ly[0]) / (lx[-1] - lx[0])
    return {"fit": round(10**slope, 3), "end_points": round(10**ends, 3)}


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """One measured point: its x, what was run there, and the whole `bench` report of it."""

    x: int
    label: str
    input_rows: int
    report: dict[str, Any]

    def median(self, method: str) -> float:
        return float(self.report["methods"][method]["median_seconds"])

    def to_dict(self) -> dict[str, Any]:
        methods: dict[str, Any] = self.report["methods"]
        return {
            "x": self.x,
            "label": self.label,
            "input_rows": self.input_rows,
            "median_seconds": {m: r["median_seconds"] for m, r in methods.items()},
            "seconds_per_epoch": {m: r["seconds_per_epoch"] for m, r in methods.items()},
            "intermediate_rows": {m: r["intermediate_rows"] for m, r in methods.items()},
            "intermediate_rows_per_epoch": {
                m: r["intermediate_rows_per_epoch"] for m, r in methods.items()
            },
            "bench": self.report,
        }


@dataclass(frozen=True, slots=True)
class CurveResult:
    """Every point of one curve, with what was held fixed and where it ran."""

    curve: Curve
    query: str
    inputs: dict[str, str]
    epochs: int
    epoch_size: int | None  # fixed along the size curve; None along the epoch-size curve
    methods: tuple[str, ...]
    points: tuple[CurvePoint, ...]
    machine: dict[str, Any]

    def growth(self) -> dict[str, dict[str, float]]:
        """Each method's growth per 10x of the curve's x."""
        xs = [p.x for p in self.points]
        return {m: growth_per_decade(xs, [p.median(m) for p in self.points]) for m in self.methods}

    @property
    def x_label(self) -> str:
        if self.curve is Curve.SIZE:
            return "graph size (distinct edges of the input)"
        return "epoch size (changed edges per epoch)"

    @property
    def title(self) -> str:
        graphs = ", ".join(
            p if generate.is_generator_spec(p) else Path(p).name for p in self.inputs.values()
        )
        if self.curve is Curve.SIZE:
            what = f"vs graph size: {graphs}, {self.epoch_size:,}-change epochs"
        else:
            what = f"vs epoch size: {graphs}"
        return f"{self.query}: seconds per epoch {what}\n{machine_label(self.machine)}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "command": "bench",
            "mode": "curve",
            "curve": self.curve.value,
            "query": self.query,
            "inputs": self.inputs,
            "epochs": self.epochs,
            "epoch_size": self.epoch_size,
            "methods": list(self.methods),
            "check": "passed",
            "machine": self.machine,
            "points": [p.to_dict() for p in self.points],
            "growth_per_decade": self.growth(),
        }
        if self.curve is Curve.SIZE:
            out["target_growth_per_decade"] = TARGET_GROWTH
        return out


# -- running ------------------------------------------------------------------------------------


def run_curve(
    spark: SparkSession,
    query: Query,
    curve: Curve,
    inputs: Mapping[str, str],
    state_dir: str,
    *,
    points: Sequence[int],
    epochs: int = DEFAULT_EPOCHS,
    epoch_size: int = DEFAULT_EPOCH_SIZE,
    undirected: frozenset[str] = frozenset(),
    methods: Sequence[str] = CURVE_METHODS,
    seed: int = 1,
    say: Callable[[str], None] = lambda _line: None,
    deployment: str = "auto",
) -> CurveResult:
    """Measure every point of `curve` (see the module's docstring); `inputs` maps each relation
    to a file or generator spec (for the size curve, a generator without scale and edges)."""
    chosen = check_curve_methods(methods)
    check_points(curve, points, epochs=epochs, epoch_size=epoch_size)
    root = Path(state_dir)
    measured: list[CurvePoint] = []
    fixed: dict[str, DataFrame] | None = None
    fixed_rows = 0
    if curve is Curve.EPOCH_SIZE:
        fixed, fixed_rows = _materialize(spark, query, inputs, undirected, root / "input")
    for k, x in enumerate(points, start=1):
        where = root / f"point-{k}"
        if curve is Curve.SIZE:
            specs = {rel: sized_spec(path, x) for rel, path in inputs.items()}
            label = ", ".join(specs.values())
            relations, rows = _materialize(spark, query, specs, undirected, where / "input")
            size = epoch_size
        else:
            assert fixed is not None
            label, relations, rows, size = f"{x:,}-change epochs", fixed, fixed_rows, x
        say(
            f"curve {curve.value}: point {k}/{len(points)}: {label} ({rows:,} input rows), "
            f"{epochs} epochs of {size:,} changes"
        )

        def progress(
            t: int, total: int, samples: dict[str, Sample], changes: int, k: int = k
        ) -> None:
            figures = ", ".join(
                f"{name} {s.seconds:.2f} s ({s.intermediate_rows:,} join rows)"
                for name, s in samples.items()
            )
            say(
                f"  point {k}/{len(points)}, epoch {t}/{total}: {figures}; "
                f"output change rows {changes:,}, identical"
            )

        workload = make_workload(
            spark,
            query,
            relations,
            epochs=epochs,
            epoch_size=size,
            seed=seed,
            undirected=undirected,
        )
        result = bench(
            spark,
            query,
            workload,
            str(where / "bench"),
            methods=chosen,
            on_epoch=progress,
            deployment=deployment,
        )
        point = CurvePoint(
            x=rows if curve is Curve.SIZE else x,
            label=label,
            input_rows=rows,
            report=result.to_dict(),
        )
        measured.append(point)
        say(
            f"  point {k}/{len(points)}: median "
            + ", ".join(f"{m} {point.median(m):.3f} s/epoch" for m in chosen)
        )
        spark.catalog.clearCache()
        shutil.rmtree(where, ignore_errors=True)
    return CurveResult(
        curve=curve,
        query=query.name,
        inputs=dict(inputs),
        epochs=epochs,
        epoch_size=epoch_size if curve is Curve.SIZE else None,
        methods=chosen,
        points=tuple(measured),
        machine=machine_facts(spark),
    )


def _materialize(
    spark: SparkSession,
    query: Query,
    inputs: Mapping[str, str],
    undirected: frozenset[str],
    folder: Path,
) -> tuple[dict[str, DataFrame], int]:
    """Each relation read, normalized and written as Parquet once; the frames and their rows."""
    frames: dict[str, DataFrame] = {}
    rows = 0
    for rel, path in sorted(inputs.items()):
        arity = query.relations[rel]
        df = read_relation(spark, path, arity, rel)
        df = (
            canonical_undirected(df)
            if rel in undirected
            else consolidate(df, relation_columns(arity))
        )
        df.write.parquet(str(folder / rel))
        frames[rel] = spark.read.parquet(str(folder / rel))
        rows += frames[rel].count()
    return frames, rows


# -- output -------------------------------------------------------------------------------------


def plot_curve(result: CurveResult, path: Path) -> None:
    """A log-log PNG of the curve: one line per method, its growth per decade in the legend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    fig = Figure(figsize=(8, 5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    growth = result.growth()
    xs = [p.x for p in result.points]
    for method in result.methods:
        per_decade = growth[method]["fit"]
        ys = [p.median(method) for p in result.points]
        ax.plot(xs, ys, marker="o", label=f"{method} (x{per_decade:g} per 10x)")
        for x, y in zip(xs, ys, strict=True):
            ax.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    # Plain numbers: the points' own x (187k, 1.9M), and 1, 2 and 5 of every decade of seconds.
    ax.xaxis.set_major_locator(FixedLocator(xs))
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(_tick))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(result.x_label)
    ax.set_ylabel("seconds per epoch (median after the warm-up epoch)")
    ax.set_title(result.title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")


def _tick(value: float, _position: int | None = None) -> str:
    """A tick label with three significant digits at most: 187k, 2M, 1.5, 0.02.

    >>> [_tick(v) for v in (187_345, 2_000_000, 1_500, 1.5, 0.02, 10)]
    ['187k', '2M', '1.5k', '1.5', '0.02', '10']
    """
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def save_curve(result: CurveResult, path: Path) -> None:
    """The curve's JSON (every point, with its whole bench report) written to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_dict(), indent=1) + "\n")


__all__ = [
    "CURVES",
    "CURVE_METHODS",
    "DEFAULT_EPOCHS",
    "DEFAULT_EPOCH_SIZE",
    "DEFAULT_EPOCH_SIZES",
    "DEFAULT_SIZES",
    "Curve",
    "CurvePoint",
    "CurveResult",
    "check_curve_methods",
    "check_points",
    "growth_per_decade",
    "parse_curve",
    "parse_points",
    "plot_curve",
    "run_curve",
    "save_curve",
    "sized_spec",
]
