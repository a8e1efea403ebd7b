"""The one file interface: a state's files on this machine's disk and on remote storage (through
a pyarrow file system) behave alike, and the engine runs unchanged on a state reached through a
pyarrow file system that is not the local one (as an hdfs:// or s3a:// root is)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from oracle import naive_eval
from pyspark.sql import SparkSession

from wcoj_core.engine import Engine
from wcoj_core.errors import StateError
from wcoj_core.meaning import relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.store import files
from wcoj_core.store import store as store_module
from wcoj_core.store.location import Location
from wcoj_core.store.manifest import FileRef


def remote(root: str) -> files.Files:
    """`root`'s files through a pyarrow file system that is not the local one: every call takes
    the remote storage's way (no fsync, no hard link, no stat)."""
    over = pafs.SubTreeFileSystem("/", pafs.LocalFileSystem())
    return files.Files(root, over=(over, Location.of(root).absolute().lstrip("/")))


@pytest.fixture(params=["local", "remote"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> files.Files:
    found = files.Files(str(tmp_path)) if request.param == "local" else remote(tmp_path.as_uri())
    assert found.local == (request.param == "local")
    return found


def test_list_read_create_exclusive_delete(state: files.Files) -> None:
    assert state.names("manifests") == []
    assert state.create_exclusive("manifests/0000000001.json", '{"a": 1}')
    assert not state.create_exclusive("manifests/0000000001.json", '{"a": 2}')
    assert state.read_text("manifests/0000000001.json") == '{"a": 1}'
    assert state.names("manifests") == ["0000000001.json"]  # no temporary file left
    assert state.kind("manifests") is files.Kind.DIR
    assert state.kind("manifests/0000000001.json") is files.Kind.FILE
    state.delete("manifests")
    assert state.names("manifests") == [] and state.kind("manifests") is None


def test_put_ref_verify_and_remove_dir(state: files.Files, tmp_path: Path) -> None:
    state.mkdirs("traces/t/b-1")
    ref = state.put("traces/t/b-1/part-0", b"abcd")
    assert (tmp_path / "traces/t/b-1/part-0").read_bytes() == b"abcd"
    assert (ref.stamp is not None) == state.local
    assert state.ref("traces/t/b-1/part-0") == FileRef("part-0", 4, ref.sha256)
    assert state.verify("traces/t/b-1/part-0", ref) is None
    wrong = FileRef("part-0", 4, "0" * 64)
    assert "differs from the manifest's" in str(state.verify("traces/t/b-1/part-0", wrong))
    assert state.verify("traces/t/b-1/part-0", wrong, digest=False) is None
    longer = FileRef("part-0", 5, ref.sha256)
    assert state.verify("traces/t/b-1/part-0", longer) == "is 4 bytes, the manifest says 5"
    assert state.verify("traces/t/b-1/part-1", ref) == "missing"
    assert state.verify("traces/t/b-1", ref) == "is not a file"
    assert [(e.name, e.kind) for e in state.entries("traces/t")] == [("b-1", files.Kind.DIR)]
    assert not state.remove_dir("traces/t/b-1")  # holds a file: kept
    state.delete("traces/t/b-1/part-0")
    assert state.remove_dir("traces/t/b-1") and state.kind("traces/t/b-1") is None


def test_roots_choose_their_file_system(tmp_path: Path) -> None:
    assert files.Files(str(tmp_path)).local and files.Files(tmp_path.as_uri()).local
    assert files.Files(tmp_path.as_uri()).root == str(tmp_path)
    assert not Location.of("hdfs://namenode:8020/wcoj").local
    with pytest.raises(StateError, match="pyarrow cannot reach it") as e:
        files.Files("hdfs://namenode:8020/wcoj")  # no libhdfs here
    assert "\n" not in str(e.value)


def test_the_engine_on_a_remote_file_system(
    small: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Manifests and the driver's batches through a pyarrow file system that is not the local
    one (as an hdfs:// root's are); no arrangement files are kept for such a state, so every
    epoch rebuilds its old state from the batches and the answers stay exact."""
    monkeypatch.setattr(store_module, "Files", remote)
    query = builtin("triangles")
    specs = relation_specs({"edge": 2})
    root = tmp_path.as_uri() + "/state"
    edges: Counter = Counter()
    epochs = [[(1, 2), (2, 3), (1, 3), (3, 4)], [(2, 4), (1, 4)]]
    for t, pairs in enumerate(epochs):
        engine = Engine(small, root, query, relations=specs)
        engine.persist_index = False  # as for a remote root
        assert not engine.store.files.local and engine.batches.files is engine.store.files
        rows = [(a, b, 1) for a, b in pairs] + [(b, a, 1) for a, b in pairs]
        for a, b, d in rows:
            edges[(a, b)] += d
        engine.apply(t, {"edge": small.createDataFrame(rows, "c0 long, c1 long, diff long")})
        got = Counter({tuple(r[:-1]): r[-1] for r in engine.output().collect()})
        assert got == naive_eval(query, {"edge": edges})
    assert (tmp_path / "state" / "manifests").is_dir()
