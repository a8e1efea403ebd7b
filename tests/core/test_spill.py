"""Work beyond the memory budget: sorted runs, k-way merges, mapped layers, and whole epochs
applied under a budget so small that every stage spills, against the naive oracle.

The pieces (`wcoj_core.spill`) are checked against the in-memory functions they stand in for
(`Layer.build`, `arranged`) on random rows, packable and not, with sums that cancel, and with
merges of many runs (fan-in reduced in levels). Then a real graph (email-Eu-core) is applied
epoch by epoch — inserts and deletes, a set and a bag, triangles and 2-paths — by fresh engines
whose every share of the budget is a few kilobytes: landing, the relation's effect, the counts,
the rules' outputs, the arrangements and the batches all go through scratch files, and every
epoch's stored output, figures, relation and counts traces equal the oracle's exactly. No JVM.
"""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import naive_eval

from wcoj_core import indexes
from wcoj_core import spill as spill_module
from wcoj_core.budget import MemoryBudget, Shares
from wcoj_core.engine import Engine
from wcoj_core.errors import MultiplicityOverflow
from wcoj_core.kernel.layer import Layer, arranged
from wcoj_core.meaning import relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.query.plan import AtomView
from wcoj_core.spill import LayerWriter, Scratch, Spill, merge_into

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"

# Every share a few kilobytes: whatever an epoch holds beyond a handful of rows is spilled.
TINY = Shares(
    MemoryBudget(128 << 20),
    8 << 20,
    run_bytes=4096,
    layer_bytes=4096,
    merge_bytes=8192,
    kernel_bytes=1 << 16,
    sink_bytes=2048,
    threads=2,
)


@pytest.fixture()
def scratch(tmp_path: Path):
    s = Scratch(tmp_path / "scratch", lambda _n: None)
    yield s
    s.close()


def tiny(scratch: Scratch) -> Spill:
    return Spill(scratch, run_bytes=2048, layer_bytes=2048, merge_bytes=4096)


def as_pairs(layer: Layer) -> list[tuple[tuple[int, ...], int]]:
    return [
        (tuple(r), d)
        for r, d in zip(
            np.asarray(layer.rows).tolist(), np.asarray(layer.diff).tolist(), strict=True
        )
    ]


