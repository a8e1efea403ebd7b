"""`wcoj-bench report`: the quick mode end to end, rendering, and its argument errors.

One quick run (tiny generated graphs, no SNAP file: the session's `quick`, `report_support`)
writes into a temporary root that starts as a copy of the repository's ``docs/benchmarks.md``. Asserted: every part's JSON is saved with its
command and machine; both plots are valid PNG files; every curve point was checked (its methods
agreed); every generated region of the page is rewritten while every byte outside the regions
stays as it was; ``--render-only`` rebuilds exactly the same page from the JSON; mistakes are
refused in one line. Timings are not asserted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from matplotlib import image
from report_support import QuickRun

from wcoj_bench import page, report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REGIONS = ("machine", *report.PARTS)


def outside_regions(text: str) -> str:
    """The page with every region's body emptied: what the report must never change."""
    return page.replace_regions(text, dict.fromkeys(page.regions(text), ""))


def test_the_repository_page_has_every_region_once() -> None:
    text = report.REPO_PAGE.read_text()
    assert sorted(page.regions(text)) == sorted(REGIONS)
    assert page.replace_regions(text, {}) == text


def test_every_part_is_saved_with_its_command_and_machine(quick: QuickRun) -> None:
    for name in report.PARTS:
        record = json.loads((quick.root / "bench" / f"{name}.json").read_text())
        assert record["part"] == name
        assert record["command"].startswith("wcoj-bench ") and "--json" in record["argv"]
        assert record["machine"]["cores"] >= 1 and record["machine"]["python"]
        if name not in ("dagster-run", "scale"):  # their runs start no JVM in this process
            assert record["machine"]["java"], "the Java version comes from the running session"
        if name == "scale":  # checked against its independent counts, load and epochs
            load = record["result"]["load"]
            assert load["apply"]["count"] == load["check"]["count"]
            assert record["result"]["epochs"]["exact"] is True
        else:
            assert record["result"]["check"] == "passed"
        assert any(line.startswith(f"report: {name}: done in") for line in quick.progress)
    epochs = json.loads((quick.root / "bench" / "epochs.json").read_text())["result"]
    assert set(epochs["methods"]) == {"recompute", "binary-delta", "wcoj", "wcoj-bag"}
    assert "skew" in epochs
    cold = json.loads((quick.root / "bench" / "cold.json").read_text())["result"]
    assert [p["edges"] for p in cold["sizes"]] == sorted(p["edges"] for p in cold["sizes"])
    assert len(cold["sizes"]) == 2 and "apply" in cold["growth_per_decade"]
    for point in cold["sizes"]:
        assert point["scipy_count"] == point["counts"][-1], "checked by scipy"
    idle = json.loads((quick.root / "bench" / "cluster-idle.json").read_text())["result"]
    assert {r["deployment"] for r in idle["runs"]} == {"executors"}
    assert idle["median_apart_seconds"] > 0


def test_the_plots_are_png_files(quick: QuickRun) -> None:
    for name in ("curve-size", "curve-epoch-size", "cold"):
        path = quick.root / "img" / f"{name}.png"
        assert path.read_bytes().startswith(PNG_SIGNATURE)
        pixels = image.imread(path)
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100


@pytest.mark.parametrize("name", ["curve-size", "curve-epoch-size"])
def test_every_curve_point_was_checked(quick: QuickRun, name: str) -> None:
    curve = json.loads((quick.root / "bench" / f"{name}.json").read_text())["result"]
    assert curve["check"] == "passed"
    assert curve["methods"] == ["binary-delta", "wcoj"]
    xs = [p["x"] for p in curve["points"]]
    assert len(xs) == 2 and xs == sorted(xs) and xs[0] < xs[1]
    for p in curve["points"]:
        assert p["bench"]["check"] == "passed" and p["bench"]["load_epochs"] == 1
        assert set(p["median_seconds"]) == {"binary-delta", "wcoj"}
        for seconds in p["seconds_per_epoch"].values():
            assert len(seconds) == curve["epochs"]
        assert p["intermediate_rows"]["wcoj"] > 0
    for growth in curve["growth_per_decade"].values():
        assert growth["fit"] > 0 and growth["end_points"] > 0
    if name == "curve-size":
        assert curve["epoch_size"] == 10 and curve["target_growth_per_decade"] == 3.0
        assert [p["label"] for p in curve["points"]] == [
            "rmat:scale=6,edges=1000,seed=1",
            "rmat:scale=8,edges=3000,seed=1",
        ]
    else:
        assert xs == [4, 20]


