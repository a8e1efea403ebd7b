"""The benchmark page's generated regions: find and replace them; render each part's JSON.

``docs/benchmarks.md`` is written by hand except for regions marked like this::

    <!-- generated: NAME -->
    (markdown rendered from the JSON of part NAME)
    <!-- /generated -->

`replace_regions` rewrites the body of named regions and keeps every other byte of the page.
The renderers turn one saved part (the record `wcoj_bench.report` writes: the command, date, wall
time, load average, machine and the command's JSON) into markdown. They read nothing but that
record, so the same JSON always renders the same page. Pure Python: no Spark, no files.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from wcoj_core.errors import WcojError

PAGE = "benchmarks.md"
MACHINE = "machine"
DASH = "\u2013"  # an en dash, as in the page's hand-written tables and ranges
_REGION = re.compile(
    r"(<!-- generated: (?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /generated -->)", re.DOTALL
)
_OPEN = re.compile(r"<!-- generated: ([a-z0-9-]+) -->")


class PageError(WcojError):
    """A page whose regions are malformed, or that lacks a region to fill."""


def regions(text: str) -> dict[str, str]:
    """The body of every region of `text`, by name.

    >>> regions("a\\n<!-- generated: x -->\\nbody\\n<!-- /generated -->\\nb\\n")
    {'x': 'body\\n'}
    """
    return {m.group("name"): m.group("body") for m in _REGION.finditer(text)}


def replace_regions(text: str, bodies: dict[str, str], page: str = PAGE) -> str:
    """`text` with the body of each region named in `bodies` replaced; all else kept.

    >>> page = "intro\\n<!-- generated: a -->\\nold\\n<!-- /generated -->\\noutro\\n"
    >>> print(replace_regions(page, {"a": "new"}), end="")
    intro
    <!-- generated: a -->
    <BLANKLINE>
    new
    <BLANKLINE>
    <!-- /generated -->
    outro
    >>> replace_regions(page, {"b": "x"})
    Traceback (most recent call last):
      ...
    wcoj_bench.page.PageError: benchmarks.md has no region 'b'; add a line <!-- generated: b --> and a line <!-- /generated --> where its figures belong
    """
    opened = _OPEN.findall(text)
    found = [m.group("name") for m in _REGION.finditer(text)]
    if len(found) != len(opened) or found != opened:
        raise PageError(f"{page}: every <!-- generated: NAME --> needs its <!-- /generated -->")
    twice = sorted({n for n in found if found.count(n) > 1})
    if twice:
        raise PageError(f"{page}: region {twice[0]!r} appears twice; keep one")
    for name in bodies:
        if name not in found:
            raise PageError(
                f"{page} has no region {name!r}; add a line <!-- generated: {name} --> and a "
                "line <!-- /generated --> where its figures belong"
            )

    def body(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in bodies:
            return m.group(0)
        return f"{m.group(1)}\n{bodies[name].strip()}\n\n{m.group(4)}"

    return _REGION.sub(body, text)


# Longer names for the methods, as the tables show them.
LABELS = {
    "recompute": "recompute (Spark SQL binary plan)",
    "binary-delta": "binary-delta (delta rules, binary joins)",
    "wcoj": "wcoj",
    "wcoj-bag": "wcoj-bag (the relation an undirected bag)",
    "wcoj-executors": "wcoj-executors (the kernel in Spark's executors)",
    "spark-sql": "spark-sql (binary plan, `reference.py`)",
    "neighbour-array": "neighbour-array (`collect_set` + `array_intersect`)",
    "duckdb": "duckdb (SQL)",
    "kuzu": "kuzu (Cypher)",
    "scipy": "scipy (`sum((U @ U) ∘ U)`, from the deduplicated edges)",
    "wcoj-count": "wcoj-count (the `wcoj count` process, exec to exit)",
    "wcoj-count-baseline": "wcoj-count-baseline (the same, another checkout's program)",
}


def _n(value: int | None) -> str:
    return DASH if value is None else f"{value:,}"


def _s(value: float) -> str:
    """Seconds: two decimals, three below a tenth.

    >>> [_s(v) for v in (70.349, 0.19, 0.0031)]
    ['70.35', '0.19', '0.003']
    """
    return f"{value:.2f}" if value >= 0.1 else f"{value:.3f}"


def _bytes(value: int | None) -> str:
    """Bytes in decimal units with three digits: 270 MB, 8.52 MB, 7.4 GB.

    >>> [_bytes(v) for v in (512, 8_520_000, 270_400_000, 7_400_000_000)]
    ['512 B', '8.52 MB', '270 MB', '7.4 GB']
    """
    if value is None:
        return DASH
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value} B"


def _bold(text: str, on: bool) -> str:
    return f"**{text}**" if on else text


def _option(argv: Sequence[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _runs(values: Sequence[float]) -> str:
    return " / ".join(_s(v) for v in values)


def _epochs(first: int, last: int) -> str:
    return f"epoch {last}" if first == last else f"epochs {first}{DASH}{last}"


def _paragraph(text: str) -> str:
    return textwrap.fill(text, width=100, break_on_hyphens=False, break_long_words=False)


def _bullets(items: Sequence[str]) -> list[str]:
    return [
        textwrap.fill(
            item,
            width=100,
            initial_indent="* ",
            subsequent_indent="  ",
            break_on_hyphens=False,
            break_long_words=False,
        )
        for item in items
    ]


def _measured(record: dict[str, Any], then: str) -> list[str]:
    """The part's command, then one paragraph: when it ran, how long, how loaded, where, and
    `then`."""
    load = " → ".join("?" if v is None else f"{v:g}" for v in record["load_average"])
    when = (
        f"Measured {record['machine']['date']} in {record['seconds']:.0f} s (load average {load}, "
        f"start → end)."
    )
    argv = record["argv"]
    where = []
    master = _option(argv, "--master")
    if master and master.startswith("spark://"):
        where.append(
            f"On a standalone cluster on this machine ({master}: two workers of one core each, "
            "started by `wcoj-bench cluster up`)."
        )
    deploy = _option(argv, "--deploy")
    if deploy:
        where.append(f"wcoj's kernel deployed: `{deploy}`.")
    settings = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--conf"]
    if settings:
        where.append("Spark settings: " + ", ".join(f"`{c}`" for c in settings) + ".")
    text = " ".join([when, *where, then])
    return ["```sh", wrap_command(record["command"]), "```", "", _paragraph(text)]


def wrap_command(command: str, width: int = 96) -> str:
    """A shell command folded into lines of at most `width`, an option kept with its value.

    >>> print(wrap_command("wcoj-bench epochs --input edge=g.txt --epochs 4 --json", width=40))
    wcoj-bench epochs --input edge=g.txt \\
        --epochs 4 --json
    """
    groups: list[str] = []
    for word in shlex.split(command):
        last = groups[-1] if groups else ""
        if last.startswith("--") and " " not in last and not word.startswith("--"):
            groups[-1] = f"{last} {shlex.quote(word)}"
        else:
            groups.append(shlex.quote(word))
    lines = [groups[0]]
    for group in groups[1:]:
        if len(lines[-1]) + len(group) + 3 > width:
            lines.append("    " + group)
        else:
            lines[-1] += " " + group
    return " \\\n".join(lines)


def render_epochs(record: dict[str, Any]) -> str:
    """The epoch bench: per-method table, the skew epoch, the ratios, every epoch's seconds."""
    r = record["result"]
    methods: dict[str, Any] = r["methods"]
    timed = _epochs(2, r["epochs"])
    skew = r.get("skew")
    lines = _measured(
        record,
        f"{r['epochs']} epochs of {r['epoch_size']:,} changes"
        + (f", then a skew epoch (epoch {skew['epoch']})" if skew else "")
        + f". Epoch 1 is the warm-up: the medians and sums cover {timed}. Every epoch's output "
        "changes were identical across the methods before any figure was kept.",
    )
    lines += [
        "",
        f"| method | median s/epoch | join rows, {timed} | shuffle bytes | state on disk "
        "| peak RSS |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, m in methods.items():
        w = name == "wcoj"
        lines.append(
            f"| {_bold(LABELS.get(name, name), w)} | {_bold(_s(m['median_seconds']), w)} | "
            f"{_bold(_n(m['intermediate_rows']), w)} | {_bold(_bytes(m['shuffle_bytes']), w)} | "
            f"{_bytes(m['state_bytes'])} | {_bytes(m['peak_rss_bytes'])} |"
        )
    ratios = [k for k in r if k.endswith(("_vs_recompute", "_vs_binary_delta"))]
    bullets = [", ".join(f"`{k}` **{r[k]}**" for k in ratios) + " on the regular epochs."]
    if skew:
        lines += [
            "",
            f"| skew epoch (hub of degree {_option(record['argv'], '--skew')}) | seconds "
            "| join rows |",
            "|---|---:|---:|",
        ]
        for name in methods:
            w = name == "wcoj"
            lines.append(
                f"| {_bold(name, w)} | {_bold(_s(skew[name]['seconds']), w)} | "
                f"{_bold(_n(skew[name]['intermediate_rows']), w)} |"
            )
        if "speedup_vs_binary_delta" in skew:
            bullets.append(
                f"On the skew epoch: `speedup_vs_binary_delta` **{skew['speedup_vs_binary_delta']}**"
                f", `intermediate_ratio_vs_binary_delta` "
                f"**{skew['intermediate_ratio_vs_binary_delta']}** (binary-delta's seconds and "
                "join rows over wcoj's)."
            )
    if "set_over_bag" in r:
        bullets.append(
            f"wcoj (the relation an undirected set) over wcoj-bag (an undirected bag): "
            f"**{r['set_over_bag']}x** the median epoch."
        )
    split = (
        f" (Parquet batches {_bytes(r['wcoj_batch_bytes'])}, index files "
        f"{_bytes(r['wcoj_index_bytes'])})"
        if "wcoj_index_bytes" in r
        else ""
    )
    bullets += [
        f"wcoj's state without the output (relation and counts) takes "
        f"{_bytes(r['wcoj_arrangement_bytes'])}{split} against "
        f"{_bytes(r['input_parquet_bytes'])} of input Parquet: **{r['state_ratio_vs_input']}x**.",
        "Seconds per epoch"
        + (" (the skew epoch last): " if skew else ": ")
        + "; ".join(f"{name} {_runs(m['seconds_per_epoch'])}" for name, m in methods.items())
        + ".",
        "Output change rows per epoch: " + ", ".join(_n(n) for n in r["output_change_rows"]) + ".",
    ]
    if r.get("wcoj_deployments"):
        bullets.append(f"wcoj's kernel ran on: {', '.join(r['wcoj_deployments'])}.")
    if r.get("meanings"):
        shown = "; ".join(f"{m}: {what}" for m, what in r["meanings"].items())
        bullets.append(
            f"Relations as wcoj declares them: {shown}. The Spark SQL methods keep the "
            "symmetric set."
        )
    if r.get("load_epochs", 1) > 1:
        bullets.append(
            f"wcoj loaded the graph in {r['load_epochs']} epochs (untimed; the timed epochs "
            "follow them)."
        )
    return "\n".join([*lines, "", *_bullets(bullets)])


def render_static(record: dict[str, Any]) -> str:
    """The static bench: per-method table, the agreed count, the speedups, every run."""
    r = record["result"]
    packages: dict[str, str | None] = record["machine"]["packages"]
    methods: dict[str, Any] = r["methods"]
    rows = ", ".join(f"{rel} {n:,} rows" for rel, n in r["input_rows"].items())
    edges = (
        "" if r["undirected_edges"] is None else f" ({r['undirected_edges']:,} undirected edges)"
    )
    runs = f"{r['repeat']} run" + ("s" if r["repeat"] > 1 else "")
    lines = _measured(
        record,
        f"Every method counted **{r['count']:,}** in every run, warm-ups included; the counts "
        f"were compared before any figure was kept. Input: {rows}{edges}.",
    )
    lines += [
        "",
        f"| method | median s ({runs}) | count | join rows | ratio to wcoj |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, m in methods.items():
        label = LABELS.get(name, name)
        if packages.get(name):
            label = label.replace(name, f"{name} {packages[name]}", 1)
        w = name == "wcoj"
        lines.append(
            f"| {_bold(label, w)} | {_bold(_s(m['median_seconds']), w)} | {_n(m['count'])} | "
            f"{_n(m['join_rows'])} | {m['ratio_to_wcoj']} |"
        )
    bullets = []
    workers = [
        f"{name} {_bytes(m['peak_worker_rss_bytes'])}"
        for name, m in methods.items()
        if m.get("peak_worker_rss_bytes")
    ]
    if workers:
        bullets.append(
            "Peak resident memory of the largest Spark Python worker on the machine, during "
            "each method's runs: " + ", ".join(workers) + "."
        )
    ran = methods.get("wcoj", {}).get("deployments")
    if ran:
        bullets.append(f"wcoj's kernel ran on: {', '.join(ran)}.")
    speedups = [k for k in r if k.startswith("speedup_vs_")]
    if speedups:
        bullets.append(", ".join(f"`{k}` **{r[k]}**" for k in speedups) + ".")
    own = [
        f"{name} {_s(m['own_median_seconds'])} s ({_runs(m['own_seconds'])})"
        for name, m in methods.items()
        if m.get("own_median_seconds") is not None
    ]
    if own:
        bullets.append(
            "The `wcoj count` processes' own seconds (their `--json` `seconds`: landing and "
            "rules, after reading the input), medians: " + "; ".join(own) + "."
        )
    for key, what in (
        ("count_seconds_over_scipy", "`wcoj count`'s own seconds over scipy's"),
        ("count_speedup_vs_baseline", "the baseline `wcoj count` process over this one"),
    ):
        if key in r:
            bullets.append(f"{what}: `{key}` **{r[key]}**.")
    each = []
    for name, m in methods.items():
        warm = "" if m["warm_up_seconds"] is None else f" (warm-up {_s(m['warm_up_seconds'])})"
        each.append(f"{name} {_runs(m['seconds'])}{warm}")
    bullets.append("Runs, in seconds: " + "; ".join(each) + ".")
    phases = methods.get("wcoj", {}).get("phases")
    if phases:
        shown = ", ".join(f"{k} {_s(v)} s" for k, v in phases.items())
        bullets.append(f"wcoj's phases (median over the runs): {shown}.")
    return "\n".join([*lines, "", *_bullets(bullets)])


def render_curve(record: dict[str, Any]) -> str:
    """A curve: its plot, one row per point, each method's growth per 10x."""
    r = record["result"]
    methods: list[str] = r["methods"]
    size = r["curve"] == "size"
    plot = Path(_option(record["argv"], "--plot") or f"curve-{r['curve']}.png").name
    what = "graph size" if size else "epoch size"
    names = ", ".join(f"`{Path(p).name}`" for p in r["inputs"].values())
    fixed = f"{r['epoch_size']:,}-change epochs on R-MAT graphs ({names})" if size else names
    lines = _measured(
        record,
        f"{len(r['points'])} points, {fixed}, {r['epochs']} epochs each. The first epoch is a "
        "warm-up; a point's figure is the median of the others. "
        + (
            "wcoj was seeded without its initial output; "
            if r.get("seed_outputs") is False
            else "wcoj computed its initial output while loading (untimed); "
        )
        + "every epoch's output changes were identical across the methods.",
    )
    lines += [
        "",
        f"![seconds per epoch against {what}](img/{plot})",
        "",
        ("| edges | graph | " if size else "| epoch size | ")
        + " | ".join(f"{m} s/epoch" for m in methods)
        + " | "
        + " | ".join(f"{m} join rows" for m in methods)
        + " |",
        ("|---:|---|" if size else "|---:|") + "---:|" * (2 * len(methods)),
    ]
    for p in r["points"]:
        lines.append(
            (f"| {p['x']:,} | `{p['label']}` | " if size else f"| {p['x']:,} | ")
            + " | ".join(_s(p["median_seconds"][m]) for m in methods)
            + " | "
            + " | ".join(_n(p["intermediate_rows"][m]) for m in methods)
            + " |"
        )
    unit = "edges" if size else "epoch size"
    bullets = [
        f"{m}: **x{g['fit']}** per 10x of {what} (least-squares fit of log seconds on log "
        f"{unit}), x{g['end_points']} between the end points."
        for m, g in r["growth_per_decade"].items()
    ]
    if size:
        target = r["target_growth_per_decade"]
        met = r["growth_per_decade"]["wcoj"]["fit"] < target
        bullets.append(
            f"The target is less than {target:g}x per 10x of graph size for wcoj: "
            f"**{'met' if met else 'not met'}** on this run (by the fit)."
        )
    return "\n".join([*lines, "", *_bullets(bullets)])


def render_machine(records: dict[str, dict[str, Any]]) -> str:
    """Where and how the parts ran: machine, versions, settings, dates, the exact commands."""
    lines = ["The generated parts of this page were measured on:", ""]
    described: list[str] = []
    for record in records.values():
        text = _machine_text(record["machine"])
        if text not in described:
            described.append(text)
    lines += _bullets(described)
    lines += ["", "| part | date | wall time | load average (start → end) |", "|---|---|---:|---|"]
    for name, record in records.items():
        load = " → ".join("?" if v is None else f"{v:g}" for v in record["load_average"])
        lines.append(
            f"| {name} | {record['machine']['date']} | {record['seconds']:.0f} s | {load} |"
        )
    lines += ["", "```sh"]
    for name, record in records.items():
        lines += [f"# {name}", wrap_command(record["command"])]
    lines.append("```")
    return "\n".join(lines)


def _machine_text(facts: dict[str, Any]) -> str:
    conf = facts.get("spark_conf") or {}
    spark = (
        f"pyspark {facts['packages'].get('pyspark')} ({facts.get('spark_master')}, driver memory "
        f"{conf.get('spark.driver.memory')}, {conf.get('spark.sql.shuffle.partitions')} shuffle "
        f"partitions, AQE {conf.get('spark.sql.adaptive.enabled')})"
        if facts.get("spark_master")
        else f"pyspark {facts['packages'].get('pyspark')} (no session in the part's own process)"
    )
    others = ", ".join(
        f"{p} {v}" for p, v in facts["packages"].items() if p != "pyspark" and v is not None
    )
    return (
        f"{facts['cores']} cores, {facts['memory_gib']} GiB, {facts['platform']}; Python "
        f"{facts['python']}, {facts.get('java', 'Java unknown')}, {spark}; {others}."
    )


RENDER: dict[str, Callable[[dict[str, Any]], str]] = {
    "epochs": render_epochs,
    "static": render_static,
    "curve-size": render_curve,
    "curve-epoch-size": render_curve,
    "cluster-static": render_static,
    "cluster-epochs": render_epochs,
    "cluster-curve-size": render_curve,
    "cluster-cliques": render_static,
    "cluster-cliques-dense": render_static,
}


__all__ = [
    "MACHINE",
    "PAGE",
    "RENDER",
    "PageError",
    "regions",
    "render_machine",
    "replace_regions",
    "wrap_command",
]
