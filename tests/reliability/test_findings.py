"""Issue 23's findings 1, 2, 4 and 5, re-run as written through the installed ``wcoj`` script.

Each test runs the command a user would type, in a subprocess (states it only prepares, and
the epochs of finding 1's long runs but their last, are applied in this process, `build_state`,
`wcoj_here`, to save a process start per epoch), and checks the result: a one-line refusal
with a non-zero exit and nothing committed, or the exact answer (the naive oracle). Findings 3
and 6 are in ``test_findings_damage.py`` and ``test_findings_one_line.py``. A test marked
``xfail(strict=True)`` shows a product bug still open: its reason says what is wrong.

1. a state never touches what is not its own; 2. a state serves the query it was made for;
4. multiplicities never overflow silently; 5. no input is read without end.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from reliability_support import (
    History,
    age,
    build_state,
    build_state_from,
    contents,
    hashes,
    manifest_files,
    one_line_error,
    run_wcoj,
    small_history,
    staged_folders,
    stats,
    summed,
    wcoj_here,
    write_changes,
)

from wcoj_core.store import names
from wcoj_core.store.store import KEEP_MANIFESTS

# -- 1. a state never touches what is not its own -------------------------------------------------


def test_1_a_directory_that_is_not_a_state_is_refused_and_untouched(
    history: History, tmp_path: Path
) -> None:
    """`mkdir -p v/traces/logs; ...; touch -d '2 hours ago' v/traces/logs/2023.log;
    wcoj apply --query triangles --state v --epoch 0 --changes edge=e.csv --undirected edge`."""
    v = tmp_path / "v"
    log = v / "traces" / "logs" / "2023.log"
    log.parent.mkdir(parents=True)
    log.write_text("x\n")
    age(log)
    before = stats(v)
    done = run_wcoj(*history.apply_args(v, 0))
    one_line_error(done, f"{v} is not a wcoj state (no {names.MARKER}) and is not empty")
    for argv in (
        ["verify", str(v)],
        ["count", "--query", "triangles", "--input", f"edge={history.files[0]}", "--state", str(v)],
    ):
        assert run_wcoj(*argv).code != 0
    assert stats(v) == before
    assert log.read_text() == "x\n"


@pytest.mark.parametrize(
    "command",
    [
        "apply",
        pytest.param(
            "count",
        ),
        "verify",
    ],
)
def test_1_an_empty_state_path_is_refused(history: History, tmp_path: Path, command: str) -> None:
    """`--state ""` (an unset variable in a script) is refused, whether the current directory
    is empty or a project folder; nothing is written in it."""
    argv = {
        "apply": [*history.apply_args(Path("PLACEHOLDER"), 0)],
        "count": [
            *["count", "--query", "triangles", "--input", f"edge={history.files[0]}"],
            *["--undirected", "edge", "--state", "PLACEHOLDER"],
        ],
        "verify": ["verify", "PLACEHOLDER"],
    }[command]
    for cwd_files in ((), ("project.txt",)):
        cwd = tmp_path / f"cwd-{len(cwd_files)}"
        cwd.mkdir()
        for name in cwd_files:
            (cwd / name).write_text("mine\n")
        before = stats(cwd)
        for empty in ("", " "):
            done = run_wcoj(*[empty if a == "PLACEHOLDER" else a for a in argv], cwd=cwd)
            line = one_line_error(done)
            assert "empty" in line or "is not empty" in line, line
        assert stats(cwd) == before


PLANTED = {
    # relative to the state: (content, a folder to create it in)
    "notes.txt": b"my notes\n",
    "wcoj-state.json.bak": b"{}\n",
    "traces/logs/2023.log": b"x\n",
    "traces/logs-0123456789/keep.txt": b"looks like a trace folder\n",
    "traces/README": b"readme\n",
    "traces/{rel}/README": b"inside a trace folder\n",
    "traces/{rel}/b-k-0-notmine/data.parquet": b"not a batch name\n",
    "arrangements/mine/a.npy": b"\x93NUMPY not really\n",
    "arrangements/{rel}/notes.txt": b"inside an arrangements folder\n",
    "arrangements/{rel}/s-short/rows.npy": b"not a segment name\n",
    "arrangements/{rel}/s-short.seg": b"not a segment name\n",
    "arrangements/{rel}/s-0123456789abcdef.seg.bak": b"not a segment name either\n",
    "scratch/mine.txt": b"scratch file\n",
    "scratch/work/data.bin": b"\x00\x01\x02",
    "manifests/README": b"manifests readme\n",
    "manifests/0000000001.json.bak": b"a backup\n",
    "manifests/.0000000001.json.tmp": b"not a temp name wcoj makes\n",
    "manifests/7.json": b"{}\n",
}


def plant(state: Path, rel_dir: str) -> dict[str, str]:
    planted = {}
    for pattern, content in PLANTED.items():
        rel = pattern.format(rel=rel_dir)
        path = state / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        planted[rel] = content
    for rel in planted:  # files and the folders holding them: two hours old
        age(state / rel)
        for parent in Path(rel).parents:
            if str(parent) != ".":
                age(state / parent)
    return {rel: hashes(state)[rel] for rel in planted}


def test_1_planted_files_survive_epochs_commits_and_pruning(
    history: History, tmp_path: Path
) -> None:
    """A real state where a user planted files under traces/, arrangements/, scratch/,
    manifests/ and the root: after 13 more epochs (manifests and retired segments pruned) every
    planted file is byte-for-byte intact, and nothing outside the state changed."""
    state = tmp_path / "outer" / "state"
    sibling = tmp_path / "outer" / "sibling"
    sibling.mkdir(parents=True)
    (sibling / "data.csv").write_text("1,2\n")
    age(sibling / "data.csv")
    build_state(history, state, 0)
    rel_dir = names.trace_dir("rel/edge")
    planted = plant(state, rel_dir)
    outside = stats(tmp_path / "outer" / "sibling")
    seen = set(staged_folders(state))
    last = len(history.epochs) - 1
    for t in range(1, last + 1):
        # In this process but the last: the same commits and pruning, without a process start
        # (half a second) per epoch; the last through the installed script, as the user runs it.
        done = (run_wcoj if t == last else wcoj_here)(*history.apply_args(state, t))
        assert done.code == 0, done.err
        seen |= set(staged_folders(state))
    now = hashes(state)
    for rel, digest in planted.items():
        assert now.get(rel) == digest, f"planted file {rel} was changed or deleted"
    assert stats(tmp_path / "outer" / "sibling") == outside
    # Pruning did run: old manifests and retired segments are gone.
    kept = [g for n in manifest_files(state) if (g := names.generation_of(n)) is not None]
    assert len(kept) == KEEP_MANIFESTS and min(kept) > 1, kept
    assert seen - set(staged_folders(state)), "no segment was ever retired"
    assert summed(contents(state), "out/triangles") == history.answer(last)


def test_1_a_file_planted_beside_a_segment_survives_its_retirement(
    tmp_path: Path,
) -> None:
    """A user's file beside a recent segment wcoj made (a segment is one file in its trace's
    arrangements folder), named after it; merges retire the segment."""
    history = small_history(epochs=20).write(tmp_path / "in")
    state = tmp_path / "state"
    build_state(history, state, 0)
    base = set(staged_folders(state))
    build_state_from(history, state, 1, 1)
    segment = state / next(p for p in staged_folders(state) if p not in base and "/s-" in p)
    assert segment.is_file()
    mine = segment.with_name(segment.name + ".notes")
    mine.write_text("mine\n")
    t = 2
    while segment.exists() and t < len(history.epochs):
        assert wcoj_here(*history.apply_args(state, t)).code == 0  # no process start per epoch
        t += 1
    assert not segment.exists(), "the segment was never retired: no evidence"
    assert mine.exists(), "the user's file was deleted with the retired segment"


# -- 2. a state serves the query it was made for --------------------------------------------------


OTHER_QUERIES = {
    "another body": "triangles(a,b,c) :- edge(a,b), edge(b,c), edge(a,c)",
    "another head arity": "triangles(a,b) :- edge(a,b), edge(b,c), edge(a,c), a < b, b < c",
}
STORED_TEXT = "triangles(a, b, c) :- edge(a, b), edge(b, c), edge(a, c), a < b, b < c"


@pytest.mark.parametrize("which", sorted(OTHER_QUERIES))
def test_2_another_query_under_the_same_name_is_refused_naming_both(
    history: History, tmp_path: Path, which: str
) -> None:
    state = tmp_path / "state"
    build_state(history, state, 0)
    before = hashes(state)
    argv = history.apply_args(state, 1)
    argv[argv.index("triangles")] = OTHER_QUERIES[which]
    line = one_line_error(run_wcoj(*argv), f"maintains query 'triangles' as `{STORED_TEXT}`")
    assert "this run gives `triangles(a, b" in line and "give this one another name" in line
    assert hashes(state) == before


@pytest.mark.parametrize(
    ("flags", "declared"),
    [
        (["--undirected", "edge", "--bag", "edge"], "an undirected bag of arity 2"),
        ([], "a bag of arity 2"),
        (["--set", "edge"], "a set of arity 2"),
    ],
    ids=["undirected-bag", "directed-bag", "directed-set"],
)
def test_2_another_meaning_is_refused_naming_both(
    history: History, tmp_path: Path, flags: list[str], declared: str
) -> None:
    state = tmp_path / "state"
    build_state(history, state, 0)
    before = hashes(state)
    base = history.apply_args(state, 1)[:-2]  # without --undirected edge
    one_line_error(
        run_wcoj(*base, *flags),
        "holds relation 'edge' as an undirected set of arity 2",
        f"this run declares it {declared}",
    )
    assert hashes(state) == before


def test_2_a_new_query_name_on_the_state_is_refused_and_the_same_text_is_accepted(
    history: History, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    build_state(history, state, 0)
    before = hashes(state)
    argv = history.apply_args(state, 1)
    argv[argv.index("triangles")] = (
        "tri2(a, b, c) :- edge(a, b), edge(b, c), edge(a, c), a < b, b < c"
    )
    one_line_error(run_wcoj(*argv), "does not keep query tri2", "attach it first (wcoj attach")
    assert hashes(state) == before
    # The same query, written differently (spacing), is the same query.
    argv[argv.index("tri2(a, b, c) :- edge(a, b), edge(b, c), edge(a, c), a < b, b < c")] = (
        "triangles(a,b,c):-edge(a,b),edge(b,c),edge(a,c),a<b,b<c"
    )
    done = run_wcoj(*argv, "--json")
    assert done.code == 0, done.err
    assert done.payload["count"] == history.count(1)


# -- 4. multiplicities never overflow silently ----------------------------------------------------

BIG = 2**21


@pytest.mark.parametrize(
    ("query", "flags", "at"),
    [
        ("triangles", [], "(1, 2, 3)"),
        ("triangles", ["--undirected", "edge", "--bag", "edge"], "(1, 2, 3)"),
        ("directed-triangles", [], "(1, 2, 3)"),
    ],
    ids=["bag", "undirected-bag", "directed-triangles"],
)
@pytest.mark.parametrize("fresh", [True, False], ids=["new-state", "epoch-1"])
def test_4_three_edges_of_diff_2_21_are_refused_on_the_driver(
    tmp_path: Path, query: str, flags: list[str], at: str, fresh: bool
) -> None:
    edges = [(1, 2, BIG), (2, 3, BIG), (1, 3, BIG)]
    big = write_changes(tmp_path / "big.csv", edges)
    state = tmp_path / "state"
    epoch = 0
    if not fresh:
        small = write_changes(tmp_path / "small.csv", [(7, 8, 1), (8, 9, 1)])
        base = ["apply", "--query", query, "--state", str(state), "--changes", f"edge={small}"]
        assert run_wcoj(*base, "--epoch", "0", *flags).code == 0
        epoch = 1
    before = manifest_files(state) if state.exists() else {}
    folders = staged_folders(state) if state.exists() else []
    done = run_wcoj(
        *["apply", "--query", query, "--state", state, "--epoch", epoch, "--changes"],
        f"edge={big}",
        *flags,
    )
    line = one_line_error(done, "multiplicity overflow", f"epoch {epoch} cannot be applied")
    assert at in line, line
    assert manifest_files(state) == before
    assert staged_folders(state) == folders, "staged folders were left behind"


@pytest.mark.spark
def test_4_the_overflow_in_the_executors_reads_as_on_the_driver(tmp_path: Path) -> None:
    """``--deploy executors``: the overflow raised in a Python worker is reported with the same
    line as on the driver (after Spark's start-up notes), exit 2, no Python or Java stack trace;
    nothing committed, no staged folder left."""
    big = write_changes(tmp_path / "big.csv", [(1, 2, BIG), (2, 3, BIG), (1, 3, BIG)])
    lines = {}
    for where in ("driver", "executors"):
        state = tmp_path / where
        done = run_wcoj(
            *["apply", "--query", "triangles", "--state", state, "--epoch", "0"],
            *[f"--changes=edge={big}", "--deploy", where],
        )
        assert done.code == 2, done.err[-3000:]
        assert "Traceback" not in done.err and "\tat " not in done.err, done.err[-3000:]
        (line,) = done.errors
        lines[where] = line
        assert manifest_files(state) == {}
        assert staged_folders(state) == []
    assert lines["executors"] == lines["driver"]
    assert "multiplicity overflow" in lines["driver"] and "(1, 2, 3)" in lines["driver"]
    assert "epoch 0 cannot be applied" in lines["driver"]


def test_4_a_count_leaving_int64_in_one_epoch_is_refused(tmp_path: Path) -> None:
    w = 2**20
    edges = [
        (x, y, w)
        for i in range(8)
        for x, y in ((3 * i + 1, 3 * i + 2), (3 * i + 2, 3 * i + 3), (3 * i + 1, 3 * i + 3))
    ]
    big = write_changes(tmp_path / "sum.csv", edges)
    state = tmp_path / "state"
    done = run_wcoj(
        *["apply", "--query", "triangles", "--state", state, "--epoch", "0"],
        f"--changes=edge={big}",
        "--json",
    )
    if done.code == 0:
        assert done.payload["count"] == 8 * 2**60, f"committed count {done.payload['count']}"
    one_line_error(done, "multiplicity overflow", "epoch 0")
    assert manifest_files(state) == {}


def test_4_a_count_leaving_int64_across_epochs_is_refused_not_committed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    base = ["apply", "--query", "triangles", "--state", state]
    first = write_changes(tmp_path / "a.csv", [(1, 2, 2**62)])
    second = write_changes(tmp_path / "b.csv", [(3, 4, 2**62)])
    third = write_changes(tmp_path / "c.csv", [(5, 6, 1)])
    assert run_wcoj(*base, "--epoch", "0", f"--changes=edge={first}").code == 0
    done = run_wcoj(*base, "--epoch", "1", f"--changes=edge={second}")
    if done.code == 0:  # committed: the state must stay readable
        after = run_wcoj(*base, "--epoch", "2", f"--changes=edge={third}")
        assert after.code == 0, after.err
    else:
        one_line_error(done, "multiplicity overflow", "epoch 1")


# -- 5. inputs that would never end ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "link-to-dev-zero", "fifo-in-parquet-folder"])
@pytest.mark.parametrize("command", ["apply", "count"])
def test_5_pipes_and_devices_are_refused_without_reading_them(
    tmp_path: Path, kind: str, command: str
) -> None:
    if kind == "dev-zero":
        source = "/dev/zero"
    elif kind == "fifo":
        source = str(tmp_path / "edges.csv")
        os.mkfifo(source)
    elif kind == "link-to-dev-zero":
        source = str(tmp_path / "edges.csv")
        os.symlink("/dev/zero", source)
    else:
        folder = tmp_path / "edges.parquet"
        folder.mkdir()
        os.mkfifo(folder / "part-0.parquet")
        source = str(folder)
    state = tmp_path / "state"
    argv = (
        [
            "apply",
            "--query",
            "triangles",
            "--state",
            state,
            "--epoch",
            "0",
            f"--changes=edge={source}",
        ]
        if command == "apply"
        else ["count", "--query", "triangles", f"--input=edge={source}", "--state", state]
    )
    start = time.monotonic()
    done = run_wcoj(*argv, "--undirected", "edge", timeout=60)
    seconds = time.monotonic() - start
    one_line_error(done, "is not a regular file")
    assert seconds < 15, f"took {seconds:.1f} s"
    assert not state.exists(), "a state was created for a refused input"
