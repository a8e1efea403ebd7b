"""Issue 27's cases, re-run as written: readers trust the manifest, figures stay true, the
planner stays bounded, every message says what happened.

W1 readers read exactly the files a manifest lists (checked); W2 a bag query's figures; W3 an
``--output`` never lands inside a state; W4 a forged row count changes no answer and ``wcoj
verify`` names it; H1 planning a huge query is bounded; T1-T3 and U1-U4 one line that says
what happened and what was kept; the minor cases. Commands run in a subprocess (the installed
``wcoj`` script) unless the case is about a library call.
"""

from __future__ import annotations

import gzip
import resource
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from reliability_support import (
    WCOJ,
    Done,
    History,
    apply_json,
    batch_file,
    build_state,
    committed_epoch,
    current_manifest,
    edit_manifest,
    exact,
    figures,
    fill,
    flip,
    hashes,
    manifest_files,
    one_line_error,
    run_wcoj,
    segment_file,
    signal_when,
    small_file_system,
    small_history,
    start_wcoj,
    write_changes,
)

from wcoj_core.engine import Engine
from wcoj_core.errors import DamagedBatch
from wcoj_core.query.builtins import builtin
from wcoj_core.state_read import change_table, read_table
from wcoj_core.store.manifest import FORMAT

TRIANGLES = builtin("triangles")


def as_counter(table) -> Counter[tuple[int, ...]]:  # a pyarrow table (c0.., diff)
    cols = [c for c in table.column_names if c != "diff"]
    rows = zip(*(table.column(c).to_pylist() for c in cols), strict=True)
    return Counter(dict(zip(rows, table.column("diff").to_pylist(), strict=True)))


def engine_over(state: Path, spark=None) -> Engine:
    return Engine(spark, str(state), TRIANGLES, undirected=["edge"], create=False)


# -- W1: readers read exactly the files the manifest lists ---------------------------------------


def copied_into_the_batch_folder(state: Path, trace: str, t: int) -> Path:
    """W1's damage: a copy of a batch's file beside it, under a name no manifest lists."""
    source = batch_file(state, trace, t)
    copy = source.with_name(source.name.replace(".snappy.parquet", " (copy).snappy.parquet"))
    shutil.copyfile(source, copy)
    return copy


