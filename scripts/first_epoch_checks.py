"""What the quick start's first epoch costs through Dagster, its default checks included,
against a fresh ``wcoj apply --epoch 0`` of the same file (issue 31's target: at most 2x).

Usage: ``python scripts/first_epoch_checks.py EDGE_FILE SCRATCH [--rounds N]``, e.g. with
``../shared/data/web-NotreDame.txt.gz``. Each round, alternating which runs first: the README's
quick start (`wcoj_bench.parts.dagster_run`'s project files) with only epoch 0 landed, run by one fresh
``dagster job execute`` on a new SQLite instance; and a fresh ``wcoj apply --epoch 0 --changes
edge=FILE --undirected edge`` into a new state. Both timed exec to exit with their peak memory
(`wcoj_bench.infra.measure.run_process`). From the Dagster run: its step's seconds, the engine's
(``triangles``' metadata) and every check's (``matches_delta_rules``: its seconds, mode, chance to
find a wrong tuple). Prints one JSON object with the load average before and after.

A script, not a benchmark part: it measures one pair of commands for one issue's target (the
lead reruns it on an idle machine); figures go to docs/reliability.md with the load average.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from wcoj_bench.parts.dagster_run import (
    DEFINITIONS_PY,
    DEFS_YAML,
    DG_TOML,
    JOB,
    RELATION,
    START,
    dagster_command,
)
from wcoj_bench.infra.measure import run_process


def project(root: Path, edges: Path) -> None:
    package = root / "src" / "edges"
    (package / "defs" / "triangles").mkdir(parents=True)
    (root / "dg.toml").write_text(DG_TOML)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "definitions.py").write_text(DEFINITIONS_PY)
    (package / "defs" / "triangles" / "defs.yaml").write_text(DEFS_YAML)
    first = root / "data" / "landing" / RELATION / START
    first.mkdir(parents=True)
    shutil.copyfile(edges, first / edges.name)


def dagster_round(work: Path, edges: Path) -> dict[str, Any]:
    from dagster import DagsterEventType as T
    from dagster import DagsterInstance

    from wcoj_assets.instance import dagster_env, prepare_home

    root = work / "edges"
    project(root, edges)
    home = prepare_home(work / "home")
    env = {**os.environ, **dagster_env(), "DAGSTER_HOME": str(home)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "src"), env.get("PYTHONPATH")]))
    argv = [*dagster_command(), "job", "execute", "-m", "edges.definitions", "-j", JOB]
    argv += ["--tags", json.dumps({"dagster/partition": START})]
    done = run_process(argv, env=env, cwd=root)
    checks: dict[str, Any] = {}
    engine = None
    with DagsterInstance.from_config(str(home)) as instance:
        (record,) = instance.get_run_records(limit=1)
        logs = instance.all_logs(record.dagster_run.run_id)
    at: dict[Any, float] = {}
    for entry in logs:
        event = entry.dagster_event
        if event is None:
            continue
        at.setdefault(event.event_type, entry.timestamp)
        if event.event_type == T.ASSET_CHECK_EVALUATION:
            c = event.event_specific_data
            meta = {k: v.value for k, v in c.metadata.items()}  # type: ignore[union-attr]
            wanted = ("seconds", "mode", "chance_to_find_a_wrong_tuple", "joined_rows", "figures")
            checks[c.check_name] = {  # type: ignore[union-attr]
                "passed": c.passed,  # type: ignore[union-attr]
                **{k: meta[k] for k in wanted if k in meta},
            }
        if event.event_type == T.ASSET_MATERIALIZATION:
            m = event.event_specific_data.materialization  # type: ignore[union-attr]
            if m.asset_key.to_user_string() == "triangles":
                engine = {k: v.value for k, v in m.metadata.items()}.get("seconds")
    return {
        "seconds": round(done.seconds, 3),
        "peak_rss_bytes": done.max_rss_bytes,
        "step_seconds": round(at[T.STEP_SUCCESS] - at[T.STEP_START], 3),
        "engine_seconds": engine,
        "checks": checks,
    }


def apply_round(work: Path, edges: Path) -> dict[str, Any]:
    wcoj = str(Path(sys.executable).with_name("wcoj"))
    argv = [wcoj, "apply", "--query", "triangles", "--state", str(work / "state"), "--epoch", "0"]
    argv += ["--changes", f"edge={edges}", "--undirected", "edge"]
    done = run_process(argv)
    return {"seconds": round(done.seconds, 3), "peak_rss_bytes": done.max_rss_bytes}


def main() -> None:
    edges, scratch = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 2
    load = {"start": [round(x, 2) for x in os.getloadavg()]}
    runs: dict[str, list[dict[str, Any]]] = {"dagster": [], "apply": []}
    for r in range(rounds):
        order = ("dagster", "apply") if r % 2 == 0 else ("apply", "dagster")
        for kind in order:
            work = scratch / f"{kind}-{r}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            run = dagster_round(work, edges) if kind == "dagster" else apply_round(work, edges)
            runs[kind].append(run)
            print(kind, r, json.dumps(run), file=sys.stderr, flush=True)
            shutil.rmtree(work, ignore_errors=True)
    load["end"] = [round(x, 2) for x in os.getloadavg()]
    dagster = statistics.median(r["seconds"] for r in runs["dagster"])
    apply = statistics.median(r["seconds"] for r in runs["apply"])
    print(
        json.dumps(
            {
                "file": str(edges),
                "load_average": load,
                "median_dagster_seconds": dagster,
                "median_apply_seconds": apply,
                "ratio": round(dagster / apply, 2),
                "runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
