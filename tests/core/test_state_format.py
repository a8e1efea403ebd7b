"""A state written by state formats 2 and 3 (segments of three ``.npy`` files; one file of
layout 1, without a directory) is refused on one line naming the command that rebuilds it;
``wcoj verify --repair`` rebuilds its arrangements from its batches, and the state goes on,
exact against the oracle.

The states of earlier formats here are states written now and rewritten as those formats wrote
them: every segment's file replaced by its three ``.npy`` files (the headers numpy writes, which
format 2 wrote), or by a file of layout 1 (the directory dropped), every kept manifest's
segment entries, format and digest edited to match, the marker set back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from test_engine_state import PATHS, TRIANGLES, Run, epoch_changes

from wcoj_core import cli, indexes
from wcoj_core.check.verify import verify_state
from wcoj_core.errors import IncompatibleState
from wcoj_core.store import manifest as mf
from wcoj_core.store import names
from wcoj_core.store.files import file_ref
from wcoj_core.store.manifest import Manifest, Segment, digest_of
from wcoj_core.store.segments import open_segment
from wcoj_core.store.store import Store


def as_format(root: Path, fmt: int) -> int:
    """Rewrite the state at `root` as state format `fmt` (2 or 3) wrote it; the segments
    rewritten."""
    store = Store.open(root, create=False)
    done: dict[str, tuple[str, dict[str, list]]] = {}
    for g in store.generations():
        for trace in store.generation(g).traces.values():
            for s in trace.index.segments if trace.index is not None else ():
                if s.path not in done:
                    done[s.path] = (_three_files if fmt == 2 else _layout_1)(root, s)
    for path in sorted((root / "manifests").glob("*.json")):
        raw = json.loads(path.read_text())
        raw["format"] = fmt
        for trace in raw["traces"].values():
            for s in (trace["index"] or {}).get("segments", ()):
                s["path"], s["files"] = done[s["path"]]
        raw["digest"] = digest_of(raw)
        os.chmod(path, 0o644)
        path.write_text(json.dumps(raw, sort_keys=True, separators=(",", ":")) + "\n")
    (root / names.MARKER).write_text(f'{{"wcoj_state": {fmt}}}\n')
    return len(done)


def _refs(files: dict[str, Path]) -> dict[str, list]:
    out = {}
    for role, target in files.items():
        os.chmod(target, 0o444)
        ref = file_ref(target)
        out[role] = [ref.name, ref.size, ref.sha256, list(ref.stamp or ())]
    return out


def _layout_1(root: Path, segment: Segment) -> tuple[str, dict[str, list]]:
    """A segment file as format 3 wrote it: layout 1 in its header, no directory after the
    keys; its path and files."""
    if not segment.rows:
        return segment.path, {}
    path = root / segment.path
    raw = bytearray(path.read_bytes())
    entries = int.from_bytes(raw[48:56], "little")
    raw[8:12] = (1).to_bytes(4, "little")
    raw[40:56] = bytes(16)
    path.unlink()
    path.write_bytes(bytes(raw[: len(raw) - 8 * entries]))
    return segment.path, _refs({names.SEGMENT_LAYER: path})


def _three_files(root: Path, segment: Segment) -> tuple[str, dict[str, list]]:
    """A segment of one file as a folder of three (the file removed); its path and files."""
    path = segment.path.removesuffix(".seg")  # the folder format 2 named as the file is named
    if not segment.rows:
        return path, {}
    layer = open_segment(root, segment, verify=True)
    arrays = {
        "rows": np.asfortranarray(np.asarray(layer.rows)),
        "diff": np.array(layer.diff),
        "keys": np.array(layer.search_keys()),
    }
    del layer
    (root / segment.path).unlink()
    folder = root / path
    folder.mkdir()
    files = {}
    for role, array in arrays.items():
        files[role] = folder / f"{role}.npy"
        with open(files[role], "wb") as f:
            np.lib.format.write_array(f, array, version=(1, 0))
    return path, _refs(files)


@pytest.mark.parametrize("fmt", [2, 3])
def test_a_state_of_an_earlier_format_is_refused_then_rebuilt_and_stays_exact(
    tmp_path: Path, fmt: int, capsys: pytest.CaptureFixture[str]
) -> None:
    indexes.KEPT.clear()
    root = tmp_path / "state"
    run = Run(root, [TRIANGLES, PATHS])
    for t in range(5):
        run.step(t, epoch_changes(t, run.graph))
    assert as_format(root, fmt) > 0
    indexes.KEPT.clear()  # a process of the earlier wcoj wrote it
    with pytest.raises(IncompatibleState) as e:
        run.check_accumulated()
    assert str(e.value) == (
        f"{root}: this state was written by an earlier wcoj (state format {fmt}), whose "
        f"arrangement files this one does not read; rebuild them from its batches: "
        f"wcoj verify --repair {root}"
    )
    assert cli.main(["verify", str(root)]) == 1  # every segment named, not read
    assert "earlier wcoj" in capsys.readouterr().out
    assert cli.main(["verify", str(root), "--repair"]) == 0
    store = Store.open(root, create=False)
    text = (root / "manifests" / names.manifest_name(store.current().generation)).read_text()
    assert json.loads(text)["format"] == 4
    assert json.loads((root / names.MARKER).read_text())["wcoj_state"] == fmt  # not rewritten
    run.check_accumulated()  # through the rebuilt segments
    for t in range(5, 12):
        run.step(t, epoch_changes(t, run.graph))
        run.check_accumulated()
    assert verify_state(Store.open(root, create=False, older=True)).ok


def test_an_older_wcoj_refuses_a_state_of_format_4_on_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What format 3's wcoj does with a manifest of format 4: it reads only the formats it
    knew, so the state is refused naming the later format."""
    root = tmp_path / "state"
    run = Run(root, [TRIANGLES])
    run.step(0, epoch_changes(0, run.graph))
    manifest = next((root / "manifests").glob("*.json"))
    monkeypatch.setattr(mf, "EARLIER", (2,))
    monkeypatch.setattr(mf, "FORMAT", 3)
    with pytest.raises(IncompatibleState) as e:
        Manifest.from_json(manifest.read_text(), str(manifest))
    assert str(e.value) == (
        f"{manifest}: this state was created by a later wcoj (state format 4) and is not "
        "readable by this one (format 3); use that wcoj"
    )


