"""Hub bursts within a memory budget: cliques maintained, then one epoch joining a new vertex
to every vertex of the graph (every (k-1)-clique becomes a k-clique), each epoch a whole
``wcoj apply --memory 1g`` process whose tree's peak anonymous memory stays within 1.1 GB,
its counts exact against an independent clique count (`wcoj_bench.infra.probes.count_cliques`)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from wcoj_bench.infra.measure import run_process
from wcoj_bench.infra.prepared import wcoj_command
from wcoj_bench.infra.probes import count_cliques

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
BUDGET = "1g"
PEAK = 1.1e9  # bytes: the tree's anonymous memory, sampled


def clique_query(k: int) -> str:
    """The k-cliques of ``edge``, each once with its vertices in increasing order.

    >>> clique_query(3)
    'cliques3(a, b, c) :- edge(a, b), edge(a, c), edge(b, c), a < b, b < c'
    """
    vs = "abcdefgh"[:k]
    atoms = [f"edge({vs[i]}, {vs[j]})" for i in range(k) for j in range(i + 1, k)]
    order = [f"{vs[i]} < {vs[i + 1]}" for i in range(k - 1)]
    return f"cliques{k}({', '.join(vs)}) :- " + ", ".join(atoms + order)


def apply(state: Path, epoch: int, changes: Path, k: int) -> dict:
    argv = [*wcoj_command(), "apply", "--query", clique_query(k), "--state", str(state)]
    argv += ["--epoch", str(epoch), "--changes", f"edge={changes}", "--undirected", "edge"]
    run = run_process([*argv, "--memory", BUDGET, "--json"], interval=0.02, cap=int(4e9))
    assert run.tree_anon_bytes <= PEAK, f"epoch {epoch}: {run.tree_anon_bytes:,} bytes"
    return run.result


@pytest.mark.slow
@pytest.mark.parametrize(
    ("graph", "k"),
    [("facebook_combined", 4), ("email-Eu-core", 5), ("email-Eu-core", 6)],
)
def test_a_hub_burst_stays_within_the_budget_and_is_exact(
    tmp_path: Path, graph: str, k: int
) -> None:
    source = DATA / f"{graph}.txt.gz"
    with gzip.open(source, "rt") as f:
        edges = [tuple(map(int, line.split())) for line in f if not line.startswith("#")]
    before = count_cliques(edges, k)
    gained = count_cliques(edges, k - 1)  # with the hub, every (k-1)-clique is a k-clique
    state = tmp_path / "state"
    first = apply(state, 0, source, k)
    assert first["count"] == before
    hub = max(max(e) for e in edges) + 1
    vertices = sorted({v for e in edges for v in e})
    burst = tmp_path / "hub.csv"
    burst.write_text("c0,c1,diff\n" + "".join(f"{hub},{v},1\n" for v in vertices))
    second = apply(state, 1, burst, k)
    assert second["change_total"] == gained
    assert second["count"] == before + gained
