"""Issue 23's finding 6, re-run as written: one line and a non-zero code, always.

``--epoch 10**30``; a manifest ``[]`` or with ``"epoch": "1"`` (digest recomputed, so only the
shape is wrong); a missing batch file; Ctrl-C at several moments, found by watching the state
(while the epoch writes: nothing applied, the state unchanged; once it committed: the epoch
applied), the message checked against the state; ``--output`` never overwriting an input,
refusing an existing file without ``--force``, honouring the umask. Every command runs in a
subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from reliability_support import (
    WCOJ,
    History,
    Watcher,
    apply_json,
    batch_file,
    build_state,
    command_started,
    committed_epoch,
    contents,
    current_manifest,
    edit_manifest,
    hashes,
    manifest_files,
    nothing_committed,
    one_line_error,
    run_wcoj,
    signal_when,
    start_wcoj,
    stderr_lines,
    summed,
    wait_for,
    write_changes,
)

from wcoj_core.store import names

# -- 6. one line and a non-zero code, always ------------------------------------------------------


@pytest.mark.parametrize("epoch", [str(10**30), "-1", "1e3", str(2**62 + 1), "", "0x10", "٣"])
def test_6_a_bad_epoch_is_one_line(history: History, tmp_path: Path, epoch: str) -> None:
    argv = history.apply_args(tmp_path / "state", 0)
    argv[argv.index("--epoch") + 1] = epoch
    one_line_error(run_wcoj(*argv), "--epoch")
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("shape", ["list", "epoch-text", "not-json", "empty"])
def test_6_a_manifest_of_the_wrong_shape_is_one_line(
    history: History, tmp_path: Path, shape: str
) -> None:
    """A manifest `[]` or with `"epoch": "1"` (its digest recomputed, so only the shape is
    wrong), truncated or empty: one line naming it and the previous generation, for `apply`
    and `verify`; nothing committed."""
    state = tmp_path / "state"
    build_state(history, state, 1)
    path = current_manifest(state)
    previous = sorted((state / "manifests").glob("*.json"))[-2]
    if shape == "list":
        edit_manifest(path, lambda m: [], redigest=True)
        what = "expected an object, found []"
    elif shape == "epoch-text":
        edit_manifest(path, lambda m: m.update(epoch="1"), redigest=True)
        what = "expected an integer, found '1' at epoch"
    elif shape == "not-json":
        path.write_bytes(path.read_bytes()[:100])
        what = "not JSON"
    else:
        path.write_bytes(b"")
        what = "not JSON"
    before = manifest_files(state)
    one_line_error(
        apply_json(history, state, 2),
        f"{path}: damaged manifest: {what}",
        f"the previous generation {previous} is the way back",
    )
    nothing_committed(state, before)
    check = run_wcoj("verify", state)
    assert check.code == 1 and f"damaged: manifests/{path.name}: " in check.out
    assert "Traceback" not in check.err


def test_6_a_missing_batch_file_is_one_line(history: History, tmp_path: Path) -> None:
    """A correction of epoch 1 (``--replace``) reads epoch 1's batches: the missing one stops
    it, named; nothing committed. `wcoj verify` names it too."""
    state = tmp_path / "state"
    build_state(history, state, 2)
    target = batch_file(state, "rel/edge", 1)
    target.unlink()
    before = manifest_files(state)
    corrected = write_changes(tmp_path / "fix.csv", history.epochs[1][:-3])
    argv = history.apply_args(state, 1, "--replace")
    argv[argv.index(f"edge={history.files[1]}")] = f"edge={corrected}"
    one_line_error(run_wcoj(*argv), str(target))
    nothing_committed(state, before)
    check = run_wcoj("verify", state)
    assert (
        check.code == 1
        and f"damaged: {target.relative_to(state)} (trace rel/edge): missing" in check.out
    )


# Ctrl-C: the moment is chosen by watching the state, and the message checked against it.


def big_history(tmp_path: Path) -> History:
    """Epoch 0 of a few thousand edges, epoch 1 of 60,000 changes: the epoch reads, lands,
    writes and commits for long enough to be interrupted at each step."""
    import random

    rng = random.Random(3)
    n = 20_000
    first = {(rng.randrange(n), rng.randrange(n)) for _ in range(5_000)}
    second = {(rng.randrange(n), rng.randrange(n)) for _ in range(60_000)}
    return History(
        [
            [(a, b, 1) for a, b in sorted(first) if a != b],
            [(a, b, 1) for a, b in sorted(second) if a != b],
        ]
    ).write(tmp_path / "in")


@pytest.mark.parametrize(
    "moment",
    [
        "first-batch-staged",
        "first-segment-staged",
        "third-staged",
        "manifest-being-committed",
        "manifest-committed",
    ],
)
def test_6_ctrl_c_says_whether_the_epoch_was_applied(tmp_path: Path, moment: str) -> None:
    """SIGINT as soon as something appears in the state: before the commit the command says
    nothing was applied and the state is unchanged; after it, that the epoch was applied (or,
    when the signal came after the command ended, its report says so). The message is checked
    against the state, not against the moment."""
    history = big_history(tmp_path)
    state = tmp_path / "state"
    build_state(history, state, 0)
    before = manifest_files(state)
    snapshot = hashes(state)
    proc, out, err = signal_when(state, history.apply_args(state, 1), moment, signal.SIGINT)
    applied = len(manifest_files(state)) > len(before)
    lines = stderr_lines(err)
    assert "Traceback" not in err, err[-3000:]
    if not applied:
        assert moment != "manifest-committed"
        assert proc.returncode == 130, (proc.returncode, err)
        assert lines == [
            "wcoj: error: interrupted: epoch 1 was not applied; the state is as it was"
        ]
        assert manifest_files(state) == before
        assert {k: v for k, v in hashes(state).items() if k in snapshot} == snapshot
        done = run_wcoj(*history.apply_args(state, 1, "--json"))
        assert done.code == 0 and done.payload["count"] == history.count(1), done.err
    else:
        assert moment.startswith("manifest-"), moment
        if proc.returncode == 130:
            assert len(lines) == 1 and "after epoch 1 was applied" in lines[0], lines
        else:  # the signal came after the command had reported the epoch
            assert "epoch 1: changes" in out, (proc.returncode, out, err)
        assert summed(contents(state, ["out/triangles"]), "out/triangles") == history.answer(1)


def test_6_ctrl_c_while_reading_the_changes_says_nothing_was_applied(tmp_path: Path) -> None:
    """SIGINT as soon as the new state's folder appears (inotify: microseconds, however loaded
    the machine), while the command opens the state and reads its 400,000 changes: a second
    or more before it could commit, so the signal never comes after the epoch."""
    import numpy as np

    rng = np.random.default_rng(3)
    edges = rng.integers(0, 1_000_000, (400_000, 2))
    edges = edges[edges[:, 0] != edges[:, 1]]
    changes = write_changes(tmp_path / "changes.csv", ((a, b, 1) for a, b in edges.tolist()))
    state = tmp_path / "state"
    argv = ["apply", "--query", "triangles", "--state", state, "--epoch", "0"]
    watcher = Watcher([tmp_path])
    try:
        proc = start_wcoj(*argv, "--changes", f"edge={changes}", "--undirected", "edge")
        met = watcher.wait(lambda created: state in created, lambda: proc.poll() is not None, 300)
        if met:
            proc.send_signal(signal.SIGINT)
    finally:
        watcher.close()
    _, err = proc.communicate(timeout=300)
    assert met, f"the command ended before it made its state: {proc.returncode} {err}"
    assert proc.returncode == 130, (proc.returncode, err)
    assert stderr_lines(err) == [
        "wcoj: error: interrupted: epoch 0 was not applied; the state is as it was"
    ]
    assert manifest_files(state) == {}


@pytest.mark.parametrize("delay", [0.05, 0.25])
def test_6_ctrl_c_at_start_up_is_one_line(history: History, tmp_path: Path, delay: float) -> None:
    """SIGINT `delay` seconds into the command's start-up (its imports: numpy, pyarrow, the
    engine), counted from its first extension module (`command_started`): a signal while the
    interpreter itself still starts (its ``site`` import, tens of milliseconds, longer under
    load) ends in the interpreter's traceback, which no program can catch."""
    proc = subprocess.Popen(
        [str(WCOJ), *history.apply_args(tmp_path / "state", 0)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: command_started(proc.pid), "the command's imports", 120)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    state = tmp_path / "state"
    committed = manifest_files(state) if state.exists() else {}
    assert "Traceback" not in err, err[-2000:]
    if proc.returncode == 130:
        assert len(stderr_lines(err)) == 1, err
        assert ("after epoch 0 was applied" in err) == bool(committed), (err, committed)
    else:  # a fresh apply takes a third of a second: the signal came after it had reported
        assert proc.returncode in (0, -signal.SIGINT), (proc.returncode, err)
        assert committed and "epoch 0: changes" in out, (out, err)


# --output


def test_6_output_never_overwrites_an_input(history: History, tmp_path: Path) -> None:
    state = tmp_path / "state"
    build_state(history, state, 0)
    source = history.files[1]
    link = tmp_path / "link.csv"
    link.symlink_to(source)
    hard = tmp_path / "hard.csv"
    os.link(source, hard)
    content = source.read_bytes()
    before = manifest_files(state)
    for target in (source, link, hard):
        for force in ([], ["--force"]):
            one_line_error(
                run_wcoj(*history.apply_args(state, 1, "--output", str(target), *force)),
                f"--output {target}: is the input",
            )
    assert source.read_bytes() == content
    assert manifest_files(state) == before


def test_6_output_refuses_an_existing_file_without_force(history: History, tmp_path: Path) -> None:
    state = tmp_path / "state"
    build_state(history, state, 0)
    existing = tmp_path / "change.csv"
    existing.write_text("mine\n")
    before = manifest_files(state)
    one_line_error(
        run_wcoj(*history.apply_args(state, 1, "--output", str(existing))),
        "the file exists; pass --force to replace it",
    )
    assert existing.read_text() == "mine\n"
    assert manifest_files(state) == before
    done = run_wcoj(*history.apply_args(state, 1, "--output", str(existing), "--force"))
    assert done.code == 0, done.err
    assert existing.read_text().startswith("c0,c1,c2,diff\n")


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077, 0o000], ids=lambda u: f"umask-{u:03o}")
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_6_output_honours_the_umask(
    history: History, tmp_path: Path, umask: int, suffix: str
) -> None:
    state = tmp_path / "state"
    build_state(history, state, 0)
    target = tmp_path / f"change{suffix}"
    done = subprocess.run(
        [str(WCOJ), *history.apply_args(state, 1, "--output", str(target))],
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.umask(umask),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~umask)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".change")] == []


def test_6_output_appearing_meanwhile_says_the_epoch_was_applied(
    history: History, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    target = tmp_path / "race.csv"
    proc = subprocess.Popen(
        [str(WCOJ), *history.apply_args(state, 0, "--output", str(target))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: (state / names.MARKER).exists() or proc.poll() is not None, "the state", 300)
    target.write_text("mine\n")
    _, err = proc.communicate(timeout=300)
    assert target.read_text() == "mine\n"
    assert committed_epoch(state) == 0
    (line,) = stderr_lines(err)
    assert "epoch 0 was applied" in line, (proc.returncode, line)