def pieces(width: int, big: bool, seed: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`count` pieces of random rows: small values (many equal rows, sums that cancel) or,
    with `big`, values beyond what two columns pack into 64 bits."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(1, 400))
        if big:
            rows = rng.integers(-(2**62), 2**62, size=(n, width))
            rows[::3] = rng.integers(0, 3, size=rows[::3].shape)
        else:
            rows = rng.integers(-3, 40, size=(n, width))
        out.append((rows, rng.choice(np.array([-2, -1, 1, 2]), size=n)))
    return out


@settings(max_examples=30)
@given(
    width=st.integers(0, 3),
    big=st.booleans(),
    seed=st.integers(0, 2**32),
    count=st.integers(1, 12),
)
def test_a_sorter_sums_what_it_is_given_as_layer_build_does(
    tmp_path_factory, width: int, big: bool, seed: int, count: int
) -> None:
    given_pieces = pieces(width, big and width > 0, seed, count)
    s = Scratch(tmp_path_factory.mktemp("scratch"), lambda _n: None)
    try:
        sorter = tiny(s).sorter(width)
        for rows, diff in given_pieces:
            sorter.add(rows, diff)
        got = sorter.layer()
        expected = Layer.build(
            np.concatenate([r for r, _ in given_pieces]),
            np.concatenate([d for _, d in given_pieces]),
        )
        assert as_pairs(got) == as_pairs(expected)
        if len(got) and width:
            probes = np.asarray(expected.rows)[::3]
            assert got.lookup(probes).tolist() == expected.lookup(probes).tolist()
    finally:
        s.close()


def test_many_runs_are_merged_in_levels(scratch: Scratch, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill_module, "MAX_FAN_IN", 3)
    rng = np.random.default_rng(7)
    sorter = tiny(scratch).sorter(2)
    rows = rng.integers(0, 200, size=(20_000, 2))
    diff = rng.choice(np.array([-1, 1, 2]), size=20_000)
    for lo in range(0, 20_000, 500):
        sorter.add(rows[lo : lo + 500], diff[lo : lo + 500])
    assert len(sorter.runs) > 9
    got = sorter.layer()
    assert as_pairs(got) == as_pairs(Layer.build(rows, diff))
    assert isinstance(got.diff, np.memmap)  # larger than the layer share: mapped


def test_a_run_summed_to_a_few_rows_stays_in_memory(scratch: Scratch) -> None:
    """A file repeating one tuple lands as one row, never written out."""
    sorter = tiny(scratch).sorter(2)
    for _ in range(50):
        sorter.add(np.tile([[1, 2]], (1000, 1)), np.ones(1000, dtype=np.int64))
    assert not sorter.runs
    assert as_pairs(sorter.layer()) == [((1, 2), 50_000)]
    assert scratch.spilled == 0


def test_a_merge_raises_an_overflow_naming_the_row(scratch: Scratch) -> None:
    a = Layer.build(np.array([[1, 2], [3, 4]]), np.array([2**62, 1]))
    b = Layer.build(np.array([[1, 2]]), np.array([2**62]))
    with pytest.raises(MultiplicityOverflow, match=r"\(1, 2\)"):
        merge_into(scratch, [a, b], 2, 0, 64)


def test_a_layer_written_in_chunks_is_searched_like_one_built_whole(scratch: Scratch) -> None:
    rng = np.random.default_rng(1)
    whole = Layer.build(rng.integers(0, 10_000, size=(30_000, 3)), np.ones(30_000, dtype=np.int64))
    out = LayerWriter(scratch, 3, whole.packing, limit=1024)
    for lo in range(0, len(whole), 4096):
        out.add(np.asarray(whole.rows[lo : lo + 4096]), np.asarray(whole.diff[lo : lo + 4096]))
    mapped = out.finish()
    assert isinstance(mapped.rows, np.memmap) and mapped.unit
    probes = np.asarray(whole.rows)[::7]
    assert mapped.lookup(probes).tolist() == [1] * len(probes)
    assert mapped.lookup(probes + 20_000).tolist() == [0] * len(probes)
    lo, hi = mapped.ranges(np.asarray(whole.rows)[:50, :1])
    wlo, whi = whole.ranges(np.asarray(whole.rows)[:50, :1])
    assert lo.tolist() == wlo.tolist() and hi.tolist() == whi.tolist()


@pytest.mark.parametrize("pattern", [None, (0, 0, 1), (0, 1, 2)])
def test_a_large_layer_is_arranged_in_runs(scratch: Scratch, pattern) -> None:
    rng = np.random.default_rng(2)
    rows = rng.integers(0, 30, size=(5_000, 3))
    rows[::4, 1] = rows[::4, 0]  # some rows with a repeated value, for the view (0, 0, 1)
    layer = Layer.build(rows, rng.choice(np.array([-1, 1, 3]), size=5_000))
    view = None if pattern is None else AtomView("r", pattern)
    order = (2, 0, 1) if pattern != (0, 0, 1) else (1, 0)
    got = tiny(scratch).arranged(layer, view, order)
    assert as_pairs(got) == as_pairs(arranged(layer, view, order))
    assert scratch.spilled > 0


def test_a_large_symmetric_layer_is_its_own_reversed_arrangement(scratch: Scratch) -> None:
    """A change marked `symmetric` (every edge in both directions, one diff: an undirected
    relation's) is its own view with the columns swapped, however large: nothing is sorted or
    spilled for it — the reversed view of a first load's whole graph was sorted in runs by every
    task (and the driver) before. An unmarked layer of the same rows is still arranged in runs."""
    rng = np.random.default_rng(4)
    half = rng.integers(0, 500, size=(4_000, 2))
    half = half[half[:, 0] != half[:, 1]]
    both = np.concatenate([half, half[:, ::-1]])
    layer = Layer.build(both, np.ones(len(both), dtype=np.int64))
    assert tiny(scratch).arranged(layer.mirrored(), None, (1, 0)) is layer
    assert scratch.spilled == 0
    plain = Layer.build(both, np.ones(len(both), dtype=np.int64))
    got = tiny(scratch).arranged(plain, None, (1, 0))
    assert as_pairs(got) == as_pairs(arranged(plain, None, (1, 0))) == as_pairs(layer)
    assert scratch.spilled > 0


# -- whole epochs under a tiny budget ---------------------------------------------------------


def graph_epochs() -> list[list[tuple[tuple[int, int], int]]]:
    """email-Eu-core's first 6,000 edge lines (shuffled) as three epochs of inserts, the third
    also deleting 500 of the first's edges (some named in the other direction)."""
    with gzip.open(DATA / "email-Eu-core.txt.gz", "rt") as f:
        edges = np.array([[int(v) for v in line.split()] for line in f])
    rng = np.random.default_rng(3)
    rng.shuffle(edges)
    edges = edges[:6000]
    parts = np.array_split(edges, 3)
    epochs = [[((int(a), int(b)), 1) for a, b in part] for part in parts]
    epochs[2] += [
        ((int(b), int(a)) if i % 2 else (int(a), int(b)), -1)
        for i, (a, b) in enumerate(edges[:500])
    ]
    return epochs


def table(ups: list[tuple[tuple[int, int], int]]) -> pa.Table:
    return pa.table(
        {
            "c0": pa.array([t[0] for t, _ in ups], pa.int64()),
            "c1": pa.array([t[1] for t, _ in ups], pa.int64()),
            "diff": pa.array([d for _, d in ups], pa.int64()),
        }
    )


def stored(engine: Engine, name: str, time: int) -> Counter[tuple[int, ...]]:
    trace = engine.store.current().trace(name)
    total: Counter[tuple[int, ...]] = Counter()
    for b in trace.batches if trace is not None else ():
        if b.time <= time:
            layer = engine.read_batch(trace, b)
            for row, d in zip(layer.rows.tolist(), layer.diff.tolist(), strict=True):
                total[tuple(row)] += d
    return Counter({k: v for k, v in total.items() if v})


@pytest.mark.parametrize(("query", "meaning"), [("triangles", "set"), ("2-paths", "bag")])
def test_every_stage_spills_and_every_epoch_matches_the_oracle(
    tmp_path: Path, query: str, meaning: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every epoch merges its change into the base arrangement (a merge of mapped segments).
    monkeypatch.setattr(indexes, "MERGE_MIN_ROWS", 0)
    monkeypatch.setattr(indexes, "MERGE_SHARE", 0.0)
    q = builtin(query)
    specs = relation_specs(
        q.relations, undirected=["edge"], bags=["edge"] if meaning == "bag" else []
    )
    held: Counter[tuple[int, int]] = Counter()  # the relation as the oracle holds it
    spilled: dict[str, int] = {}
    for t, ups in enumerate(graph_epochs()):
        landed: Counter[tuple[int, int]] = Counter()
        for (a, b), d in ups:
            if a != b:
                landed[(a, b)] += d
                landed[(b, a)] += d
        if meaning == "set":
            for edge, s in landed.items():
                if s:
                    held[edge] = 1 if s > 0 else 0
        else:
            held.update(landed)
        engine = Engine(
            None, str(tmp_path / "state"), q, relations=specs, shares=TINY, compact_every=1
        )  # history compacted as it goes: batches summed through sorted runs too
        result = engine.apply(t, {"edge": table(ups)})
        stages = result.metrics.memory.stages  # type: ignore[union-attr]
        assert stages.get("land", 0) > 0 and stages.get("rules", 0) > 0, stages
        for phase, n in stages.items():
            spilled[phase] = spilled.get(phase, 0) + n
        relation = {e: m for e, m in held.items() if m}
        expected = naive_eval(q, {"edge": relation})
        out = f"out/{q.name}"
        assert stored(engine, out, t) == expected, f"epoch {t}"
        assert stored(engine, "rel/edge", t) == Counter(relation), f"epoch {t}"
        rows, count = len(expected), sum(expected.values())
        negative = sum(1 for v in expected.values() if v < 0)
        assert engine.figures(out) == (rows, count, negative), f"epoch {t}"
        degrees = Counter(a for (a, _), m in relation.items() if m)
        for name in engine.served.counts_traces:
            got = stored(engine, name, t)
            if name.endswith("/0") or name.endswith("/1"):
                assert got == Counter({(v,): n for v, n in degrees.items()}), name
        assert not (tmp_path / "state" / "scratch").exists() or not any(
            (tmp_path / "state" / "scratch").iterdir()
        ), "the scratch folder is removed after each epoch"
    # The arrangements' merges of the later epochs spilled too.
    assert spilled.get("write", 0) > 0, spilled


def test_a_missing_index_is_rebuilt_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An epoch that finds its relation's arrangement files gone rebuilds them from the batches
    a record batch at a time through sorted runs (`indexes.Streamed`), never a batch read whole,
    and its answer is the oracle's."""
    whole_reads: list[str] = []
    signed = indexes._signed

    def watched(trace, plus, minus, read_batch, opened):  # type: ignore[no-untyped-def]
        whole_reads.extend(b.path for b in (*plus, *minus))
        return signed(trace, plus, minus, read_batch, opened)

    monkeypatch.setattr(indexes, "_signed", watched)
    q = builtin("triangles")
    specs = relation_specs(q.relations, undirected=["edge"])
    state = tmp_path / "state"
    epochs = graph_epochs()
    held: Counter[tuple[int, int]] = Counter()
    for t, ups in enumerate(epochs):
        landed: Counter[tuple[int, int]] = Counter()
        for (a, b), d in ups:
            if a != b:
                landed[(a, b)] += d
                landed[(b, a)] += d
        for edge, s in landed.items():
            if s:
                held[edge] = 1 if s > 0 else 0
        if t == 2:  # every arrangement file of the relation gone
            for folder in (state / "arrangements").glob("rel-edge-*"):
                for f in folder.rglob("*"):
                    if f.is_file():
                        f.unlink()
        engine = Engine(None, str(state), q, relations=specs, shares=TINY)
        result = engine.apply(t, {"edge": table(ups)})
        if t == 2:
            assert any(r.startswith("rel/edge") for r in result.metrics.rebuilt), result.metrics
            stages = result.metrics.memory.stages  # type: ignore[union-attr]
            assert stages.get("open", 0) > 0, stages  # the rebuild spilled
            assert whole_reads == [], whole_reads
        relation = {e: m for e, m in held.items() if m}
        assert stored(engine, f"out/{q.name}", t) == naive_eval(q, {"edge": relation}), t
        assert stored(engine, "rel/edge", t) == Counter(relation), t
    # The next epoch opens the rebuilt arrangements as they were persisted: nothing rebuilt.
    again = Engine(None, str(state), q, relations=specs, shares=TINY)
    assert again.evaluate({"edge": table([((1, 2), 1)])}).metrics.rebuilt == ()
