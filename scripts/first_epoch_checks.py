"""What the quick start's first epoch costs through Dagster, its default checks included,
against a fresh ``wcoj apply --epoch 0`` of the same file (issue 31's target: at most 2x).

Usage: ``python scripts/first_epoch_checks.py EDGE_FILE SCRATCH [--rounds N] [--baseline
PYTHON]``, e.g. with ``../shared/data/web-NotreDame.txt.gz``. Each round, in an order rotating
from round to round: the README's quick start (`wcoj_bench.parts.dagster_run`'s project files) with
only epoch 0 landed and its instance made as the quick start makes it (``python -m
wcoj_assets.instance init``: ``.dagster/`` with its storage, untimed), run by one fresh ``dagster
job execute``; and a fresh ``wcoj apply --epoch 0 --changes edge=FILE --undirected edge`` into a
new state. Both timed exec to exit with their peak memory (`wcoj_bench.infra.measure.run_process`).
With ``--baseline PYTHON`` (another checkout's venv, e.g. main's ``.venv/bin/python``) the same
two commands of that install run in the same rounds, interleaved, so that both sides see the
same load.

From each Dagster run's event log: seconds before the run started (Python, Dagster, loading the
code location), its step, after the run to the exit; inside the step, reading and checking the
landed file (``edge_deltas``' metadata), the engine's pass (``triangles``') and every check's
(``matches_delta_rules``: its seconds, mode, chance to find a wrong tuple). Prints one JSON
object with the load average before and after, the medians and the ratios.

A script, not a benchmark part: it measures one pair of commands for one issue's target (the
lead reruns it on an idle machine); figures go to docs/benchmarks.md with the load average.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time as clock
from pathlib import Path
from typing import Any

from wcoj_bench.infra.measure import run_process
from wcoj_bench.parts.dagster_run import JOB, RELATION, START, write_package


def project(root: Path, edges: Path) -> Path:
    """The quick start's project at `root` with `edges` landed as epoch 0, and its instance
    (``python -m wcoj_assets.instance init``); the instance's home."""
    from wcoj_assets.instance import init_project

    write_package(root)
    first = root / "data" / "landing" / RELATION / START
    first.mkdir(parents=True)
    shutil.copyfile(edges, first / edges.name)
    return init_project(root)


def _metadata(entry: Any) -> dict[str, Any]:
    return {k: v.value for k, v in entry.metadata.items()}


def dagster_round(work: Path, edges: Path, python: Path) -> dict[str, Any]:
    from dagster import DagsterEventType as T
    from dagster import DagsterInstance

    from wcoj_assets.instance import dagster_env

    root = work / "edges"
    home = project(root, edges)
    env = {**os.environ, **dagster_env(), "DAGSTER_HOME": str(home)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "src"), env.get("PYTHONPATH")]))
    argv = [str(python.with_name("dagster")), "job", "execute", "-m", "edges.definitions"]
    argv += ["-j", JOB, "--tags", json.dumps({"dagster/partition": START})]
    begun = clock.time()
    done = run_process(argv, env=env, cwd=root)
    checks: dict[str, Any] = {}
    inside: dict[str, Any] = {}
    with DagsterInstance.from_config(str(home)) as instance:
        (record,) = instance.get_run_records(limit=1)
        logs = instance.all_logs(record.dagster_run.run_id)
    at: dict[Any, float] = {}
    for entry in logs:
        event = entry.dagster_event
        if event is None:
            continue
        at.setdefault(event.event_type, entry.timestamp)
        at[f"last {event.event_type}"] = entry.timestamp
        if event.event_type == T.ASSET_CHECK_EVALUATION:
            c = event.event_specific_data
            meta = _metadata(c)
            wanted = ("seconds", "mode", "chance_to_find_a_wrong_tuple", "joined_rows", "figures")
            checks[c.check_name] = {  # type: ignore[union-attr]
                "passed": c.passed,  # type: ignore[union-attr]
                **{k: meta[k] for k in wanted if k in meta},
            }
        if event.event_type == T.ASSET_MATERIALIZATION:
            m = event.event_specific_data.materialization  # type: ignore[union-attr]
            internal = _metadata(m).get("engine (internal)", {})
            if m.asset_key.to_user_string() == "triangles":
                inside["engine_seconds"] = internal.get("seconds")
                inside["engine_phases"] = internal.get("seconds by phase")
            if m.asset_key.to_user_string() == f"{RELATION}_deltas":
                inside["reading_seconds"] = internal.get("seconds reading")
    started = record.start_time or at[T.RUN_START]
    ended = record.end_time or at[T.RUN_SUCCESS]
    return {
        "seconds": round(done.seconds, 3),
        "peak_rss_bytes": done.max_rss_bytes,
        "cpu_seconds": round(done.cpu_seconds, 3),
        "before_run_seconds": round(started - begun, 3),
        "step_seconds": round(at[T.STEP_SUCCESS] - at[T.STEP_START], 3),
        "events_seconds": round(at[T.STEP_SUCCESS] - at[T.ASSET_MATERIALIZATION], 3),
        "after_run_seconds": round(begun + done.seconds - ended, 3),
        **inside,
        "checks": checks,
    }


def apply_round(work: Path, edges: Path, python: Path) -> dict[str, Any]:
    wcoj = str(python.with_name("wcoj"))
    argv = [wcoj, "apply", "--query", "triangles", "--state", str(work / "state"), "--epoch", "0"]
    argv += ["--changes", f"edge={edges}", "--undirected", "edge"]
    done = run_process(argv)
    return {
        "seconds": round(done.seconds, 3),
        "cpu_seconds": round(done.cpu_seconds, 3),
        "peak_rss_bytes": done.max_rss_bytes,
    }


def main() -> None:
    edges, scratch = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 2
    sides = {"this": Path(sys.executable)}
    if "--baseline" in sys.argv:
        sides["baseline"] = Path(sys.argv[sys.argv.index("--baseline") + 1]).absolute()
    load = {"start": [round(x, 2) for x in os.getloadavg()]}
    kinds = [(side, kind) for side in sides for kind in ("dagster", "apply")]
    runs: dict[str, list[dict[str, Any]]] = {f"{s} {k}": [] for s, k in kinds}
    for r in range(rounds):
        for side, kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
            work = scratch / f"{side}-{kind}-{r}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            do = dagster_round if kind == "dagster" else apply_round
            run = do(work, edges, sides[side])
            runs[f"{side} {kind}"].append(run)
            print(side, kind, r, json.dumps(run), file=sys.stderr, flush=True)
            shutil.rmtree(work, ignore_errors=True)
    load["end"] = [round(x, 2) for x in os.getloadavg()]
    medians = {name: statistics.median(r["seconds"] for r in rs) for name, rs in runs.items()}
    cpu = {name: statistics.median(r["cpu_seconds"] for r in rs) for name, rs in runs.items()}
    ratios = {
        side: round(medians[f"{side} dagster"] / medians[f"{side} apply"], 2) for side in sides
    }
    cpu_ratios = {side: round(cpu[f"{side} dagster"] / cpu[f"{side} apply"], 2) for side in sides}
    print(
        json.dumps(
            {
                "file": str(edges),
                "load_average": load,
                "median_seconds": medians,
                "ratio": ratios,
                "median_cpu_seconds": cpu,
                "cpu_ratio": cpu_ratios,
                "runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
