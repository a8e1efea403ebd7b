"""`wcoj-bench dagster-run`: the README's quick start, one epoch per fresh `dagster job execute`.

Timings are not asserted. What is: the project the part writes is the README's quick start; on a
tiny graph the part runs end to end (the run of the report's quick mode, `report_support`: epoch
0 untimed, then each epoch a fresh run of the real job and of the hollow job), every run
succeeding with the same materializations and check evaluations on both jobs and the same counts
as a fresh ``wcoj apply``, its project and instances removed after; its JSON carries what the
page renders; a query other than the quick start's is refused in one line. The part starts no
JVM.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "assets"))

from report_support import QuickRun
from test_cold import tiny_graph
from test_quickstart import readme_definitions_py, readme_defs_yaml

from wcoj_bench import cli
from wcoj_bench.page import processes as page_processes
from wcoj_bench.parts import dagster_run

pytestmark = pytest.mark.e2e  # `dagster job execute` runs, process by process


def test_the_project_is_the_readmes_quick_start() -> None:
    assert readme_defs_yaml() == dagster_run.DEFS_YAML
    assert readme_definitions_py() == dagster_run.DEFINITIONS_PY


@pytest.fixture()
def part(quick: QuickRun) -> dict:
    """The dagster-run part of the report's quick run (`report_support`): an R-MAT graph of
    2,180 edges, 2 epochs of 20 changes; its JSON line."""
    assert not (quick.root / "scratch" / "dagster-run").exists(), (
        "the project and instances are removed"
    )
    return quick.part("dagster-run")


def test_every_epoch_runs_both_jobs_fresh_and_agrees_with_wcoj_apply(part: dict) -> None:
    assert part["mode"] == "dagster-run" and part["check"] == "passed"
    assert part["instance"] == "sqlite" and part["epochs"] == 2
    for job in ("real", "hollow"):
        runs = part["runs"][job]
        assert [r["partition"] for r in runs] == ["2024-03-02", "2024-03-03"]
        for r in runs:
            assert r["seconds"] > 0 and r["peak_rss_bytes"] > 0
            assert set(r["phases"]) == {"before the run", "run", "after the run"}
            assert r["events"]["materializations"] == 16  # every asset of both queries, one epoch
            # every check of one epoch (4 of triangles, 2 of per_vertex), the binary join off
            # its cadence (it reports nothing)
            assert r["events"]["check_evaluations"] == 6
    real, hollow = part["runs"]["real"], part["runs"]["hollow"]
    assert [r["count"] for r in real] == part["counts"] and "count" not in hollow[0]
    assert part["initial_count"] > 100 and len(set([part["initial_count"], *part["counts"]])) > 1
    assert all(r["read_seconds"] > 0 and r["engine_seconds"] > 0 for r in real)
    assert len(part["apply"]["seconds"]) == 2
    assert {t["key"] for t in part["targets"]} == set(dagster_run.TARGETS)
    assert part["speedup_vs_before"] > 0


def test_the_region_renders_from_the_json(part: dict) -> None:
    argv = ["dagster-run", "--input", "edge=g.txt", "--undirected", "edge", "--json"]
    record = {
        "command": "wcoj-bench " + " ".join(argv),
        "argv": argv,
        "seconds": 30.0,
        "load_average": [0.5, 0.7],
        "machine": part["machine"],
        "result": {k: v for k, v in part.items() if k != "machine"},
    }
    text = page_processes.render_dagster_run(record)
    assert "| **the quick start's `wcoj_epoch_job`** |" in text
    assert "| the same job with empty bodies (`wcoj_bench.infra.hollow`) |" in text
    assert "| target (issue 22) |" in text and "Over the empty bodies:" in text


def test_another_query_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = tiny_graph(tmp_path / "g.txt")
    argv = ["dagster-run", "--input", f"edge={graph}", "--undirected", "edge"]
    assert cli.main([*argv, "--query", "4-cliques"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the README's quick start" in err[0], err
