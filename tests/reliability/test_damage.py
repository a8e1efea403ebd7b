"""Damage of every kind to a state's files: never a wrong committed answer.

Each case builds a small state in place (epochs 0-2 of `small_history`, so every file keeps the
stamp its writer recorded), damages one file, and then:

1. ``wcoj verify`` must exit 1 and name the damaged file (unless the damage leaves a whole
   state: see `NOT_DAMAGE`);
2. the next epoch (``wcoj apply --epoch 3``), 3. a correction of epoch 1 (``--replace`` with
   other changes: it reads the batches of epochs 1 and later and derives the later epochs
   again) and 4. epoch 4 with ``--keep-epochs 1`` (its commit compacts history up to epoch 3,
   reading those batches whole) must each give the exact answer — the naive oracle of what the
   state then holds, as the JSON count, the manifest's figures and, when readable, the output's
   batches; with a warning when arrangements were rebuilt — or a one-line refusal naming the
   damaged file, with nothing committed.

File kinds: every batch kind (relation, counts, a set's ignored changes, output: not indexed
for undirected triangles, indexed for a bag), the segment file (one per segment since state
format 3) of the relation, a counts and an indexed output trace, and the current manifest.
Damage: one byte flipped (first, middle and last byte: a Parquet or segment header, data, a
Parquet footer), the lowest bit of the middle byte flipped (a text stays a text), truncated to
half, deleted, grown by 16 bytes, replaced by another valid file of the same size. The commands
run in this process (`wcoj_here`): an exception other than a `WcojError` fails the test as a
traceback would.

Set ``WCOJ_DAMAGE_REPORT=path`` to collect every case's outcome as JSON lines (the table of
docs/reliability.md summarizes them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from reliability_support import (
    Done,
    History,
    Rows,
    build_state,
    contents,
    current_manifest,
    figures,
    flip,
    manifest_files,
    one_line_error,
    open_store,
    same_size_segment,
    small_history,
    summed,
    wcoj_here,
    write_changes,
)

from wcoj_core.errors import DamagedBatch
from wcoj_core.store.batches import STATISTICS

SET_KINDS = [
    "batch:rel/edge",
    "batch:counts/edge/0",
    "batch:ignored/edge",
    "batch:out/triangles",
    "segment:rel/edge:layer",
    "segment:counts/edge/0:layer",
    "manifest",
]
BAG_KINDS = [
    "batch:out/triangles",
    "segment:out/triangles:layer",
]
DAMAGES = [
    "flip-first",
    "flip-middle",
    "flip-last",
    "flip-bit",
    "truncated",
    "deleted",
    "grown",
    "replaced",
]


def _marks(flavour: str, kind: str, damage: str) -> list[pytest.MarkDecorator]:
    return []


CASES = [
    pytest.param(
        flavour, kind, damage, id=f"{flavour}-{kind}-{damage}", marks=_marks(flavour, kind, damage)
    )
    for flavour, kinds in (("set", SET_KINDS), ("bag", BAG_KINDS))
    for kind in kinds
    for damage in DAMAGES
]
# Damage that leaves a state that is not damaged: the newest manifest deleted is the previous
# generation, whole (see `test_damage`).
NOT_DAMAGE = {("manifest", "deleted")}


def target_of(state: Path, kind: str) -> Path:
    """The file a kind of damage hits: the epoch-2 batch, the index's newest segment."""
    if kind == "manifest":
        return current_manifest(state)
    what, trace, *role = kind.split(":")
    t = open_store(state).current().trace(trace)
    assert t is not None, f"no trace {trace}"
    if what == "batch":
        (b,) = [b for b in t.batches if b.time == 2]
        return state / b.path / b.files[0].name
    assert t.index is not None
    live = [s for s in t.index.segments if s.rows]
    return state / live[-1].file_path(role[0])


def same_size_parquet(path: Path) -> bytes:
    """Another valid Parquet file of the same size: one value of the first column changed."""
    table = pq.read_table(path)
    data = path.read_bytes()
    field = table.schema.field(0)
    for i in range(table.num_rows):
        for delta in (1, -1, 2, -2, 3, -3, 5, 7):
            column = table.column(0).to_pylist()
            column[i] += delta
            changed = table.set_column(0, field, pa.array(column, type=field.type))
            sink = pa.BufferOutputStream()
            pq.write_table(
                changed,
                sink,
                compression="snappy",
                use_dictionary=["time", "diff"],
                write_statistics=STATISTICS,  # as a batch is written
            )
            out = sink.getvalue().to_pybytes()
            if len(out) == len(data) and out != data:
                return out
    raise AssertionError(f"no same-size variant of {path}")


def same_size_manifest(state: Path, path: Path) -> bytes:
    """The previous generation's manifest (a valid manifest, of another generation)."""
    previous = sorted((state / "manifests").glob("*.json"))[-2]
    return previous.read_bytes()


