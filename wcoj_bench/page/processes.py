"""The page's regions for the parts that time whole processes: ``cold``, ``dagster-run``,
``cluster-idle`` and ``scale``.

Like `wcoj_bench.page.markup`, pure Python: each renderer reads one saved record (the part's command,
date, wall time, load average, machine and JSON) and nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wcoj_bench.page.markup import DASH, _bold, _bullets, _bytes, _measured, _n, _option, _runs, _s


def _phases(phases: dict[str, float]) -> str:
    return ", ".join(f"{k} {_s(v)}" for k, v in phases.items())


def _wanted(t: dict[str, Any]) -> str:
    value = t["wanted"]
    shown = _bytes(int(value)) if t["key"].endswith("bytes") else f"{value:g}"
    return f"{t['op']} {shown}".replace("<=", "≤").replace(">=", "≥")


def _measured_value(t: dict[str, Any]) -> str:
    value = t["measured"]
    if t["key"].endswith("bytes"):
        return _bytes(int(value))
    return _s(value) if t["key"].endswith("seconds") else f"{value:g}"


def render_cold(record: dict[str, Any]) -> str:
    """The cold part: fresh processes side by side, the sizes, the warm epochs, the targets."""
    r = record["result"]
    g = r["graph"]
    p = g["processes"]
    name = Path(g["input"]).name
    epochs = f"{r['epochs']} epoch" + ("s" if r["epochs"] > 1 else "")
    lines = _measured(
        record,
        f"{epochs} of {r['epoch_size']:,} changes on `{name}` ({g['edges']:,} undirected edges, "
        f"{g['initial_count']:,} {r['query']} at the start; its state built by `wcoj apply` in "
        f"{g['base_epochs']} epoch(s) and copied for the run), each epoch a fresh process of "
        "each kind, one after the other. At every epoch every process reported the same count, "
        "and wcoj's output change equalled the recompute's (its output minus the previous one) "
        "as an exact multiset, before any figure was kept.",
    )
    apply = p["apply"]
    rows = [
        (
            "**`wcoj apply --epoch T`**",
            apply,
            f"the command's own {_s(apply['median_cli_seconds'])} s; opening the state "
            f"{_s(apply['hydration']['median_seconds'])} s, "
            f"{_bytes(apply['hydration']['median_mapped_bytes'])} mapped, "
            f"{_bytes(apply['hydration']['max_read_bytes'])} read",
        )
    ]
    if "apply-evicted" in p:
        e = p["apply-evicted"]
        rows.append(
            (
                "`wcoj apply`, the state's pages dropped from the page cache first",
                e,
                f"the command's own {_s(e['median_cli_seconds'])} s; opening "
                f"{_s(e['hydration']['median_seconds'])} s",
            )
        )
    rec = p["recompute"]
    rows.append(
        (
            "Spark SQL recompute (`probes recompute`: the relation's table updated, the binary "
            "plan, the output written)",
            rec,
            f"starting Spark {_s(rec['median_spark_start_seconds'])} s, the work "
            f"{_s(rec['median_work_seconds'])} s",
        )
    )
    for key, label in (
        ("open", "opening the state (`probes open`: engine and every trace)"),
        ("open-evicted", "the same, the state's pages dropped first"),
    ):
        if key in p:
            o = p[key]
            rows.append(
                (
                    label,
                    o,
                    f"inside: {_s(o['median_open_seconds'])} s (engine "
                    f"{_s(o['median_engine_seconds'])}, traces {_s(o['median_traces_seconds'])}; "
                    f"{o['segments']} segments, {_bytes(o['mapped_bytes'])} mapped), imports "
                    f"{_s(o['median_import_seconds'])} s",
                )
            )
    lines += [
        "",
        "| fresh process, exec to exit | median s | runs, s | peak RSS | inside the process |",
        "|---|---:|---|---:|---|",
    ]
    for label, s, inside in rows:
        lines.append(
            f"| {label} | {_bold(_s(s['median_seconds']), s is apply)} | {_runs(s['seconds'])} "
            f"| {_bytes(s['max_peak_rss_bytes'])} | {inside} |"
        )
    spark = ", ".join(apply["spark"])
    bullets = [
        f"`speedup_vs_recompute` **{g['speedup_vs_recompute']}** (the recompute's median over "
        "the apply's).",
        f"`wcoj apply`'s phases (medians): {_phases(apply['phases'])} s; Spark started: "
        f"{'no' if spark == 'None' else spark}; kernel on: {', '.join(apply['deployments'])}.",
        "Peak RSS: the `wcoj` process's high-water mark (`VmHWM`); for the recompute, the "
        "sampled peak of its process tree (Python and the JVM).",
        "Counts after each epoch: " + ", ".join(_n(c) for c in g["counts"]) + "; output change "
        "rows: " + ", ".join(_n(c) for c in g["change_rows"]) + ".",
    ]
    lines += ["", *_bullets(bullets)]
    lines += _sizes(record)
    if "warm" in g:
        lines += _warm(g["warm"])
    lines += [
        "",
        "| target (issues 20, 21) | wanted | measured | |",
        "|---|---:|---:|---|",
    ]
    for t in r["targets"]:
        lines.append(
            f"| {t['target']} | {_wanted(t)} | {_measured_value(t)} | "
            f"**{'met' if t['met'] else 'not met'}** |"
        )
    return "\n".join(lines)


def _sizes(record: dict[str, Any]) -> list[str]:
    r = record["result"]
    if not r["sizes"]:
        return []
    plot = Path(_option(record["argv"], "--plot") or "cold.png").name
    lines = [
        "",
        f"![seconds per fresh-process epoch against graph size](img/{plot})",
        "",
        "| edges | graph | built in | cold `wcoj apply` s | its own s | opening s | "
        "open process s (inside) | mapped | peak RSS | checked |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for pt in r["sizes"]:
        a, o = pt["apply"], pt["open"]
        checked = DASH if pt["scipy_count"] is None else f"scipy {_n(pt['scipy_count'])}"
        lines.append(
            f"| {pt['edges']:,} | `{pt['input']}` | {pt['base_epochs']} epoch(s), "
            f"{_s(sum(pt['build_seconds']))} s | **{_s(a['median_seconds'])}** | "
            f"{_s(a['median_cli_seconds'])} | {_s(a['hydration']['median_seconds'])} | "
            f"{_s(o['median_seconds'])} ({_s(o['median_open_seconds'])}) | "
            f"{_bytes(o['mapped_bytes'])} | {_bytes(a['max_peak_rss_bytes'])} | {checked} |"
        )
    bullets = []
    for key, what in (
        ("apply", "the cold apply (whole process)"),
        ("apply_cli", "the command's own seconds"),
        ("open", "opening (inside the process)"),
    ):
        growth = r.get("growth_per_decade", {}).get(key)
        if growth:
            bullets.append(
                f"{what}: **x{growth['fit']}** per 10x of edges (least-squares fit of log seconds "
                f"on log edges), x{growth['end_points']} between the end points."
            )
    bullets.append(
        "Each graph's state was built once by `wcoj apply` (epochs of at most 4 M edges: the "
        "command's limit) and is reused from the cache by later runs; a copy is stamped again "
        "by `wcoj verify --repair` before it is used."
    )
    return [*lines, "", *_bullets(bullets)]


def _warm(w: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"| warm epoch, one process, epochs 2{DASH}{w['epochs']} | median s | phases (medians, s) "
        "| every epoch, s |",
        "|---|---:|---|---|",
    ]
    for meaning in ("set", "bag"):
        m = w[meaning]
        lines.append(
            f"| {_bold(f'undirected {meaning}', meaning == 'set')} | "
            f"{_bold(_s(m['median_seconds']), meaning == 'set')} | {_phases(m['phases'])} | "
            f"{_runs(m['seconds_per_epoch'])} |"
        )
    return [
        *lines,
        "",
        *_bullets(
            [
                f"set over bag: **{w['set_over_bag']}x** (the same epochs, the same counts; each "
                "meaning in a process of its own on its own copy of the state, epoch 1 the "
                "warm-up)."
            ]
        ),
    ]


def render_idle(record: dict[str, Any]) -> str:
    """The idle part: back-to-back epochs against epochs apart, with the workers seen."""
    r = record["result"]
    runs = r["runs"]
    gap = r["gap_seconds"]
    lines = _measured(
        record,
        f"`{r['input']}` ({r['edges']:,} undirected edges, state built by `wcoj apply` in "
        f"{r['base_epochs']} epoch(s)), {r['epoch_size']:,}-change epochs, wcoj's kernel on "
        f"`{r['deployment']}`: one warm-up epoch, {r['epochs']} back to back, then {r['epochs']} "
        f"each after {gap:g} s of sleep. Every epoch's output change equalled the driver's on a "
        "second copy of the state, as an exact multiset.",
    )
    lines += [
        "",
        "| epochs | median s | runs, s | new Python workers per epoch |",
        "|---|---:|---|---|",
    ]
    for kind, label, median in (
        ("back-to-back", "back to back", r["median_back_to_back_seconds"]),
        ("apart", f"{gap:g} s apart", r["median_apart_seconds"]),
    ):
        mine = [x for x in runs if x["kind"] == kind]
        lines.append(
            f"| {label} | **{_s(median)}** | {_runs([x['seconds'] for x in mine])} | "
            + " / ".join(str(x["new_workers"]) for x in mine)
            + " |"
        )
    warm = [x for x in runs if x["kind"] == "warm-up"]
    bullets = [
        f"Apart over back to back: **{r['apart_over_back_to_back']}x**; the target is at most "
        f"{r['target_ratio']:g}x: **{'met' if r['met'] else 'not met'}**.",
    ]
    if warm:
        bullets.append(
            f"The warm-up epoch took {_s(warm[0]['seconds'])} s ({_phases(warm[0]['phases'])})."
        )
    for kind in ("back-to-back", "apart"):
        mine = [x for x in runs if x["kind"] == kind]
        if mine:
            slowest = max(mine, key=lambda x: x["seconds"])
            bullets.append(
                f"Slowest {kind.replace('-', ' ')} epoch: {_s(slowest['seconds'])} s "
                f"({_phases(slowest['phases'])}; kernel on {slowest['deployment']})."
            )
    bullets.append(
        "New Python workers: Spark Python worker processes on this machine after the epoch that "
        "were not there before it (a worker Spark started for the epoch)."
    )
    return "\n".join([*lines, "", *_bullets(bullets)])


def render_dagster_run(record: dict[str, Any]) -> str:
    """The dagster-run part: the quick start's epoch per fresh run, real job and hollow job."""
    r = record["result"]
    real, hollow = r["real"], r["hollow"]
    name = Path(r["input"]).name
    epochs = f"{r['epochs']} epoch" + ("s" if r["epochs"] > 1 else "")
    lines = _measured(
        record,
        f"{epochs} of {r['epoch_size']:,} changes on `{name}` ({r['edges']:,} undirected edges, "
        f"{r['initial_count']:,} {r['query']} after epoch 0, landed as the quick start's epoch 0 "
        f"and materialized untimed), on {INSTANCE_NAMES.get(r['instance'], r['instance'])} "
        "instances, one per job: each epoch one fresh "
        "`dagster job execute` of the README's quick start and one of the same job with empty "
        "bodies, in alternating order. Every run succeeded with every check passed, both jobs "
        "wrote the same materializations and check evaluations, and at every epoch the run's "
        "count equalled a fresh `wcoj apply`'s on the same file and the pipeline's output change "
        "equalled the command's as an exact multiset, before any figure was kept.",
    )
    lines += [
        "",
        "| fresh `dagster job execute`, exec to exit | median s | runs, s | before the run | "
        "the run (its step) | after the run | peak RSS | events |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for label, s, on in (
        ("**the quick start's `wcoj_epoch_job`**", real, True),
        ("the same job with empty bodies (`wcoj_bench.infra.hollow`)", hollow, False),
    ):
        ph = s["median_phases"]
        lines.append(
            f"| {label} | {_bold(_s(s['median_seconds']), on)} | {_runs(s['seconds'])} | "
            f"{_s(ph['before the run'])} | {_s(ph['run'])} ({_s(s['median_step_seconds'])}) | "
            f"{_s(ph['after the run'])} | {_bytes(s['median_peak_rss_bytes'])} | "
            f"{s['events_per_run']['all']} |"
        )
    runs = r["runs"]["real"]
    reads = [x["read_seconds"] for x in runs if x.get("read_seconds") is not None]
    engine = [x["engine_seconds"] for x in runs if x.get("engine_seconds") is not None]
    bullets = [
        f"Over the empty bodies: **{_s(r['real']['median_seconds'] - r['hollow']['median_seconds'])}"
        f" s** (difference of the medians; median of the per-epoch differences "
        f"{_s(r['median_over_hollow_seconds'])} s). "
        f"About {BEFORE_SECONDS:g} s before one step per epoch: **{r['speedup_vs_before']}x** "
        "faster.",
        "Inside the real step (medians of its materializations' figures): reading and checking "
        f"the landed file {_s(_median(reads))} s, the engine's pass {_s(_median(engine))} s. "
        f"A fresh `wcoj apply` of the same file: {_s(r['apply']['median_seconds'])} s.",
        "Phases from each run's event log: *before the run* is exec to `RUN_START` (Python, "
        "Dagster, loading the code location), *after the run* `RUN_SUCCESS` to the exit.",
        "Counts after each epoch: " + ", ".join(_n(c) for c in r["counts"]) + ".",
    ]
    lines += ["", *_bullets(bullets), "", "| target (issue 22) | wanted | measured | |"]
    lines.append("|---|---:|---:|---|")
    for t in r["targets"]:
        lines.append(
            f"| {t['target']} | {_wanted(t)} | {_measured_value(t)} | "
            f"**{'met' if t['met'] else 'not met'}** |"
        )
    return "\n".join(lines)