def test_every_new_file_is_durable_before_the_manifest_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches and segments start their fsyncs as soon as they are written (`sync_soon`), and
    the manifest's content is fsynced with the rest: every new file and folder of an epoch
    (and the folders above them) is still synced, each once, before the manifest is linked."""
    from wcoj_core.store import files as files_module

    monkeypatch.delenv("WCOJ_SYNCFS", raising=False)
    root = tmp_path / "state"
    run = Run(root, [TRIANGLES])
    for t in range(3):
        run.step(t, epoch_changes(t, run.graph))
    before = Store.open(root, create=False).current()
    events: list[tuple[str, Path]] = []
    real_fsync, real_link = files_module._fsync_path, os.link

    def fsync(path: str | Path) -> None:
        if "manifests" not in Path(path).parts:
            import time

            time.sleep(0.02)  # slow syncs: the epoch goes on meanwhile
        real_fsync(path)
        events.append(("fsync", Path(path)))

    def link(src: str | os.PathLike[str], dst: str | os.PathLike[str], **kw: object) -> None:
        events.append(("link", Path(dst)))
        real_link(src, dst, **kw)  # type: ignore[arg-type]

    early: list[str] = []

    def sync_soon(root: str, rel: str) -> None:
        early.append(rel)
        files_module.sync_soon(root, rel)

    from wcoj_core import epoch as epoch_module

    monkeypatch.setattr(files_module, "_fsync_path", fsync)
    monkeypatch.setattr(files_module.os, "link", link)
    monkeypatch.setattr(indexes, "sync_soon", sync_soon)
    monkeypatch.setattr(epoch_module, "sync_soon", sync_soon)
    run.step(3, epoch_changes(3, run.graph))
    monkeypatch.undo()
    after = Store.open(root, create=False).current()
    new = sorted(after.paths() - before.paths())
    assert any("/s-" in p for p in new) and any("/b-" in p for p in new)
    assert sorted(early) == new  # every new folder's syncs started as it was written
    (linked,) = [i for i, (what, _) in enumerate(events) if what == "link"]
    assert events[linked][1].name == names.manifest_name(after.generation)
    synced = [p for what, p in events[:linked] if what == "fsync"]
    assert len(synced) == len(set(synced))  # each once
    for rel in new:
        top = root / rel
        for p in (top, *top.rglob("*"), top.parent):
            assert p in synced, f"{p} not durable before the manifest"
    assert all((root / p).is_file() for p in new if "/s-" in p)  # a segment is one file
    assert any(names.is_manifest_temp(p.name) for p in synced)  # its content, under its temp name
    assert not files_module._EARLY  # every early sync was waited for
