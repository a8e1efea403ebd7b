"""The state directory: opening, the marker, commits, pruning — and that a user's files in or
next to a state are never deleted (the findings of the security review, reproduced)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Sequence
from pathlib import Path

import pytest
from store_support import HOUR, age, epoch, local, snapshot, stage_batch

from wcoj_core.errors import ConcurrentCommit, DamagedState, IncompatibleState, StateError
from wcoj_core.store import files as files_module
from wcoj_core.store import names
from wcoj_core.store.manifest import Manifest, Trace
from wcoj_core.store.store import KEEP_MANIFESTS, Store

# -- opening -----------------------------------------------------------------------------------


def test_a_non_empty_directory_without_marker_is_refused(tmp_path: Path) -> None:
    # mkdir -p v/traces/logs; echo x > v/traces/logs/2023.log; touch -d '2 hours ago' ...
    log = tmp_path / "v" / "traces" / "logs" / "2023.log"
    log.parent.mkdir(parents=True)
    log.write_text("x\n")
    age(log, 2 * HOUR)
    before = snapshot(tmp_path)
    with pytest.raises(StateError) as e:
        Store.open(tmp_path / "v", create=True)
    assert str(e.value) == (
        f"{tmp_path / 'v'} is not a wcoj state (no wcoj-state.json) and is not empty: "
        f"pass a new or empty directory"
    )
    with pytest.raises(StateError, match="no wcoj state at"):
        Store.open(tmp_path / "v", create=False)
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "v" / names.MARKER).exists()


@pytest.mark.parametrize("root", ["", "   ", "file://"])
def test_an_empty_path_is_refused(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # `--state ""` must not mean the current directory
    with pytest.raises(StateError, match="the state path is empty"):
        Store.open(root, create=True)
    assert list(tmp_path.iterdir()) == []


def test_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "data.csv"
    f.write_text("1,2\n")
    with pytest.raises(StateError, match="exists and is not a directory"):
        Store.open(f, create=True)
    assert f.read_text() == "1,2\n"


def test_no_state_without_create(tmp_path: Path) -> None:
    with pytest.raises(StateError, match=f"no wcoj state at {tmp_path / 'new'}"):
        Store.open(tmp_path / "new", create=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StateError, match="no wcoj state at"):
        Store.open(tmp_path / "empty", create=False)
    assert not (tmp_path / "new").exists()
    assert list((tmp_path / "empty").iterdir()) == []


def test_creates_in_a_new_or_empty_directory_then_reopens(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for root in (tmp_path / "new" / "deeper", tmp_path / "empty"):
        store = Store.open(root, create=True)
        marker = json.loads((root / names.MARKER).read_text())
        assert marker["wcoj_state"] == 5
        assert marker["by"] == f"wcoj {importlib.metadata.version('wcoj')}"  # the package's own
        assert store.current() == Manifest()
        epoch(store, 0)
        again = Store.open(str(root), create=False)
        assert again.current().generation == 1
        assert Store.open(f"file://{root}", create=True).current().epoch == 0


def test_a_state_through_a_symbolic_link_opens(tmp_path: Path) -> None:
    Store.open(tmp_path / "real", create=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert Store.open(tmp_path / "link", create=False).current() == Manifest()


def test_other_formats_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "s"
    Store.open(root, create=True)
    (root / names.MARKER).write_text('{"wcoj_state": 6}')
    with pytest.raises(IncompatibleState, match="a later wcoj"):
        Store.open(root, create=False)
    for earlier in (2, 3, 4):
        (root / names.MARKER).write_text(f'{{"wcoj_state": {earlier}}}')
        with pytest.raises(IncompatibleState, match=r"an earlier wcoj.*re-create the state"):
            Store.open(root, create=False)
    (root / names.MARKER).write_text("{nope")
    with pytest.raises(DamagedState, match="damaged state marker"):
        Store.open(root, create=False)


def test_a_format_1_state_is_named_as_such(tmp_path: Path) -> None:
    old = tmp_path / "old"
    (old / "manifests").mkdir(parents=True)
    (old / "manifests" / "0000000003.json").write_text(
        json.dumps({"format": 1, "generation": 3, "epoch": 2, "traces": {}})
    )
    for create in (True, False):
        with pytest.raises(IncompatibleState) as e:
            Store.open(old, create=create)
        assert "created by an earlier wcoj (state format 1)" in str(e.value)
        assert "re-create the state" in str(e.value)
    assert not (old / names.MARKER).exists()


def test_a_remote_root_is_reached_through_pyarrow_only() -> None:
    """No Spark session is asked for: a root pyarrow cannot reach (no libhdfs here) is one line."""
    with pytest.raises(StateError, match="pyarrow cannot reach it") as e:
        Store.open("hdfs://namenode:8020/wcoj", create=True)
    assert "\n" not in str(e.value)


def test_importing_the_store_imports_no_spark() -> None:
    code = (
        "import sys, wcoj_core.store, wcoj_core.check.verify, wcoj_core.store.segments;"
        "assert 'pyspark' not in sys.modules, 'pyspark imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- commits -----------------------------------------------------------------------------------


def test_commits_are_generations_and_racing_writers_lose(tmp_path: Path) -> None:
    store = Store.open(tmp_path, create=True)
    m1 = epoch(store, 0)
    assert m1.generation == 1 and store.current() == m1
    assert (tmp_path / "manifests" / "0000000001.json").exists()
    other = Store.open(tmp_path, create=False)
    base = other.current()
    store.commit(Manifest(epoch=1, traces=dict(base.traces)), base)
    with pytest.raises(ConcurrentCommit, match="generation 2 was committed by another writer"):
        other.commit(Manifest(epoch=5), base)
    assert Store.open(tmp_path, create=False).current().epoch == 1
    assert store.generation(1) == m1 and store.generation(0) == Manifest()
    with pytest.raises(StateError, match="generation 9 is not kept"):
        store.generation(9)


def test_a_commit_syncs_the_new_folders_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.open(tmp_path, create=True)
    m1 = epoch(store, 0)
    synced: list[str] = []
    known: list[str] = []

    def sync_many(
        rels: list[str], durable: Collection[str] = (), also: Sequence[Path] = ()
    ) -> None:
        synced.extend(rels)
        known.extend(durable)
        assert [p.parent.name for p in also] == ["manifests"]  # the manifest, synced with them

    monkeypatch.setattr(store.files, "sync_many", sync_many)
    m2 = epoch(store, 1)
    assert sorted(synced) == sorted(m2.paths() - m1.paths())
    # Durable already: every folder above what the committed generation names.
    above = {p.rsplit("/", 1)[0] for p in m1.paths()}
    assert sorted(known) == sorted(above | {p.split("/", 1)[0] for p in above})


def test_each_new_folder_is_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WCOJ_SYNCFS", raising=False)
    store = Store.open(tmp_path, create=True)
    m1 = epoch(store, 0)
    synced: list[Path] = []
    monkeypatch.setattr(files_module, "_fsync_path", lambda p: synced.append(Path(p)))
    m2 = epoch(store, 1)
    new = sorted(m2.paths() - m1.paths())
    assert new
    held = {tmp_path / p for p in m1.paths()}
    durable = {p for h in held for p in h.parents if tmp_path in p.parents}
    want: set[Path] = set()
    for rel in new:  # every file and folder in it, and every folder up to the root...
        top = tmp_path / rel
        want |= {top, *top.rglob("*")}
        for p in top.parents:
            want.add(p)
            if p == tmp_path or p in durable:  # ...or to one whose entry is durable already
                break
    # ...and the new manifest's content at the same time, under its temporary name.
    (manifest,) = [p for p in synced if p.parent == tmp_path / "manifests"]
    assert names.is_manifest_temp(manifest.name)
    synced.remove(manifest)
    assert len(synced) == len(set(synced))  # each once
    assert set(synced) == want
    assert tmp_path not in want  # the root's entries did not change


def test_files_honour_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        store = Store.open(tmp_path / "s", create=True)
        epoch(store, 0)
    finally:
        os.umask(old)
    root = tmp_path / "s"
    assert (root / names.MARKER).stat().st_mode & 0o777 == 0o640
    assert (root / "manifests" / "0000000001.json").stat().st_mode & 0o777 == 0o640
    seg = next((root / "arrangements").glob("*/s-*.seg"))
    assert seg.stat().st_mode & 0o777 == 0o440  # sealed: read-only, within the umask
    leftovers = [p for p in root.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def test_a_damaged_current_manifest_names_the_way_back_and_stops_pruning(tmp_path: Path) -> None:
    store = Store.open(tmp_path, create=True)
    for t in range(3):
        epoch(store, t)
    latest = tmp_path / "manifests" / "0000000003.json"
    latest.write_text(latest.read_text().replace('"epoch":2', '"epoch":7'))
    fresh = Store.open(tmp_path, create=False)
    with pytest.raises(DamagedState) as e:
        fresh.current()
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{latest}: damaged manifest: its digest does not match")
    assert message.endswith(
        f"the previous generation {tmp_path / 'manifests' / '0000000002.json'} is the way back"
    )
    assert "never delete on a doubt" in fresh.prune().skipped


# -- pruning -----------------------------------------------------------------------------------


def test_keeps_the_last_manifests_and_retires_what_only_dropped_ones_named(tmp_path: Path) -> None:
    store = Store.open(tmp_path, create=True)
    first = epoch(store, 0)
    # Epoch 0 again (a re-run): its batches are replaced, so only generation 1 names them.
    for t in (0, *range(1, KEEP_MANIFESTS + 1)):
        epoch(store, t)
    gens = store.generations()
    assert len(gens) == KEEP_MANIFESTS and gens[-1] == KEEP_MANIFESTS + 2
    live = store.current().paths()
    for p in live:
        assert (tmp_path / p).exists(), p
    for p in first.paths():
        assert not (tmp_path / p).exists(), p  # retired at once, though young
    kept_paths = set().union(*(store.generation(g).paths() for g in gens))
    on_disk = {
        str(p.relative_to(tmp_path))
        for area in ("traces", "arrangements")
        for p in (tmp_path / area).glob("*/*")
    }
    assert on_disk == kept_paths


def test_planted_user_files_survive_commits_and_prunes(tmp_path: Path) -> None:
    root = tmp_path / "state"
    outside = tmp_path / "outside"
    (outside / "precious").mkdir(parents=True)
    (outside / "precious" / "thesis.tex").write_text("years of work")
    (outside / "mine.txt").write_text("mine")
    store = Store.open(root, create=True)
    epoch(store, 0)
    tdir = names.trace_dir("rel/edge")
    adir = f"arrangements/{tdir}"
    planted = {
        "traces/logs/2023.log": b"x\n",
        f"traces/{tdir}/notes.txt": b"my notes",
        f"traces/{tdir}/mydata/part-0.parquet": b"user parquet",
        "traces/logs/b-s-1-0123456789ab/part-0.parquet": b"own-looking name, foreign dir",
        f"traces/{tdir}/b-s-2-0123456789ab": b"own-looking name, but a file",
        f"{adir}/README": b"arrangement notes",
        "arrangements/x/y": b"y",
        "scratch/mine": b"scratch of mine",
        "scratch/mine-dir/0123456789abcdef0123456789abcdef": b"deep",
        "manifests/README": b"do not delete",
        "manifests/0000000001.json.bak": b"a backup",
        "manifests/.0000000001.json.tmp": b"not an own temp name",
    }
    for rel, content in planted.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
    # Own names that are links out of the state: never followed, never deleted through.
    (root / "traces" / tdir / "b-k-3-abcdefabcdef").symlink_to(outside / "precious")
    (root / "scratch" / ("f" * 32)).symlink_to(outside / "precious")
    (root / adir / "s-0123456789abcdef.seg").symlink_to(outside)
    (root / "traces" / "rule-linked-0123456789").symlink_to(outside)
    for p in root.rglob("*"):
        age(p, 5 * HOUR)
    before_outside = snapshot(outside)
    for t in range(1, 2 * KEEP_MANIFESTS + 2):
        epoch(store, t)
        assert not store.prune(now=time.time() + 10 * HOUR).skipped  # everything looks old
    assert len(store.generations()) == KEEP_MANIFESTS
    segments = [p for p in (root / adir).iterdir() if names.is_own_segment_file(p.name)]
    assert len(segments) == KEEP_MANIFESTS + 1  # one per kept generation, and the link
    for rel, content in planted.items():
        assert (root / rel).read_bytes() == content, rel
    for link in (
        f"traces/{tdir}/b-k-3-abcdefabcdef",
        f"scratch/{'f' * 32}",
        f"{adir}/s-0123456789abcdef.seg",
        "traces/rule-linked-0123456789",
    ):
        assert (root / link).is_symlink(), link
    assert snapshot(outside) == before_outside


def test_own_orphans_go_after_an_hour_young_ones_stay(tmp_path: Path) -> None:
    store = Store.open(tmp_path, create=True)
    epoch(store, 0)
    old_batch = stage_batch(store, "rel/edge", 5).path  # a writer that failed
    young_batch = stage_batch(store, "out/tri", 5).path  # a writer still at work
    adir = f"arrangements/{names.trace_dir('rel/edge')}"
    old_segment = f"{adir}/{names.segment_name()}"  # a segment: one file
    young_segment = f"{adir}/{names.segment_name()}"
    old_scratch = f"scratch/{names.scratch_name()}"
    young_scratch = f"scratch/{names.scratch_name()}"
    for rel in (old_scratch, young_scratch):
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / "part-run-0123456789abcdef").write_bytes(b"x")  # a spilled run
    for rel in (old_segment, young_segment):
        (tmp_path / rel).write_bytes(b"x")
    old_temp = tmp_path / "manifests" / names.temp_name("0000000002.json")
    young_temp = tmp_path / "manifests" / names.temp_name("0000000002.json")
    old_temp.write_text("{}")
    young_temp.write_text("{}")
    for p in (old_batch, old_segment, old_scratch):
        age(tmp_path / p, 2 * HOUR)
    age(old_temp, 2 * HOUR)
    live = store.current().paths()
    for p in live:
        if (tmp_path / p).exists():
            age(tmp_path / p, 10 * HOUR)  # live folders stay however old
    pruned = store.prune()
    assert set(pruned.folders) == {old_batch, old_segment, old_scratch}
    assert pruned.files == (f"manifests/{old_temp.name}",)
    for p in (old_batch, old_segment, old_scratch, old_temp):
        assert not (tmp_path / p).exists()
    for p in (young_batch, young_segment, young_scratch, young_temp):
        assert (tmp_path / p).exists()
    for p in live:
        assert (tmp_path / p).exists() or p.startswith("arrangements/")


def test_discard_deletes_own_staged_folders_only(tmp_path: Path) -> None:
    store = Store.open(tmp_path, create=True)
    committed = epoch(store, 0)
    live = sorted(committed.paths())
    staged = stage_batch(store, "rel/edge", 1).path
    scratch = f"scratch/{names.scratch_name()}"
    (tmp_path / scratch).mkdir(parents=True)
    (tmp_path / "traces" / "logs").mkdir()
    kept = store.discard([staged, scratch, "traces/logs", "../x", *live])
    assert kept == ["traces/logs", "../x", *live]
    assert not (tmp_path / staged).exists() and not (tmp_path / scratch).exists()
    assert (tmp_path / "traces" / "logs").is_dir()
    for p in live:
        assert (tmp_path / p).exists()


def test_a_commit_never_fails_after_its_manifest_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.open(tmp_path, create=True)

    def broken(now: float | None = None) -> None:
        raise RuntimeError("a Java exception while listing")

    monkeypatch.setattr(store, "prune", broken)
    assert epoch(store, 0).generation == 1
    assert Store.open(tmp_path, create=False).current().generation == 1


def test_batch_files_lists_data_files_with_digests(tmp_path: Path) -> None:
    store = Store.open(tmp_path, create=True)
    b = stage_batch(store, "rel/edge", 4, content=b"abc")
    assert [f.name for f in b.files] == ["part-0-000.snappy.parquet"]
    assert b.files[0].size == 4 and b.files[0].stamp is None
    assert b.files[0].sha256 == hashlib.sha256(b"abc4").hexdigest()
    assert local(store) == tmp_path
    assert Trace("rel/edge", ("c0",)).with_batch(b).rows() == 1


def test_syncs_run_on_daemon_threads_and_their_failures_reach_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed fsync is raised by `sync_many` (after the others ran); the threads are
    daemons, which an interrupted process never waits for at exit."""
    monkeypatch.delenv("WCOJ_SYNCFS", raising=False)
    store = Store.open(tmp_path, create=True)
    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "b").write_bytes(b"b")
    synced: list[Path] = []
    real = files_module._fsync_path

    def failing(path: Path) -> None:
        if Path(path).name == "b":
            raise OSError(5, "Input/output error", str(path))
        real(path)
        synced.append(Path(path))

    monkeypatch.setattr(files_module, "_fsync_path", failing)
    with pytest.raises(OSError, match="Input/output error"):
        store.files.sync_many(["a", "b"])
    assert tmp_path / "a" in synced
    threads = [t for t in threading.enumerate() if t.name.startswith("wcoj-sync")]
    assert threads and all(t.daemon for t in threads)
