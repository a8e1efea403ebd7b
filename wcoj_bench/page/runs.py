"""The page's regions for the parts that run in one process: ``epochs``, ``static`` and the
curves (and their cluster runs).

Like `wcoj_bench.page.markup`, pure Python: each renderer reads one saved record and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from wcoj_bench.page.markup import (
    LABELS,
    _bold,
    _bullets,
    _bytes,
    _epochs,
    _measured,
    _n,
    _option,
    _runs,
    _s,
)


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
