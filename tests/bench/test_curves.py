"""`wcoj-bench curve`: argument errors, and what a curve's bench counts as wcoj's join rows.

Timings are not asserted. What is: every mistake in a curve's arguments is refused in one line,
before Spark starts; the rows wcoj's engine reports through ``EpochMetrics.join_rows`` are added
to its intermediate rows, and its accumulated output is the oracle's (agreement between methods
is checked by `bench` itself, see `test_bench.py`). The curves run end to end, with both
methods, in `test_report.py` (the report's quick mode).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pytest
from oracle import naive_eval
from pyspark.sql import DataFrame, SparkSession

from wcoj_bench import cli
from wcoj_bench.parts.epochs import bench, make_workload
from wcoj_core.cli import workspace
from wcoj_core.cli.console import EXIT_USAGE
from wcoj_core.engine import Engine, EpochResult
from wcoj_core.generate import generate
from wcoj_core.query.builtins import builtin

TRIANGLES = builtin("triangles")
GRAPH = "rmat:scale=9,edges=3000,seed=5"
CURVE = ["curve"]


def rows(df: DataFrame) -> Counter[tuple[int, ...]]:
    out: Counter[tuple[int, ...]] = Counter()
    for r in df.collect():
        out[tuple(r[:-1])] += r[-1]
    return Counter({k: v for k, v in out.items() if v})


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the CLI gets as far as starting Spark."""

    def refuse(master: str | None) -> SparkSession:
        raise AssertionError("Spark was started although the arguments are invalid")

    monkeypatch.setattr(workspace, "start_spark", refuse)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["sizes", "--input", "edge=rmat:seed=1"],
            "unknown curve 'sizes'; choose size or epoch-size",
        ),
        (
            ["size", "--input", "edge=rmat:seed=1", "--sizes", "1000,abc"],
            "--sizes: 'abc' is not a positive integer",
        ),
        (["size", "--input", "edge=rmat:seed=1", "--sizes", "0,10"], "'0' is not a positive"),
        (["size", "--input", "edge=rmat:seed=1", "--sizes", "5000"], "at least two different"),
        (
            ["size", "--input", "edge=rmat:seed=1", "--sizes", "100,200000", "--epoch-size", "100"],
            "--sizes 100: 4 epochs of 100 changes need a graph of at least 400 edges",
        ),
        (["size", "--input", "edge=rmat:scale=10,seed=1"], "drop scale from rmat:scale=10"),
        (["size", "--input", "edge=rmat:seed=1,edges=9"], "drop edges from rmat:seed=1,edges=9"),
        (
            ["size", "--input", "edge=rmat:seed=1", "--epoch-sizes", "10,100"],
            "--epoch-sizes goes with curve epoch-size",
        ),
        (
            ["epoch-size", "--input", f"edge={GRAPH}", "--epoch-size", "10"],
            "give --epoch-sizes, not --sizes or --epoch-size",
        ),
        (
            ["epoch-size", "--input", f"edge={GRAPH}", "--epoch-sizes", "1,10"],
            "an epoch needs at least 2 changes, got 1",
        ),
        (["size", "--input", "edge=rmat:seed=1", "--static"], "unrecognized arguments: --static"),
        (["size", "--input", "edge=rmat:seed=1", "--epochs", "1"], "at least 2 epochs per point"),
        (
            ["size", "--input", "edge=rmat:seed=1", "--methods", "binary-delta"],
            "compares the other methods with wcoj",
        ),
        (
            ["size", "--input", "edge=rmat:seed=1", "--methods", "wcoj,fast"],
            "unknown methods ['fast']",
        ),
        (["size", "--input", "edge=rmat:seed=1", "--plot", "c.jpg"], "give a path ending in .png"),
    ],
)
def test_curve_arguments_are_refused_in_one_line(
    no_spark: None, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert cli.main([*CURVE, *args, "--undirected", "edge"]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("wcoj-bench: error: "), err
    assert message in err[0]


def test_a_curve_needs_a_generator_for_the_size_curve(
    no_spark: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = tmp_path / "g.txt"
    graph.write_text("1\t2\n")
    assert cli.main([*CURVE, "size", "--input", f"edge={graph}"]) == EXIT_USAGE
    assert "curve size generates its graphs" in capsys.readouterr().err


def test_curve_options_without_a_curve_are_refused(
    no_spark: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["epochs", "--input", f"edge={GRAPH}", "--epochs", "2", "--epoch-size", "10"]
    assert cli.main([*argv, "--sizes", "10,100", "--plot", "p.png"]) == EXIT_USAGE
    assert "unrecognized arguments: --sizes 10,100 --plot p.png" in capsys.readouterr().err


def test_wcoj_lookup_rows_count_as_join_rows_and_its_output_is_the_oracles(
    small: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    edges = generate(small, GRAPH)
    workload = make_workload(
        small,
        TRIANGLES,
        {"edge": edges},
        epochs=3,
        epoch_size=20,
        seed=2,
        undirected=frozenset({"edge"}),
    )
    # Stand in for the kernel's own lookups: every epoch reports LOOKUP rows of its own.
    lookup = 10**9
    original = Engine.apply
    applied: list[int] = []

    def reporting(
        self: Engine, epoch: int, changes: Mapping[str, object], *, replace: bool = False
    ) -> EpochResult:
        applied.append(epoch)
        result = original(self, epoch, changes, replace=replace)
        metrics = dataclasses.replace(result.metrics, join_rows=lookup)
        return dataclasses.replace(result, metrics=metrics)

    monkeypatch.setattr(Engine, "apply", reporting)
    result = bench(small, TRIANGLES, workload, str(tmp_path), methods=["wcoj"])
    report = result.to_dict()
    assert report["check"] == "passed"
    assert applied == [0, 1, 2, 3], "epoch 0 loaded, then the epochs"
    per_epoch = report["methods"]["wcoj"]["intermediate_rows_per_epoch"]
    assert len(per_epoch) == 3 and all(n >= lookup for n in per_epoch)

    final = rows(workload.initial["edge"])
    for t in range(1, 4):
        final.update(rows(workload.changes(t)["edge"]))
    expected = naive_eval(TRIANGLES, {"edge": {e: m for e, m in final.items() if m}})
    engine = Engine(small, str(tmp_path / "wcoj" / "engine"), TRIANGLES, undirected=["edge"])
    assert rows(engine.output("triangles")) == expected
