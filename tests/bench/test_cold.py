"""`wcoj-bench cold` and `wcoj-bench idle`: whole processes and epochs apart, end to end.

Timings are not asserted. What is: the epochs a prepared graph gets delete present edges and
insert absent ones, each edge named once; the cold part runs end to end on a tiny graph (a fresh
``wcoj apply``, a fresh Spark SQL recompute and a fresh open per epoch, the warm set and bag
processes, the R-MAT sizes), every process agreeing, its JSON carrying what the page renders, its
plot a PNG; a disagreement stops it; the idle part applies its epochs on the executors, back to
back and apart, each checked against the driver. The cold part's run is the report's quick run's
(`report_support`: the same command, run once a session).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import SparkSession
from report_support import QuickRun

from wcoj_bench import cli
from wcoj_bench.infra import prepared
from wcoj_bench.infra.measure import BenchError, compare_changes
from wcoj_bench.page import processes as page_processes
from wcoj_bench.parts import cold

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def tiny_graph(path: Path, vertices: int = 240, seed: int = 3) -> Path:
    """A graph with plenty of triangles: each vertex joined to some of its next eight."""
    rng = np.random.default_rng(seed)
    lines = [
        f"{v}\t{v + k}"
        for v in range(vertices)
        for k in range(1, 9)
        if v + k < vertices and rng.random() < 0.6
    ]
    path.write_text("# a tiny graph\n" + "\n".join(lines) + "\n")
    return path


def test_epochs_delete_present_edges_and_insert_absent_ones_each_named_once() -> None:
    rng = np.random.default_rng(1)
    pairs = {(int(a), int(b)) for a, b in rng.integers(0, 400, (3000, 2)) if a < b}
    src, dst = (np.array(sorted(pairs))[:, i] for i in (0, 1))
    out = prepared.epoch_changes(src, dst, 5, 40, seed=9)
    present = set(pairs)
    named: set[tuple[int, int]] = set()
    directions = set()
    for rows in out:
        assert len(rows) == 40
        for a, b, d in rows.tolist():
            edge = (min(a, b), max(a, b))
            assert edge not in named, "no edge is named twice"
            named.add(edge)
            directions.add(a < b)
            if d < 0:
                assert edge in present, "a deletion removes a present edge"
                present.discard(edge)
            else:
                assert edge not in present, "an insertion adds an absent edge"
                present.add(edge)
        assert sorted(rows[:, 2].tolist()).count(-1) == 20
    assert directions == {True, False}, "edges are named in both directions"


def test_disagreements_stop_the_part() -> None:
    same = (np.array([[1, 2, 3]]), np.array([1]))
    cold._agree(1, "a and b", same, same)
    with pytest.raises(BenchError, match=r"epoch 2: 1 output tuples differ, a and b"):
        cold._agree(2, "a and b", same, (np.zeros((0, 3), dtype=np.int64), np.zeros(0)))
    with pytest.raises(BenchError, match="epoch 3: the counts differ: apply 5, recompute 6"):
        cold._same_counts(3, {"apply": 5, "recompute": 6})
    assert not compare_changes(same, (np.array([[1, 2, 3]]), np.array([2]))).equal


@pytest.fixture()
def cold_run(quick: QuickRun) -> tuple[dict, Path]:
    """The cold part of the report's quick run (`report_support`): an R-MAT graph of 2,180
    edges, 2 epochs of 20 changes, 3 warm epochs, the R-MAT sizes 1,000 and 3,000; its JSON line
    and the report's root (``img/cold.png``, ``scratch/``)."""
    return quick.part("cold"), quick.root


