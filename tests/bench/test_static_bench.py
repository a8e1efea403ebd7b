"""`wcoj-bench static`: every method counts the oracle's triangles, disagreement stops it.

Timings are not asserted (benchmarks measure, tests check). What is asserted: on one small graph
every method — wcoj, the Spark SQL binary plan, the neighbour-array intersection, DuckDB, Kùzu,
scipy, the peer C counter tc, and `wcoj count` run as a baseline program — reports the triangle
count of the naive oracle; a method whose count differs stops the benchmark before anything is
reported; the triangle-only methods refuse other queries (and a relation not read as
undirected); tc, built once into a cache, counts what the oracle counts (ids beyond uint32
relabelled), and without a C compiler it is skipped with its reason while the others run; the
command's JSON carries the figures it promises.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from oracle import naive_eval
from pyspark.sql import SparkSession

from wcoj_bench import cli
from wcoj_bench.infra import peer
from wcoj_bench.parts import static as static_bench
from wcoj_bench.parts.epochs import BenchError
from wcoj_bench.parts.static import STATIC_METHODS, Runner, StaticInputs, check_methods
from wcoj_core.generate import generate
from wcoj_core.query.builtins import builtin
from wcoj_core.query.parse import parse_query

WARMED = {static_bench.Runtime.SPARK, static_bench.Runtime.PROCESS}  # methods given a warm-up run

TRIANGLES = builtin("triangles")
GRAPH = "rmat:scale=9,edges=3000,seed=3"


@pytest.fixture(scope="module")
def oracle(spark: SparkSession) -> int:
    """The naive oracle's triangle count of GRAPH read as undirected (symmetric, loop-free)."""
    edges: dict[tuple[int, ...], int] = {}
    for r in generate(spark, GRAPH).collect():
        if r["c0"] != r["c1"]:
            edges[(r["c0"], r["c1"])] = edges[(r["c1"], r["c0"])] = 1
    count = sum(naive_eval(TRIANGLES, {"edge": edges}).values())
    assert count > 100, "the graph should have enough triangles to tell methods apart"
    return count


