"""The few file operations the state needs, on a local disk or any Hadoop file system.

`StateStore` keeps its data in Parquet written by Spark (so any path Spark can write works) and
its manifests in small JSON files, which it lists, reads, creates exclusively and deletes through
this interface:

* `LocalFiles` — plain paths and ``file://`` URIs, with Python's file API. Creating a manifest
  exclusively is a hard link of a fully written temporary file, atomic on POSIX file systems.
* `HadoopFiles` — ``hdfs://``, ``s3a://``, ``abfs://``, ... through the Hadoop ``FileSystem`` of
  the Spark session (same credentials and settings as Spark's own reads and writes). Creating
  exclusively writes a temporary file and renames it; the rename is atomic and refuses an
  existing target on HDFS; on object stores without atomic rename, run one writer at a time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import SparkSession


class Files(Protocol):
    """File operations relative to a root; names are '/'-separated relative paths."""

    root: str

    def uri(self, rel: str) -> str: ...

    def list(self, rel: str) -> list[tuple[str, float]]: ...

    def read_text(self, rel: str) -> str: ...

    def create_exclusive(self, rel: str, text: str) -> bool: ...

    def delete(self, rel: str) -> None: ...


def has_scheme(root: str) -> bool:
    """True for a URI with a scheme other than ``file``.

    >>> has_scheme("s3a://bucket/state"), has_scheme("file:///tmp/x"), has_scheme("/tmp/x")
    (True, False, False)
    """
    scheme, sep, _ = root.partition("://")
    return bool(sep) and scheme != "file"


class LocalFiles:
    """A local directory."""

    def __init__(self, root: str) -> None:
        path = root[len("file://") :] if root.startswith("file://") else root
        self.path = Path(path).absolute()
        self.root = str(self.path)

    def uri(self, rel: str) -> str:
        return str(self.path / rel)

    def list(self, rel: str) -> list[tuple[str, float]]:
        folder = self.path / rel
        if not folder.is_dir():
            return []
        return [(p.name, p.stat().st_mtime) for p in folder.iterdir()]

    def read_text(self, rel: str) -> str:
        return (self.path / rel).read_text()

    def create_exclusive(self, rel: str, text: str) -> bool:
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "w") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())  # the manifest is durable before it becomes visible
            os.link(tmp, target)  # fails if the target exists: atomic create-exclusive
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def delete(self, rel: str) -> None:
        target = self.path / rel
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
            return
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # nothing to delete
            target.unlink()


class HadoopFiles:
    """A directory on any file system Hadoop (and so Spark) can reach."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.root = root.rstrip("/")
        # py4j is the only way to Hadoop's FileSystem from Python.
        jvm: Any = spark._jvm
        jsc: Any = spark.sparkContext._jsc
        self._Path = jvm.org.apache.hadoop.fs.Path
        self._jvm = jvm
        conf = jsc.hadoopConfiguration()
        self._fs = self._Path(self.root).getFileSystem(conf)

    def _p(self, rel: str) -> Any:
        return self._Path(f"{self.root}/{rel}")

    def uri(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def list(self, rel: str) -> list[tuple[str, float]]:
        folder = self._p(rel)
        if not self._fs.exists(folder):
            return []
        return [
            (s.getPath().getName(), s.getModificationTime() / 1000.0)
            for s in self._fs.listStatus(folder)
        ]

    def read_text(self, rel: str) -> str:
        stream = self._fs.open(self._p(rel))
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def create_exclusive(self, rel: str, text: str) -> bool:
        target = self._p(rel)
        folder, _, name = rel.rpartition("/")
        tmp = self._p(f"{folder}/.{name}.{uuid.uuid4().hex}.tmp")
        out = self._fs.create(tmp, False)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        try:
            if self._fs.exists(target):
                return False
            return bool(self._fs.rename(tmp, target))
        finally:
            self._fs.delete(tmp, False)

    def delete(self, rel: str) -> None:
        self._fs.delete(self._p(rel), True)


def files_for(spark: SparkSession, root: str) -> Files:
    """The file operations for a state root: local for paths, Hadoop for other URIs."""
    return HadoopFiles(spark, root) if has_scheme(root) else LocalFiles(root)