def test_regions_are_rewritten_and_the_prose_is_kept(quick: QuickRun) -> None:
    assert outside_regions(quick.after) == outside_regions(quick.before)
    old, new = page.regions(quick.before), page.regions(quick.after)
    for name in REGIONS:
        assert new[name] != old[name], name
    assert "![seconds per epoch against graph size](img/curve-size.png)" in new["curve-size"]
    assert (
        "![seconds per epoch against epoch size](img/curve-epoch-size.png)"
        in new["curve-epoch-size"]
    )
    assert "| **wcoj** |" in new["epochs"] and "skew epoch (hub of degree 60)" in new["epochs"]
    assert "| method | median s (1 run) |" in new["static"]
    assert "![seconds per fresh-process epoch against graph size](img/cold.png)" in new["cold"]
    assert "| target (issues 20, 21) |" in new["cold"]
    assert "| 1 s apart |" in new["cluster-idle"]
    assert "| target (issue 22) |" in new["dagster-run"]
    for name in report.PARTS:
        record = json.loads((quick.root / "bench" / f"{name}.json").read_text())
        assert f"# {name}" in new["machine"]
        assert page.wrap_command(record["command"]) in new["machine"]


def test_render_only_rebuilds_the_same_page_from_the_json(quick: QuickRun) -> None:
    stale = page.replace_regions(quick.after, {name: "stale" for name in REGIONS})
    (quick.root / "benchmarks.md").write_text(stale)
    progress: list[str] = []
    assert report.main(["--render-only", "--root", str(quick.root)], say=progress.append) == 0
    assert (quick.root / "benchmarks.md").read_text() == quick.after


def test_a_region_without_json_is_left_alone(tmp_path: Path) -> None:
    text = "prose\n<!-- generated: static -->\nby hand\n<!-- /generated -->\nmore prose\n"
    (tmp_path / "benchmarks.md").write_text(text)
    progress: list[str] = []
    assert report.main(["--render-only", "--root", str(tmp_path)], say=progress.append) == 0
    assert (tmp_path / "benchmarks.md").read_text() == text
    assert any("region 'static' left as it is" in line for line in progress)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", "curves"], "argument --only: invalid choice: 'curves'"),
        (["--render-only", "--only", "static"], "--render-only runs nothing; drop --only"),
        (["--render-only", "--root", "{tmp}/none"], "benchmarks.md: run from the repository's"),
        (["--only", "static", "--root", "{tmp}", "--data", "{tmp}"], "pass --data DIR"),
    ],
)
def test_mistakes_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "benchmarks.md").write_text("no regions\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert report.main(argv, say=lambda _line: None) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("wcoj-bench report: error: "), err
    assert message in err[0]


def test_only_the_quick_run_sets_its_spark_sessions_for_tiny_data() -> None:
    quick = report.commands(True, "data", Path("img"), scratch=Path("scratch"))
    full = report.commands(False, "data", Path("img"))
    no_session = ("cold", "dagster-run", "scale")  # their processes start no Spark themselves
    for name in report.PARTS:
        settings = "spark.sql.codegen.wholeStage=false" in quick[name]
        assert settings == (name not in no_session), name
        assert "spark.sql.codegen.wholeStage=false" not in full[name], name


def test_both_streams_run_to_their_end_and_the_first_error_is_raised() -> None:
    ended: list[str] = []

    def failing() -> None:
        raise report.ReportError("part static failed")

    def slower() -> None:
        time.sleep(0.2)
        ended.append("slower")

    with pytest.raises(report.ReportError, match="part static failed"):
        report.both_at_once(failing, slower)
    assert ended == ["slower"], "the other stream ran to its end"


def test_a_malformed_page_is_refused() -> None:
    with pytest.raises(page.PageError, match="needs its <!-- /generated -->"):
        page.replace_regions("<!-- generated: static -->\nno end\n", {})
    twice = "<!-- generated: a -->\n<!-- /generated -->\n" * 2
    with pytest.raises(page.PageError, match="region 'a' appears twice"):
        page.replace_regions(twice, {})