def test_every_method_counts_the_oracles_triangles(
    small: SparkSession, oracle: int, capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli.main(
        [
            *["static", "--input", f"edge={GRAPH}", "--undirected", "edge"],
            *["--repeat", "1", "--json"],
            # The baseline method: this checkout's own program, as another checkout's would run.
            *["--methods", ",".join(STATIC_METHODS)],
            *["--baseline-wcoj", str(Path(sys.executable).parent / "wcoj")],
        ]
    )
    out = capsys.readouterr().out.strip().splitlines()
    assert status == 0, out
    report = json.loads(out[-1])
    assert report["command"] == "bench" and report["mode"] == "static"
    assert report["check"] == "passed" and report["count"] == oracle
    assert set(report["methods"]) == set(STATIC_METHODS) and report["skipped"] == {}
    for name, m in report["methods"].items():
        assert m["count"] == oracle, name
        assert len(m["seconds"]) == 1 and m["median_seconds"] >= 0
        runtime = STATIC_METHODS[name].runtime
        spark_method = runtime is static_bench.Runtime.SPARK
        assert (m["join_rows"] is not None and m["join_rows"] > 0) == spark_method, name
        assert (m["warm_up_seconds"] is not None) == (runtime in WARMED), name
    assert report["methods"]["wcoj"]["ratio_to_wcoj"] == 1.0
    # `wcoj` counts as `wcoj count` does (nothing kept, no commit); `wcoj-apply` applies the
    # graph as a first load does, its batches written and committed.
    assert set(report["methods"]["wcoj"]["phases"]) >= {"open", "land", "rules", "write"}
    assert "commit" not in report["methods"]["wcoj"]["phases"]
    phases = set(report["methods"]["wcoj-apply"]["phases"])
    assert phases >= {"open", "land", "rules", "write", "commit"}
    assert report["methods"]["wcoj"]["deployments"] == ["driver"]
    for key in ("speedup_vs_spark_sql", "speedup_vs_neighbour_array", "count_seconds_over_tc"):
        assert report[key] > 0
    assert report["undirected_edges"] * 2 == report["input_rows"]["edge"]
    # One flushed progress line per run, warm-ups included, before the summary.
    progress = [line for line in out if " run 1/1: " in line or " warm-up: " in line]
    warmed = sum(m.runtime in WARMED for m in STATIC_METHODS.values())
    assert len(progress) == len(STATIC_METHODS) + warmed
    assert all(f"count {oracle}" in line for line in progress)


def test_a_method_that_disagrees_stops_the_benchmark(
    small: SparkSession, oracle: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # wcoj is stood in for by the oracle's count (its own agreement is the test above).
    def right(_inputs: StaticInputs) -> Runner:
        return Runner(lambda: oracle)

    def wrong(inputs: StaticInputs) -> Runner:
        honest = static_bench.PREPARE["duckdb"](inputs)
        return Runner(lambda: honest.run() - 1, close=honest.close)

    monkeypatch.setitem(static_bench.PREPARE, "wcoj", right)
    monkeypatch.setitem(static_bench.PREPARE, "scipy", wrong)
    seen: list[str] = []
    with pytest.raises(
        BenchError, match=f"scipy counted {oracle - 1} .*wcoj counted {oracle}; nothing"
    ):
        static_bench.static_bench(
            small,
            TRIANGLES,
            {"edge": generate(small, GRAPH)},
            str(tmp_path),
            undirected=frozenset({"edge"}),
            methods=["wcoj", "duckdb", "scipy"],
            repeat=1,
            on_run=lambda run: seen.append(run.method),
        )
    assert "scipy" not in seen, "a disagreeing run is not reported"
    assert "duckdb" in seen


@pytest.mark.parametrize(
    ("query", "undirected", "message"),
    [
        (builtin("4-cycles"), {"edge"}, "query cycles4 is not that; run this query with"),
        (builtin("directed-triangles"), {"edge"}, "is not that; run this query with --methods"),
        (TRIANGLES, set(), "read relation 'edge' with --undirected"),
    ],
)
def test_triangle_only_methods_refuse_other_queries(
    query: object, undirected: set[str], message: str
) -> None:
    with pytest.raises(BenchError, match="neighbour-array, kuzu count undirected triangles only"):
        check_methods(["wcoj", "neighbour-array", "kuzu"], query, frozenset(undirected))  # type: ignore[arg-type]
    with pytest.raises(BenchError, match=message):
        check_methods(["wcoj", "scipy"], query, frozenset(undirected))  # type: ignore[arg-type]
    assert check_methods(["wcoj", "spark-sql"], query, frozenset(undirected))  # type: ignore[arg-type]


def test_the_triangle_query_is_recognised_up_to_renaming() -> None:
    renamed = parse_query("t(x, y, z) :- g(y, z), g(x, y), g(x, z), y < z, x < y")
    assert check_methods(["wcoj", "duckdb"], renamed, frozenset({"g"})) == ("wcoj", "duckdb")
    with pytest.raises(BenchError, match="include it"):
        check_methods(["duckdb"], TRIANGLES, frozenset({"edge"}))
    with pytest.raises(BenchError, match="unknown static methods"):
        check_methods(["wcoj", "networkx"], TRIANGLES, frozenset({"edge"}))


def test_the_command_refuses_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["static", "--input", f"edge={GRAPH}", "--undirected", "edge"]
    assert cli.main([*base, "--query", "4-cycles", "--methods", "wcoj,duckdb"]) == 2
    assert cli.main([*base, "--epochs", "3"]) == 2
    assert cli.main([*base, "--repeat", "0"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(e.startswith("wcoj-bench: error: ") for e in errors)
    assert "duckdb count undirected triangles only" in errors[0]
    assert "unrecognized arguments: --epochs 3" in errors[1]
    assert "--repeat must be at least 1" in errors[2]


def test_tc_counts_the_oracles_triangles_on_any_ids(tmp_path: Path) -> None:
    # Two 4-cliques sharing vertex 7 (8 triangles) and edge 3 9, ids negative and past uint32.
    big = 2**32 + 5
    cliques = [(a, b) for k in ((-2, 1, 3, 7), (7, 9, 11, big)) for a in k for b in k if a < b]
    edges = {(a, b): 1 for a, b in [*cliques, (3, 9)]}
    symmetric = {**edges, **{(b, a): 1 for a, b in edges}}
    expected = sum(naive_eval(TRIANGLES, {"edge": symmetric}).values())
    assert expected == 9  # the two cliques' 8, and 3 7 9
    src, dst = (np.array(c, dtype=np.int64) for c in zip(*edges, strict=True))
    program = peer.build_tc(cache=tmp_path / "cache")
    assert peer.build_tc(cache=tmp_path / "cache") == program  # built once, then reused
    peer.write_pairs(src, dst, tmp_path / "edges.u32")
    pairs = np.fromfile(tmp_path / "edges.u32", dtype="<u4").reshape(-1, 2)
    assert len(pairs) == len(edges) and bool((pairs[:, 0] < pairs[:, 1]).all())
    assert peer.run_tc(program, tmp_path / "edges.u32") == expected


def test_tc_without_a_compiler_is_skipped_with_its_reason(
    small: SparkSession, oracle: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peer.shutil, "which", lambda _name: None)
    result = static_bench.static_bench(
        small,
        TRIANGLES,
        {"edge": generate(small, GRAPH)},
        str(tmp_path),
        undirected=frozenset({"edge"}),
        methods=["wcoj", "tc", "scipy"],
        repeat=1,
    )
    assert result.skipped == {"tc": "no C compiler (cc or gcc) on PATH"}
    assert set(result.methods) == {"wcoj", "scipy"} and result.count == oracle
    assert "count_seconds_over_tc" not in result.to_dict()
