"""Issue 23's finding 3, re-run as written: stored data damage never gives a wrong committed
answer.

A one-byte flip in a batch's Parquet file (several offsets), a deleted output batch file,
``"rows": 0`` or ``"epoch"`` edited into the manifest, a truncated arrangement file, bytes
flipped in an arrangement file (in place: its stamp changes), an arrangement file with a stale
digest in the manifest (the manifest's own digest recomputed), a deleted arrangement file: every
case ends in a one-line refusal naming the file (and the previous generation for a manifest)
with nothing committed, or the exact answer. ``wcoj verify`` names each damaged file and the
epochs it affects; ``--repair`` rebuilds arrangements. Every command runs in a subprocess.
The systematic matrix (every file kind x every damage) is ``test_damage.py``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from reliability_support import (
    History,
    apply_json,
    batch_file,
    build_state,
    committed_epoch,
    current_manifest,
    edit_manifest,
    exact,
    figures,
    flip,
    manifest_files,
    nothing_committed,
    one_line_error,
    run_wcoj,
    same_size_segment,
    segment_file,
    small_history,
)

# -- 3. stored data damage never gives a wrong committed answer -----------------------------------


@pytest.mark.parametrize("where", [0, 4, "middle", -9, -1])
def test_3_a_flipped_byte_in_a_relation_batch(
    history: History, tmp_path: Path, where: int | str
) -> None:
    """The next epoch is exact (the relation's arrangements cover the batch, which is not
    read); `wcoj verify` names the file and the epochs it affects; once the batch has to be
    read (its arrangements damaged too) the epoch is refused naming it, nothing committed."""
    state = tmp_path / "state"
    build_state(history, state, 2)
    target = batch_file(state, "rel/edge", 2)
    size = target.stat().st_size
    flip(target, size // 2 if where == "middle" else int(where) % size)
    rel = str(target.relative_to(state))
    done = run_wcoj("verify", state)
    assert done.code == 1
    assert (
        f"damaged: {rel} (trace rel/edge): " in done.out
        and "affects epochs 2 and later" in done.out
    )
    twin = tmp_path / "twin"
    subprocess.run(["cp", "-a", str(state), str(twin)], check=True)
    exact(apply_json(history, state, 3), history, 3, state)
    # The same damage where the batch must be read: the index is gone.
    os.unlink(segment_file(twin, "rel/edge"))
    before = manifest_files(twin)
    one_line_error(apply_json(history, twin, 3), str(twin / rel))
    nothing_committed(twin, before)


def test_3_a_deleted_output_batch_file(history: History, tmp_path: Path) -> None:
    """Undirected triangles: the output is not indexed, its count kept in the manifest; the
    next epoch is exact and `wcoj verify` names the missing file."""
    state = tmp_path / "state"
    build_state(history, state, 2)
    target = batch_file(state, "out/triangles", 1)
    target.unlink()
    done = apply_json(history, state, 3)
    assert done.code == 0, done.err
    assert done.payload["count"] == history.count(3)
    assert figures(state, "out/triangles")[1] == history.count(3)
    check = run_wcoj("verify", state)
    assert check.code == 1
    assert f"damaged: {target.relative_to(state)} (trace out/triangles): missing" in check.out
    assert "affects epochs 1 and later" in check.out


def test_3_a_deleted_output_batch_file_of_an_indexed_output(tmp_path: Path) -> None:
    """A bag's output is indexed: with its arrangement damaged too, the output's batches must be
    read, and the missing one stops the epoch, named, nothing committed."""
    history = small_history(undirected=False).write(tmp_path / "in")
    state = tmp_path / "state"
    build_state(history, state, 2)
    target = batch_file(state, "out/triangles", 1)
    target.unlink()
    twin = tmp_path / "twin"
    subprocess.run(["cp", "-a", str(state), str(twin)], check=True)
    done = apply_json(history, state, 3)
    assert done.code == 0 and done.payload["count"] == history.count(3), done.err
    os.unlink(segment_file(twin, "out/triangles", level="base"))
    before = manifest_files(twin)
    one_line_error(apply_json(history, twin, 3), str(twin / target.relative_to(state)))
    nothing_committed(twin, before)


@pytest.mark.parametrize(
    "edit",
    ["rows-0", "epoch", "figures"],
)
def test_3_an_edited_manifest_is_refused_naming_it_and_the_way_back(
    history: History, tmp_path: Path, edit: str
) -> None:
    """`"rows": 0` or another `"epoch"` edited into the current manifest (its digest left as
    it was): one line naming the file and the previous generation; nothing committed. Removing
    the damaged generation (the way back) and applying the epochs again gives the exact
    answer."""
    state = tmp_path / "state"
    build_state(history, state, 2)
    path = current_manifest(state)
    previous = sorted((state / "manifests").glob("*.json"))[-2]

    def change(m: dict) -> None:
        if edit == "rows-0":
            m["traces"]["rel/edge"]["batches"][-1]["rows"] = 0
        elif edit == "epoch":
            m["epoch"] = 1
        else:
            m["traces"]["out/triangles"]["batches"][-1]["figures"][1] += 1

    edit_manifest(path, change, redigest=False)
    before = manifest_files(state)
    one_line_error(
        apply_json(history, state, 3),
        f"{path}: damaged manifest: its digest does not match its content",
        f"the previous generation {previous} is the way back",
    )
    nothing_committed(state, before)
    check = run_wcoj("verify", state)
    assert check.code == 1 and f"damaged: manifests/{path.name}" in check.out
    path.unlink()  # back to the previous generation (epoch 1)
    assert committed_epoch(state) == 1
    for t in (2, 3):
        done = apply_json(history, state, t)
        assert done.code == 0, done.err
    exact(done, history, 3, state)


@pytest.mark.parametrize("edit", ["rows-0", "epoch"])
def test_3_an_edited_manifest_with_its_digest_recomputed_still_gives_the_exact_answer(
    history: History, tmp_path: Path, edit: str
) -> None:
    """The same edits made "valid" (digest recomputed): a row count is not what the answer is
    computed from, so the next epoch is exact; an epoch before the state's batches is a
    manifest of the wrong shape (issue 27), refused in one line naming the way back."""
    state = tmp_path / "state"
    build_state(history, state, 2)

    def change(m: dict) -> None:
        if edit == "rows-0":
            m["traces"]["rel/edge"]["batches"][-1]["rows"] = 0
        else:
            m["epoch"] = 1

    path = current_manifest(state)
    edit_manifest(path, change, redigest=True)
    if edit == "rows-0":
        exact(apply_json(history, state, 3), history, 3, state)
        return
    before = manifest_files(state)
    one_line_error(
        apply_json(history, state, 3),
        f"{path.name}: damaged manifest: a batch of epoch 2, after the state's epoch 1",
        "is the way back",
    )
    nothing_committed(state, before)


ARRANGEMENT_DAMAGE = ["truncated", "flipped", "deleted", "grown", "swapped"]


def damage_segment(state: Path, trace: str, role: str, how: str) -> Path:
    target = segment_file(state, trace, role, level="base")
    target.chmod(0o644)
    size = target.stat().st_size
    if how == "truncated":
        os.truncate(target, size - 8)
    elif how == "flipped":
        flip(target, size - 3)
    elif how == "flipped-header":
        flip(target, 10)
    elif how == "deleted":
        target.unlink()
    elif how == "grown":
        with open(target, "ab") as f:
            f.write(b"\0" * 8)
    elif how == "swapped":  # another segment file of the same size: its values reversed
        data = same_size_segment(target.read_bytes())
        target.unlink()
        target.write_bytes(data)
    return target


@pytest.mark.parametrize("how", ARRANGEMENT_DAMAGE)
@pytest.mark.parametrize("trace", ["rel/edge", "counts/edge/0"])
def test_3_a_damaged_arrangement_file_is_rebuilt_exactly(
    history: History, tmp_path: Path, trace: str, how: str
) -> None:
    state = tmp_path / "state"
    build_state(history, state, 2)
    target = damage_segment(state, trace, "layer", how)
    check = run_wcoj("verify", state)
    assert check.code == 1, check.out
    assert f"damaged: {target.relative_to(state)} (trace {trace}): " in check.out
    assert "rebuildable from the batches" in check.out
    exact(apply_json(history, state, 3), history, 3, state)


def test_3_a_rebuilt_arrangement_is_warned_about(history: History, tmp_path: Path) -> None:
    state = tmp_path / "state"
    build_state(history, state, 2)
    target = damage_segment(state, "rel/edge", "layer", "truncated")
    done = apply_json(history, state, 3)
    exact(done, history, 3, state)
    assert done.payload["metrics"]["hydration"]["rebuilt"], "no rebuilt trace in the JSON"
    warnings = [line for line in done.err.splitlines() if line.startswith("wcoj: warning:")]
    assert any("rebuilt" in w and target.name in w for w in warnings), done.err


@pytest.mark.parametrize("command", ["apply", "verify"])
def test_3_a_flipped_byte_in_an_arrangement_header(
    history: History, tmp_path: Path, command: str
) -> None:
    state = tmp_path / "state"
    build_state(history, state, 2)
    target = damage_segment(state, "rel/edge", "layer", "flipped-header")
    if command == "verify":
        check = run_wcoj("verify", state)
        assert "Traceback" not in check.err, check.err[-2000:]
        assert check.code == 1 and f"damaged: {target.relative_to(state)}" in check.out
    else:
        exact(apply_json(history, state, 3), history, 3, state)


def stale_digest(state: Path, trace: str = "rel/edge") -> str:
    """Make the manifest name a wrong sha256 for a recent segment's file of `trace`,
    the manifest's own digest recomputed (the file's stamp still matches); its path."""
    found: list[str] = []

    def change(m: dict) -> None:
        segs = m["traces"][trace]["index"]["segments"]
        # the identity's (an undirected relation's reversed view lists the same files)
        ident = [s for s in segs if s["order"] == sorted(s["order"])]
        seg = [s for s in ident if s["level"] == "recent" and s["rows"]][-1]
        seg["files"]["layer"][2] = "0" * 64
        found.append(seg["path"])  # a segment is its one file

    edit_manifest(current_manifest(state), change, redigest=True)
    return found[0]


def test_3_a_stale_digest_in_the_manifest(history: History, tmp_path: Path) -> None:
    """A segment file whose sha256 in the manifest is wrong, the manifest's digest recomputed:
    the file's stamp is unchanged, so opening does not read it whole; `wcoj verify` names it;
    epochs stay exact, and the merge that reads it whole rebuilds it from the batches with a
    warning naming the file (never a refusal that would stop every later epoch). The epochs
    run up to the one after that merge (exact on the rebuilt segment), or to the last."""
    state = tmp_path / "state"
    build_state(history, state, 1)
    rel = stale_digest(state)
    check = run_wcoj("verify", state)
    assert check.code == 1 and f"damaged: {rel} (trace rel/edge): its sha256" in check.out
    warned_at = None
    for t in range(2, len(history.epochs)):
        done = apply_json(history, state, t)
        exact(done, history, t, state)
        warnings = [line for line in done.err.splitlines() if line.startswith("wcoj: warning:")]
        if warned_at is None and any(rel in w for w in warnings):
            warned_at = t
        elif warned_at is not None:
            break  # an epoch after the merge that rebuilt the segment, exact too
    assert warned_at is not None, "no merge ever read the segment"
    assert t == warned_at + 1, "an epoch ran after the merge that rebuilt the segment"


def test_3_a_stale_digest_repaired_by_verify(history: History, tmp_path: Path) -> None:
    state = tmp_path / "state"
    build_state(history, state, 1)
    stale_digest(state)
    repair = run_wcoj("verify", state, "--repair")
    assert "rebuilt the arrangements of rel/edge" in repair.err, repair.err
    for t in range(2, 10):
        exact(apply_json(history, state, t), history, t, state)


def test_3_verify_repair_fixes_arrangement_damage(history: History, tmp_path: Path) -> None:
    state = tmp_path / "state"
    build_state(history, state, 2)
    damaged = [
        damage_segment(state, "rel/edge", "layer", "truncated"),
        damage_segment(state, "counts/edge/1", "layer", "flipped"),
    ]
    check = run_wcoj("verify", state)
    assert check.code == 1
    for path in damaged:
        assert f"damaged: {path.relative_to(state)}" in check.out
    repair = run_wcoj("verify", state, "--repair", "--json")
    # (counts/edge/0 too: an undirected relation's two counts traces share their segments)
    assert {"counts/edge/1", "rel/edge"} <= set(repair.payload["repaired"]), repair.out
    # The current generation is whole again: every damage left is named by older ones only.
    assert all(not d["current"] for d in repair.payload["damaged"]), repair.payload["damaged"]
    exact(apply_json(history, state, 3), history, 3, state)


def test_3_verify_is_green_after_a_repair(history: History, tmp_path: Path) -> None:
    state = tmp_path / "state"
    build_state(history, state, 2)
    damage_segment(state, "rel/edge", "layer", "truncated")
    repair = run_wcoj("verify", state, "--repair")
    assert repair.code == 0, repair.out
    assert run_wcoj("verify", state).code == 0