def damage(state: Path, path: Path, how: str) -> None:
    path.chmod(0o644)
    size = path.stat().st_size
    if how == "flip-bit":  # the lowest bit of the middle byte (text stays text)
        flip(path, size // 2, 0x01)
    elif how.startswith("flip-"):
        flip(path, {"flip-first": 0, "flip-middle": size // 2, "flip-last": size - 1}[how])
    elif how == "truncated":
        os.truncate(path, size // 2)
    elif how == "deleted":
        path.unlink()
    elif how == "grown":
        with open(path, "ab") as f:
            f.write(b"\x00" * 16)
    else:
        if path.suffix == ".parquet":
            data = same_size_parquet(path)
        elif path.suffix == ".seg":
            data = same_size_segment(path.read_bytes())
        else:
            data = same_size_manifest(state, path)
        path.unlink()  # a new file, as a restore or a copy would make it
        path.write_bytes(data)


Expected = Callable[[], tuple[int, History]]


def follow_up(
    state: Path, damaged: Path, argv: list[str], expected: Expected, *, rebuilt: bool = False
) -> str:
    """Run `argv`; assert the exact answer or a clean refusal naming `damaged`; the outcome.

    `expected()` gives the count the command must report and the history the state then holds
    (the final count and output are its naive answer). With `rebuilt`, an exact answer must
    come with a warning that the damaged file's arrangements were rebuilt."""
    before = manifest_files(state)
    done: Done = wcoj_here(*argv, "--json")
    if done.code == 0:
        count, held = expected()
        last = len(held.epochs) - 1
        assert done.payload["count"] == count, (done.payload["count"], count)
        assert figures(state, "out/triangles")[1] == held.count(last)
        try:
            output = summed(contents(state, ["out/triangles"]), "out/triangles")
        except DamagedBatch as e:  # the damaged file is an output batch: not readable
            assert str(damaged) in str(e)
        else:
            assert output == held.answer(last)
        if rebuilt:
            warnings = [w for w in done.err.splitlines() if w.startswith("wcoj: warning:")]
            assert any("arrangements rebuilt" in w and str(damaged) in w for w in warnings), (
                done.err
            )
        return "exact"
    line = one_line_error(done)
    assert str(damaged) in line or str(damaged.parent) in line, (str(damaged), line)
    if manifest_files(state) != before:
        # Something was committed after all (a correction, before the later epochs failed):
        # the line must say so.
        assert "applied" in line or "replaced" in line, f"committed, but the line says: {line}"
    return "refused: " + line.removeprefix("wcoj: error: ").replace(str(state) + "/", "")[:160]


def report(record: dict) -> None:
    out = os.environ.get("WCOJ_DAMAGE_REPORT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")


@pytest.mark.parametrize(("flavour", "kind", "how"), CASES)
def test_damage(tmp_path: Path, flavour: str, kind: str, how: str) -> None:
    history = small_history(epochs=5, undirected=flavour == "set").write(tmp_path / "in")
    state = tmp_path / "state"
    build_state(history, state, 2)
    path = target_of(state, kind)
    rel = str(path.relative_to(state))
    damage(state, path, how)
    held = list(history.epochs[:3])  # what the state holds, epoch by epoch

    def model(epochs: list[Rows]) -> History:
        return History(list(epochs), history.undirected)

    # 1. verify names the file
    verify = wcoj_here("verify", state)
    assert "Traceback" not in verify.err
    if (kind, how) in NOT_DAMAGE:
        # The newest generation is gone: the state is the previous one, whole (epoch 1);
        # epoch 2's folders, referenced by no manifest now, are pruned an hour later.
        held.pop()
        assert verify.code == 0, verify.out
    else:
        assert verify.code == 1, verify.out
        assert f"damaged: {rel}" in verify.out, verify.out

    # 2. the next epoch
    after = [*held, history.epochs[3]]
    nxt = follow_up(
        state,
        path,
        history.apply_args(state, 3),
        lambda: (model(after).count(len(after) - 1), model(after)),
        rebuilt=kind.startswith("segment:") and (kind, how) not in NOT_DAMAGE,
    )
    if nxt == "exact":
        held = after

    # 3. a correction of epoch 1 (it loses its first three insertions): reads the batches of
    # epochs 1 and later, derives the later epochs again
    corrected = [held[0], history.epochs[1][3:], *held[2:]]
    fix = write_changes(tmp_path / "fix.csv", corrected[1])
    argv = history.apply_args(state, 1, "--replace")
    argv[argv.index(f"edge={history.files[1]}")] = f"edge={fix}"
    replaced = follow_up(state, path, argv, lambda: (model(corrected).count(1), model(corrected)))
    if replaced == "exact":
        held = corrected

    # 4. epoch 4 with --keep-epochs 1: history up to epoch 3 compacted (its batches read whole)
    after = [*held, history.epochs[4]]
    compacted = follow_up(
        state,
        path,
        history.apply_args(state, 4, "--keep-epochs", "1"),
        lambda: (model(after).count(len(after) - 1), model(after)),
    )
    if compacted == "exact":
        assert open_store(state).current().frontier == 3
    report(
        {
            "flavour": flavour,
            "kind": kind,
            "damage": how,
            "next": nxt,
            "replace": replaced,
            "compact": compacted,
        }
    )