def test_w1_a_copied_file_in_a_batch_folder_is_not_read_and_verify_names_it(
    history: History, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    build_state(history, state, 2)
    copy = copied_into_the_batch_folder(state, "out/triangles", 1)
    engine = engine_over(state)
    assert as_counter(read_table(engine, "out/triangles", 2)) == history.answer(2)
    assert as_counter(read_table(engine, "out/triangles", 1)) == history.answer(1)
    change = as_counter(change_table(engine, "out/triangles", 1))
    expected = history.answer(1)
    expected.subtract(history.answer(0))
    assert change == Counter({k: v for k, v in expected.items() if v})
    done = run_wcoj("verify", state)
    assert done.code == 1, done.out
    rel = copy.relative_to(state)
    assert f"damaged: {rel} (trace out/triangles): a file the manifest does not list" in done.out
    assert "verify: 1 damaged" in done.out


def test_w1_a_flipped_byte_is_refused_by_every_reader(history: History, tmp_path: Path) -> None:
    state = tmp_path / "state"
    build_state(history, state, 2)
    target = batch_file(state, "out/triangles", 1)
    flip(target, int(target.stat().st_size * 0.7))
    engine = engine_over(state)
    for read in (
        lambda: read_table(engine, "out/triangles", 2),
        lambda: change_table(engine, "out/triangles", 1),
        lambda: engine.change("triangles", 1),
    ):
        with pytest.raises(DamagedBatch, match="its contents do not match its digest") as e:
            read()
        assert str(target) in str(e.value) and "\n" not in str(e.value)
    assert engine.batches.checked_uris  # the Spark readers check the same way: see the spark test


@pytest.mark.spark
def test_w1_spark_readers_read_only_listed_files_checked(
    history: History, tmp_path: Path, spark
) -> None:
    """`Engine.output`, `Engine.relation`, `changes_at` and the Dagster IO manager's
    `read_output`: a copied file is not read; a flipped byte is refused naming the file."""
    from wcoj_assets.outputs import read_output
    from wcoj_core.state_read import changes_at

    state = tmp_path / "state"
    build_state(history, state, 2)
    copied_into_the_batch_folder(state, "out/triangles", 1)
    copied_into_the_batch_folder(state, "rel/edge", 1)
    engine = engine_over(state, spark)

    def counter(df) -> Counter[tuple[int, ...]]:
        cols = [c for c in df.columns if c != "diff"]
        return Counter({tuple(r[c] for c in cols): r["diff"] for r in df.collect()})

    assert counter(engine.output("triangles", 2)) == history.answer(2)
    assert counter(read_output(engine, TRIANGLES, 2)) == history.answer(2)
    assert counter(engine.relation("edge", 1)) == history.graph(1)
    change = counter(changes_at(engine, "out/triangles", 1))
    assert change == as_counter(change_table(engine, "out/triangles", 1))
    target = batch_file(state, "out/triangles", 1)
    flip(target, int(target.stat().st_size * 0.7))
    with pytest.raises(DamagedBatch, match=r"its sha256 .* differs from the manifest's"):
        engine.output("triangles", 2)
    with pytest.raises(DamagedBatch):
        read_output(engine, TRIANGLES, 1, change=True)


# -- W2: a bag query's figures -------------------------------------------------------------------


def test_w2_a_bag_querys_figures_are_exact_as_written(tmp_path: Path) -> None:
    e0 = write_changes(
        tmp_path / "e0.csv", [(280, 556, 1), (162, 427, 1), (278, 280, 1), (427, 460, 1)]
    )
    e1 = write_changes(tmp_path / "e1.csv", [(162, 427, -1)])
    state = tmp_path / "s"
    for t, f in enumerate((e0, e1)):
        done = run_wcoj(
            "apply", "--query", "2-paths", "--bag", "edge", "--state", state,
            "--epoch", t, "--changes", f"edge={f}", "--json",
        )  # fmt: skip
        assert done.code == 0, done.err
    assert (done.payload["rows"], done.payload["count"]) == (1, 1)
    assert figures(state, "out/paths2") == (1, 1, 0)


def test_w2_bag_figures_over_epochs_match_the_oracle(tmp_path: Path) -> None:
    """Five epochs of a directed bag (repeats, deletions) with `2-paths`: every epoch's figures
    (distinct tuples, count, negative tuples) equal the naive oracle's."""
    import random

    from oracle import naive_eval

    rng = random.Random(5)
    held: Counter[tuple[int, ...]] = Counter()
    state = tmp_path / "s"
    query = builtin("2-paths")
    for t in range(5):
        rows = [(rng.randrange(30), rng.randrange(30), rng.choice((1, 1, 2))) for _ in range(60)]
        present = sorted(k for k, v in held.items() if v > 0)
        rows += [(a, b, -1) for a, b in rng.sample(present, min(10, len(present)))]
        f = write_changes(tmp_path / f"e{t}.csv", rows)
        done = run_wcoj(
            "apply", "--query", "2-paths", "--bag", "edge", "--state", state,
            "--epoch", t, "--changes", f"edge={f}", "--json",
        )  # fmt: skip
        assert done.code == 0, done.err
        for a, b, d in rows:
            held[(a, b)] += d
        out = naive_eval(query, {"edge": Counter({k: v for k, v in held.items() if v})})
        want = (len(out), sum(out.values()), sum(v < 0 for v in out.values()))
        assert figures(state, "out/paths2") == want, t
        assert (done.payload["rows"], done.payload["count"]) == want[:2]


# -- W4: a forged row count ------------------------------------------------------------------------


def test_w4_forged_row_counts_change_no_answer_and_verify_names_them(tmp_path: Path) -> None:
    history = small_history(epochs=4).write(tmp_path / "in")
    state = tmp_path / "state"
    build_state(history, state, 2)

    def forge(m: dict) -> None:
        for b in m["traces"]["rel/edge"]["batches"]:
            b["rows"] = 0

    edit_manifest(current_manifest(state), forge, redigest=True)
    done = run_wcoj("verify", state)
    assert done.code == 1
    assert "its files hold 180 rows, the manifest says 0" in done.out, done.out
    exact(apply_json(history, state, 3), history, 3, state)
    # A read of a batch checks its rows: the correction of epoch 1 reads epoch 1 and later.
    fix = write_changes(tmp_path / "fix1.csv", [(1, 4, 1)])
    done = run_wcoj(
        "apply", "--query", "triangles", "--state", state, "--epoch", 1, "--replace",
        "--changes", f"edge={fix}", "--undirected", "edge",
    )  # fmt: skip
    assert done.code == 2 and "the manifest says 0" in done.err, done.err


# -- W3: nothing a command writes as a user's output lands inside a state ---------------------------


def test_w3_output_is_never_written_inside_a_state(history: History, tmp_path: Path) -> None:
    state = tmp_path / "state"
    build_state(history, state, 2)
    other = tmp_path / "other"
    build_state(history, other, 0)
    batch = batch_file(state, "rel/edge", 0)
    before = hashes(state), hashes(other)
    for target, extra in (
        (batch, ["--force"]),  # as written: a relation batch, replaced
        (batch.parent / "new.parquet", []),  # a new file in a batch folder
        (state / "change.csv", []),
        (state / "traces" / "mine.csv", ["--force"]),
        (other / "change.csv", []),  # another state
    ):
        done = run_wcoj(*history.apply_args(state, 3, "--output", target, *extra))
        one_line_error(done, f"--output {target}: is inside the state", "write it outside")
    link = tmp_path / "link"
    link.symlink_to(state / "traces")
    done = run_wcoj(*history.apply_args(state, 3, "--output", link / "x.csv"))
    one_line_error(done, "is inside the state")
    (tmp_path / "new").mkdir()  # an empty --state of a `count`
    done = run_wcoj(
        "count", "--query", "triangles", "--input", f"edge={history.files[0]}",
        "--undirected", "edge", "--state", tmp_path / "new", "--output", tmp_path / "new" / "t.csv",
    )  # fmt: skip
    one_line_error(done, "is inside the state")
    assert (hashes(state), hashes(other)) == before
    assert run_wcoj("verify", state).code == 0


# -- T1-T3: one line that says what happened and what was kept ---------------------------------------


def test_t1_a_full_disk_while_writing_output_says_the_epoch_was_applied(
    history: History, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    build_state(history, state, 2)
    with small_file_system(tmp_path / "disk", "1m") as disk:
        fill(disk)
        target = disk / "change.parquet"
        done = run_wcoj(*history.apply_args(state, 3, "--output", target))
        assert done.code == 2 and "Traceback" not in done.err, done.err
        (line,) = done.errors  # after the epoch's warnings (self-loops, ignored changes)
        for said in (
            "epoch 3 was applied (generation 4), but --output",
            "No space left on device",
            "nothing was written there",
        ):
            assert said in line, line
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]
    assert committed_epoch(state) == 3
    assert figures(state, "out/triangles")[1] == history.count(3)


def big_epoch(folder: Path, edges: int = 300_000, vertices: int = 20_000) -> Path:
    """One epoch of random undirected edges, large enough that the rules run on threads."""
    rng = np.random.default_rng(3)
    pairs = rng.integers(0, vertices, (edges, 2))
    pairs = np.unique(np.sort(pairs[pairs[:, 0] != pairs[:, 1]], axis=1), axis=0)
    return write_changes(folder / "big.csv", ((int(a), int(b), 1) for a, b in pairs))


def test_t2_three_ctrl_c_in_the_threaded_rules_phase_are_one_line(tmp_path: Path) -> None:
    """Ctrl-C three times within 20 ms while the rules run on threads: the line that says the
    epoch was not applied, exit 130, no traceback; the state as it was (none: it was new)."""
    changes = big_epoch(tmp_path)

    def argv(state: Path) -> list[str]:
        return [
            *["apply", "--query", "triangles", "--state", str(state), "--epoch", "0"],
            *["--changes", f"edge={changes}", "--undirected", "edge", "--json"],
        ]

    started = time.monotonic()
    trial = run_wcoj(*argv(tmp_path / "trial"))
    wall = time.monotonic() - started
    assert trial.code == 0, trial.err
    seconds = trial.payload["metrics"]["seconds"]
    assert trial.payload["metrics"]["deployment"] == "driver"
    end = wall - seconds["write"] - seconds["commit"]
    for share in (0.25, 0.5, 0.75):
        state = tmp_path / f"state-{share}"
        proc = start_wcoj(*argv(state))
        time.sleep(max(0.0, end - (1 - share) * seconds["rules"]))
        for _ in range(3):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.007)
        out, err = proc.communicate(timeout=300)
        if proc.returncode == 0:
            continue  # the signals came after the report: nothing to check
        line = one_line_error(Done(proc.returncode, out, err), code=130)
        # On a loaded machine the signals may land while Python still imports (before the
        # epoch is named): still one line, saying nothing was applied.
        assert "interrupted" in line, line
        assert "epoch 0" in line or "nothing was applied" in line, line
        if "was not applied" in line:
            assert not state.exists(), "a new state left behind by an interrupted first epoch"


