"""A state of an earlier format is refused on one line saying to re-create it, by its marker
(or, with the marker set back to 5, by its manifests); an older wcoj refuses a state of format 5
alike. Every new file is durable before the manifest names it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_engine_state import PATHS, TRIANGLES, Run, epoch_changes

from wcoj_core import cli, indexes
from wcoj_core.errors import IncompatibleState
from wcoj_core.store import manifest as mf
from wcoj_core.store import names
from wcoj_core.store.manifest import Manifest, digest_of
from wcoj_core.store.store import Store


def as_format(root: Path, fmt: int, marker: int) -> None:
    """Set the state at `root`'s manifests to format `fmt` (digests resealed), its marker to
    `marker`."""
    for path in sorted((root / "manifests").glob("*.json")):
        raw = json.loads(path.read_text())
        raw["format"] = fmt
        raw["digest"] = digest_of(raw)
        path.chmod(0o644)
        path.write_text(json.dumps(raw, sort_keys=True, separators=(",", ":")) + "\n")
    (root / names.MARKER).write_text(f'{{"wcoj_state": {marker}}}\n')


@pytest.mark.parametrize("fmt", [2, 3, 4])
def test_a_state_of_an_earlier_format_is_refused_on_one_line(
    tmp_path: Path, fmt: int, capsys: pytest.CaptureFixture[str]
) -> None:
    indexes.KEPT.clear()
    root = tmp_path / "state"
    run = Run(root, [TRIANGLES, PATHS])
    for t in range(3):
        run.step(t, epoch_changes(t, run.graph))
    as_format(root, fmt, fmt)
    indexes.KEPT.clear()  # a process of the earlier wcoj wrote it
    with pytest.raises(IncompatibleState) as e:
        run.check_accumulated()
    assert str(e.value) == (
        f"{root}: this state was created by an earlier wcoj (state format {fmt}) and is not "
        "readable by this one (format 5); re-create the state (apply its epochs into a new "
        "directory)"
    )
    assert cli.main(["verify", str(root)]) == 2
    assert "re-create the state" in capsys.readouterr().err
    as_format(root, fmt, 5)  # a marker set back: the manifests say it
    with pytest.raises(IncompatibleState, match=f"earlier wcoj \\(state format {fmt}\\)"):
        run.check_accumulated()


def test_an_older_wcoj_refuses_a_state_of_format_5_on_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What format 4's wcoj does with a manifest of format 5: it reads only the formats it
    knew, so the state is refused naming the later format."""
    root = tmp_path / "state"
    run = Run(root, [TRIANGLES])
    run.step(0, epoch_changes(0, run.graph))
    manifest = next((root / "manifests").glob("*.json"))
    monkeypatch.setattr(mf, "FORMAT", 4)
    with pytest.raises(IncompatibleState) as e:
        Manifest.from_json(manifest.read_text(), str(manifest))
    assert str(e.value) == (
        f"{manifest}: this state was created by a later wcoj (state format 5) and is not "
        "readable by this one (format 4); use that wcoj"
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