@pytest.mark.spark  # the cold part's recompute processes start JVMs
def test_the_cold_part_runs_every_process_and_they_agree(cold_run: tuple[dict, Path]) -> None:
    report, root = cold_run
    assert report["mode"] == "cold" and report["check"] == "passed"
    g = report["graph"]
    assert len(g["counts"]) == 2 and g["initial_count"] > 100
    for kind in ("apply", "apply-evicted", "recompute", "open", "open-evicted"):
        runs = g["runs"][kind]
        assert len(runs) == 2, kind
        assert all(r["seconds"] > 0 and r["peak_rss_bytes"] > 0 for r in runs), kind
    for r in g["runs"]["apply"]:
        assert r["spark"] is None, "a local apply starts no Spark"
        assert r["deployment"] == "driver" and r["hydration"]["rebuilt"] == []
        assert r["hydration"]["mapped_bytes"] > 0 and r["hydration"]["read_bytes"] == 0
    assert [r["count"] for r in g["runs"]["recompute"]] == g["counts"]
    apply = g["processes"]["apply"]
    assert set(apply["phases"]) >= {"open", "land", "rules", "write", "commit"}
    assert apply["spark"] == ["None"]
    assert g["processes"]["open"]["median_open_seconds"] > 0
    assert g["speedup_vs_recompute"] > 0
    warm = g["warm"]
    assert len(warm["set"]["seconds_per_epoch"]) == 3 and warm["set_over_bag"] > 0
    assert {t["key"] for t in report["targets"]} == {
        "apply_seconds",
        "speedup_vs_recompute",
        "open_seconds",
        "apply_rss_bytes",
        "growth_per_decade",  # the R-MAT sizes ran
        "set_over_bag",
        "evicted_apply_seconds",  # issue 39's: the main graph's and the largest R-MAT's
        "evicted_apply_seconds_largest",
    }
    for point in report["sizes"]:  # each R-MAT graph's evicted copy agreed with the cached one
        assert [r["count"] for r in point["runs"]["apply-evicted"]] == point["counts"]
    assert report["machine"]["java"], "the recompute processes' JVM"
    assert (root / "img" / "cold.png").read_bytes().startswith(PNG_SIGNATURE)
    assert not (root / "scratch" / "cold").exists(), "working copies are removed"
    assert any((root / "scratch" / "cache" / "states").iterdir()), "built states are kept"


@pytest.mark.spark  # the cold part's recompute processes start JVMs
def test_the_cold_region_renders_from_the_json(cold_run: tuple[dict, Path]) -> None:
    report, _ = cold_run
    argv = ["cold", "--input", "edge=g.txt", "--undirected", "edge", "--json"]
    record = {
        "command": "wcoj-bench cold --input edge=g.txt --undirected edge --json",
        "argv": argv,
        "seconds": 12.0,
        "load_average": [0.5, 0.7],
        "machine": report["machine"],
        "result": {k: v for k, v in report.items() if k != "machine"},
    }
    text = page_processes.render_cold(record)
    assert "| fresh process, exec to exit |" in text
    assert "| **`wcoj apply --epoch T`** |" in text
    assert "undirected set" in text and "undirected bag" in text
    assert "| target (issues 20, 21) |" in text


@pytest.mark.spark  # the cold part's recompute processes start JVMs
def test_a_cached_state_is_reused(cold_run: tuple[dict, Path]) -> None:
    report, root = cold_run
    cache = root / "scratch" / "cache"
    (folder,) = [
        f
        for f in (cache / "graphs").iterdir()
        if json.loads((f / "graph.json").read_text())["input"] == report["graph"]["input"]
    ]
    graph = prepared.PreparedGraph(folder, json.loads((folder / "graph.json").read_text()))
    built = prepared.base_state(graph, cache, say=lambda _l: pytest.fail("built again"))
    assert built.count > 100 and built.last_epoch == 0


def test_the_idle_part_applies_epochs_back_to_back_then_apart(
    small: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = tiny_graph(tmp_path / "g.txt")
    argv = ["idle", "--input", f"edge={graph}", "--undirected", "edge", "--epochs", "2"]
    argv += ["--epoch-size", "20", "--gap", "0.5", "--scratch", str(tmp_path / "s"), "--json"]
    assert cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["mode"] == "idle" and report["check"] == "passed"
    kinds = [r["kind"] for r in report["runs"]]
    assert kinds == ["warm-up", "back-to-back", "back-to-back", "apart", "apart"]
    assert {r["deployment"] for r in report["runs"]} == {"executors"}
    assert report["apart_over_back_to_back"] > 0 and report["gap_seconds"] == 0.5
    record = {
        "command": "wcoj-bench " + " ".join(argv),
        "argv": argv,
        "seconds": 3.0,
        "load_average": [None, None],
        "machine": report["machine"],
        "result": report,
    }
    text = page_processes.render_idle(record)
    assert "| back to back |" in text and "| 0.5 s apart |" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cold", "--input", "edge={g}"], "give --undirected edge"),
        (["cold", "--input", "edge={g}", "--undirected", "edge", "--plot", "c.jpg"], ".png"),
        (["cold", "--input", "edge={g}", "--undirected", "edge", "--sizes", "5"], "two different"),
        (["idle", "--input", "edge={g}", "--undirected", "edge", "--gap", "-1"], "--gap must be"),
        (
            ["cold", "--input", "edge={g}", "--undirected", "edge", "--epoch-size", "1"],
            "at least 2",
        ),
    ],
)
def test_mistakes_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    graph = tiny_graph(tmp_path / "g.txt")
    argv = [a.replace("{g}", str(graph)) for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("wcoj-bench: error: "), err
    assert message in err[0]