def under_memory_cap(cap_gib: float, *argv: str | Path) -> Done:
    """The ``wcoj`` command with its address space capped (`RLIMIT_AS`): it runs out of
    memory as a cgroup would stop it, but as a `MemoryError` it can report."""

    def limit() -> None:
        cap = int(cap_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    done = subprocess.run(
        [str(WCOJ), *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
        check=False,
    )
    return Done(done.returncode, done.stdout, done.stderr)


@pytest.mark.slow
def test_t3_running_out_of_memory_is_one_line(shared_data: Path, tmp_path: Path) -> None:
    """A product of two copies of email-Eu-core (650 M bindings) under an address-space cap.
    `count` takes its default memory budget from the cap (a quarter of it) and counts within
    it, exactly; `apply`, which must write all 650 M tuples, runs out of address space under a
    1 GiB cap (its spilled runs are mapped) and ends in one line saying so and what was kept."""
    edges = shared_data / "email-Eu-core.txt.gz"
    with gzip.open(edges, "rt") as f:
        pairs = {tuple(line.split()) for line in f if line.strip() and not line.startswith("#")}
    query = "p(a, b, c, d) :- edge(a, b), edge(c, d)"
    done = under_memory_cap(2, "count", "--query", query, "--input", f"edge={edges}")
    assert done.code == 0, done.err[-3000:]
    assert f"count: {len(pairs) ** 2} " in done.out, done.out
    assert "of 512.0 MiB" in done.out  # the budget: a quarter of the 2 GiB cap
    state = tmp_path / "state"
    done = under_memory_cap(
        1, "apply", "--query", query, "--state", state, "--epoch", 0, "--changes", f"edge={edges}"
    )
    one_line_error(done, "out of memory", "epoch 0 was not applied; the state is as it was", code=1)
    assert not state.exists()


# -- U1-U4 ---------------------------------------------------------------------------------------------


def test_u1_verify_repair_interrupted_after_its_commit_says_so(
    history: History, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    build_state(history, state, 2)
    flip(segment_file(state, "rel/edge", level="base"), 130, 0x01)
    gens = len(manifest_files(state))
    proc, _, err = signal_when(
        state, ["verify", str(state), "--repair"], "manifest-committed", signal.SIGINT
    )
    lines = [line for line in err.splitlines() if line.startswith("wcoj: error:")]
    assert "Traceback" not in err, err
    if proc.returncode == 130:
        (line,) = lines
        assert "interrupted after the repair was committed (generation" in line, line
    else:  # the signal came after the report: the repair was reported done
        assert proc.returncode == 0 and "rebuilt the arrangements of rel/edge" in err, err
    assert len(manifest_files(state)) == gens + 1
    assert run_wcoj("verify", state).code == 0


def test_u1_verify_repair_interrupted_before_its_commit_says_nothing_was_repaired(
    history: History, tmp_path: Path
) -> None:
    # The signal goes when the first repaired segment is staged; on a loaded machine the repair
    # may commit before it lands (then the after-commit test's case): tried on fresh states.
    for attempt in range(5):
        state = tmp_path / f"state-{attempt}"
        build_state(history, state, 2)
        flip(segment_file(state, "rel/edge", level="base"), 130, 0x01)
        before = manifest_files(state)
        proc, _, err = signal_when(
            state, ["verify", str(state), "--repair"], "first-segment-staged", signal.SIGINT
        )
        if proc.returncode == 130 and manifest_files(state) == before:
            one_line_error(Done(proc.returncode, "", err), code=130)
            assert "interrupted: nothing was repaired; the state is as it was" in err
            return
        assert proc.returncode in (0, 130), err  # committed first: exact, or said so
    pytest.fail("the repair committed before the signal landed, five times")


def test_u2_sparse_epochs_with_keep_epochs_derive_nothing_again(tmp_path: Path) -> None:
    """Epochs 0, 1, 10, 11 with ``--keep-epochs 1``: each apply one generation, no epoch called
    stale, the exact answer (compacting to 9, not an epoch, goes on from epoch 1's chain)."""
    files = [
        write_changes(tmp_path / "e.csv", [(1, 2, 1), (2, 3, 1), (1, 3, 1), (3, 4, 1), (2, 4, 1)]),
        write_changes(tmp_path / "e1.csv", [(1, 4, 1), (2, 3, -1)]),
        write_changes(tmp_path / "e2.csv", [(2, 3, 1), (4, 5, 1)]),
        write_changes(tmp_path / "e3.csv", [(3, 5, 1)]),
    ]
    state = tmp_path / "s"
    for epoch, f, count in zip((0, 1, 10, 11), files, (2, 2, 4, 5), strict=True):
        done = run_wcoj(
            "apply", "--query", "triangles", "--state", state, "--epoch", epoch,
            "--changes", f"edge={f}", "--undirected", "edge", "--keep-epochs", "1", "--json",
        )  # fmt: skip
        assert done.code == 0, done.err
        assert "derived again" not in done.out and done.payload["rebuilt"] == []
        assert done.payload["count"] == count
    assert len(manifest_files(state)) == 4
    assert run_wcoj("verify", state).code == 0


def test_u3_a_header_of_100000_columns_is_a_short_line(tmp_path: Path) -> None:
    wide = tmp_path / "wide.csv"
    wide.write_text(
        ",".join(f"col{i}" for i in range(100_000)) + "\n" + ",".join(["1"] * 100_000) + "\n"
    )
    for argv in (
        ["count", "--query", "triangles", "--input", f"edge={wide}", "--undirected", "edge"],
        [
            *["apply", "--query", "triangles", "--state", tmp_path / "s", "--epoch", "0"],
            *["--changes", f"edge={wide}", "--undirected", "edge"],
        ],
    ):
        line = one_line_error(run_wcoj(*argv), "has 100000 data columns", "(100,000 in all)")
        assert len(line) < 400, len(line)
    assert not (tmp_path / "s").exists()


def test_u3_any_error_line_is_bounded() -> None:
    from wcoj_core.cli.console import LINE, one_line

    text = one_line("x" * 1_000_000)
    assert len(text) < LINE + 100 and "characters left out" in text


def test_u4_a_dangling_symlink_as_state_says_so(history: History, tmp_path: Path) -> None:
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere" / "x")
    said = f"is a symbolic link to {tmp_path / 'nowhere' / 'x'}, which does not exist"
    one_line_error(run_wcoj(*history.apply_args(link, 0)), said)
    one_line_error(run_wcoj("verify", link), said)
    done = run_wcoj(
        "count", "--query", "triangles", "--input", f"edge={history.files[0]}",
        "--undirected", "edge", "--state", link,
    )  # fmt: skip
    one_line_error(done, said)
    assert not (tmp_path / "nowhere").exists()


# -- the minor cases ---------------------------------------------------------------------------------


def test_minor_an_input_refused_at_the_full_read_leaves_no_state(tmp_path: Path) -> None:
    """A CSV whose bad line lies past what is checked up front (the first 4 MiB): refused at
    the full read; the new state directory is gone (an empty one given stays, empty)."""
    rng = np.random.default_rng(1)
    rows = [(int(a), int(b), 1) for a, b in rng.integers(0, 10**6, (400_000, 2))]
    late = write_changes(tmp_path / "late.csv", rows)
    with open(late, "a") as f:
        f.write("1,x,1\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    for state in (tmp_path / "new", empty):
        done = run_wcoj(
            "apply", "--query", "triangles", "--state", state, "--epoch", "0",
            "--changes", f"edge={late}", "--undirected", "edge",
        )  # fmt: skip
        one_line_error(done, "line 400002", "is not an integer: 'x'")
    assert not (tmp_path / "new").exists()
    assert list(empty.iterdir()) == []


def test_minor_a_state_that_lost_its_marker_says_so(history: History, tmp_path: Path) -> None:
    state = tmp_path / "state"
    build_state(history, state, 1)
    (state / "wcoj-state.json").unlink()
    said = "holds a wcoj state's manifests (generations 1..2) but not its marker wcoj-state.json"
    one_line_error(run_wcoj(*history.apply_args(state, 2)), said, "restore the marker")
    one_line_error(run_wcoj("verify", state), said)
    (state / "wcoj-state.json").write_text(f'{{"wcoj_state": {FORMAT}}}\n')  # as the message says
    exact(apply_json(history, state, 2), history, 2, state)


# -- H1: planning is bounded -------------------------------------------------------------------------


def chain_text(n: int) -> str:
    body = ", ".join(f"e(x{i}, x{i + 1})" for i in range(n))
    return f"p(x0, x{n}) :- {body}"


def test_h1_explain_of_a_chain_is_fast_and_a_huge_one_is_refused_in_one_line() -> None:
    started = time.monotonic()
    done = run_wcoj("explain", "--query", chain_text(40))
    assert done.code == 0 and "rule 39: delta e(x39, x40)#39" in done.out, done.err
    assert time.monotonic() - started < 20  # 3.1 s of planning before; now milliseconds
    started = time.monotonic()
    done = run_wcoj("explain", "--query", chain_text(2000))
    one_line_error(done, "query p has 2,000 atoms; wcoj plans queries of up to 256 atoms")
    assert time.monotonic() - started < 30  # did not finish in 120 s before