def _process_row(label: str, r: dict[str, Any], exact: str) -> str:
    """One whole process as a row: what, wall s, CPU s, the tree's peak RssAnon, VmHWM,
    exactness, load average."""
    load = " / ".join(f"{v:g}" for v in r.get("load_average", []))
    return (
        f"| {label} | {_s(r['seconds'])} | {_s(r.get('cpu_seconds', 0.0))} | "
        f"{_bytes(r['tree_anon_bytes'])} | {_bytes(r['tree_hwm_bytes'])} | {exact} | {load} |"
    )


def render_scale(record: dict[str, Any]) -> str:
    """The scale part: one memory budget at 20-40 M edges, every figure a whole process."""
    r = record["result"]
    load = r["load"]
    lines = _measured(
        record,
        f"`{r['input']}` ({r['edges']:,} undirected edges, {r['vertices']:,} vertices), "
        f"{r['query']} under `--memory {r['memory']}`; every process capped at {r['cap']} of "
        f"anonymous memory and timed out after {r['timeout']:g} s. Peak anonymous memory is the "
        "sampled peak of the whole process tree's RssAnon (every 20 ms, JVM and Python workers "
        "included when there are any); VmHWM the largest in the tree (anonymous and mapped file "
        "pages). CPU seconds are the process's and its children's: on a loaded machine, what the "
        "work took whatever the wall time.",
    )
    lines += [
        "",
        "| process | wall s | CPU s | peak anonymous (tree) | VmHWM | exact | load average |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    a = load["apply"]
    lines.append(
        _process_row(
            f"**one `wcoj apply --epoch 0`** ({_n(a['change_rows'])} rows out, "
            f"{_n(a['rows_per_second'])} a second)",
            a,
            f"{_n(a['count'])} = forward count {_n(load['check']['count'])}",
        )
    )
    lines.append(_process_row("independent forward count (numpy)", load["check"], DASH))
    for st in load.get("static", []):
        if st["status"] == "ok":
            lines.append(
                _process_row(
                    f"{st['method']} static count ({_n(st.get('rows_per_second'))} rows a second)",
                    st,
                    _n(st["count"]),
                )
            )
        else:
            lines.append(f"| {st['method']} static count | {st['status']} | | | | {DASH} | |")
    build = r.get("build")
    if build:
        for e in build["epochs"]:
            lines.append(
                _process_row(
                    f"build epoch {e['epoch']} (`--deploy driver`, {_n(e['change_rows'])} rows out)",
                    e,
                    _n(e["count"]),
                )
            )
    epochs = r.get("epochs", {})
    for e in epochs.get("runs", []):
        lines.append(_process_row(f"fresh 1,000-change epoch {e['epoch']}", e, _n(e["count"])))
    for size in r.get("growth", {}).get("sizes", []):
        lines.append(
            _process_row(
                f"`{size['input']}` ({_n(size['edges'])} edges): median fresh epoch",
                {**size["runs"][len(size["runs"]) // 2], "seconds": size["median_seconds"]},
                DASH,
            )
        )
    lines += ["", "| target (issue 31) | wanted | measured | |", "|---|---:|---:|---|"]
    for t in r["targets"]:
        lines.append(
            f"| {t['target']} | {_wanted(t)} | {_measured_value(t)} | "
            f"**{'met' if t['met'] else 'not met'}** |"
        )
    return "\n".join(lines)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else 0.0


BEFORE_SECONDS = (
    50.0  # wcoj_bench.parts.dagster_run's (the page imports nothing but wcoj_bench.page)
)
INSTANCE_NAMES = {"sqlite": "SQLite", "postgres": "Postgres"}

__all__ = ["render_cold", "render_dagster_run", "render_idle", "render_scale"]
