"""The state's file operations: local and Hadoop file systems behave alike, and the engine runs
unchanged on a state reached through Hadoop's FileSystem (as for hdfs:// or s3a:// roots)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from oracle import naive_eval
from pyspark.sql import SparkSession

from wcoj_core.engine import Engine
from wcoj_core.meaning import relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.store import files
from wcoj_core.store import store as store_module


@pytest.fixture(params=["local", "hadoop"])
def store(request: pytest.FixtureRequest, spark: SparkSession, tmp_path: Path) -> files.Files:
    if request.param == "local":
        return files.LocalFiles(str(tmp_path))
    return files.HadoopFiles(spark, tmp_path.as_uri())


def test_list_read_create_exclusive_delete(store: files.Files) -> None:
    assert store.list("manifests") == []
    assert store.create_exclusive("manifests/0000000001.json", '{"a": 1}')
    assert not store.create_exclusive("manifests/0000000001.json", '{"a": 2}')
    assert store.read_text("manifests/0000000001.json") == '{"a": 1}'
    assert [name for name, _ in store.list("manifests")] == ["0000000001.json"]
    store.delete("manifests")
    assert store.list("manifests") == []


def test_roots_choose_their_file_system(tmp_path: Path) -> None:
    assert isinstance(files.files_for(str(tmp_path)), files.LocalFiles)
    assert isinstance(files.files_for(tmp_path.as_uri()), files.LocalFiles)
    assert files.has_scheme("hdfs://namenode:8020/wcoj")


def test_the_engine_on_a_hadoop_file_system(
    small: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Manifests through Hadoop's FileSystem (as an hdfs:// root would be), batches through
    pyarrow; no arrangement files are kept for such a state, so every epoch rebuilds its old
    state from the batches and the answers stay exact."""
    monkeypatch.setattr(
        store_module, "files_for", lambda root, factory=None: files.HadoopFiles(small, root)
    )
    query = builtin("triangles")
    specs = relation_specs({"edge": 2})
    root = tmp_path.as_uri() + "/state"
    edges: Counter = Counter()
    epochs = [[(1, 2), (2, 3), (1, 3), (3, 4)], [(2, 4), (1, 4)]]
    for t, pairs in enumerate(epochs):
        engine = Engine(small, root, query, relations=specs)
        engine.persist_index = False  # as for a remote root
        assert isinstance(engine.store.files, files.HadoopFiles)
        rows = [(a, b, 1) for a, b in pairs] + [(b, a, 1) for a, b in pairs]
        for a, b, d in rows:
            edges[(a, b)] += d
        engine.apply_epoch(t, {"edge": small.createDataFrame(rows, "c0 long, c1 long, diff long")})
        got = Counter({tuple(r[:-1]): r[-1] for r in engine.output().collect()})
        assert got == naive_eval(query, {"edge": edges})
    assert (tmp_path / "state" / "manifests").is_dir()
