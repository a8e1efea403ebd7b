"""Where something lives — a state, an input, a landing folder: the one place that tells a path on
this machine from a URI of remote storage.

A `Location` is what a user passes, parsed once: a plain path or a ``file:`` URI is local (its
`path` is a path on this machine); a URI with another scheme (``hdfs://``, ``s3a://``, ``gs://``,
``abfs://``, ...) is remote, reached through pyarrow's file systems (`file_system`) or by Spark
(`spark_uri`). No other module tests a string for a scheme (`tests/core/test_locations.py`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wcoj_core.errors import StateError

if TYPE_CHECKING:
    import pyarrow.fs as pafs

# A scheme (two characters or more: ``C:\\`` is a Windows path) followed by a slash.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/")
_FILE = re.compile(r"file:(//)?", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Location:
    """A place as given (`text`) and its scheme (empty for a path on this machine).

    >>> Location.of("s3a://bucket/state").local, Location.of("file:///tmp/x").path
    (False, '/tmp/x')
    >>> Location.of("edges.txt").path, Location.of("hdfs://nn:8020/w").scheme
    ('edges.txt', 'hdfs')
    """

    text: str
    scheme: str = ""

    @classmethod
    def of(cls, place: str | os.PathLike[str]) -> Location:
        text = os.fspath(place)
        found = _SCHEME.match(text)
        scheme = found.group(1).lower() if found else ""
        return cls(text, "" if scheme == "file" else scheme)

    @property
    def local(self) -> bool:
        return not self.scheme

    @property
    def path(self) -> str:
        """A local place's path as given (a ``file:`` URI's path); a remote one's URI."""
        return _FILE.sub("", self.text, count=1) if self.local else self.text

    def absolute(self) -> str:
        """A local place's absolute path (a remote one's URI without a trailing slash).

        >>> Location.of("file:///tmp/x/").absolute(), Location.of("s3a://b/s/").absolute()
        ('/tmp/x', 's3a://b/s')
        """
        return os.path.abspath(self.path) if self.local else self.text.rstrip("/")

    def spark_uri(self, rel: str = "") -> str:
        """The place (or `rel` inside it) as a URI Spark reads and writes: a local path as a
        ``file://`` URI, whatever file system a cluster's Spark defaults to.

        >>> Location.of("/tmp/s").spark_uri("b-1"), Location.of("s3a://b/s").spark_uri("b-1")
        ('file:///tmp/s/b-1', 's3a://b/s/b-1')
        """
        root = self.absolute()
        full = f"{root}/{rel}" if rel else root
        return f"file://{full}" if self.local else full

    def file_system(self) -> tuple[pafs.FileSystem, str]:
        """The pyarrow file system of the place, and its path in it (``s3a://`` is read as
        ``s3://``). Raises `StateError` (one line) when pyarrow cannot reach it.

        >>> fs, path = Location.of("/tmp/state").file_system()
        >>> type(fs).__name__, path
        ('LocalFileSystem', '/tmp/state')
        """
        import pyarrow as pa
        import pyarrow.fs as pafs

        if self.local:
            return pafs.LocalFileSystem(), self.absolute()
        uri = "s3" + self.text[3:] if self.scheme == "s3a" else self.text
        try:
            fs, path = pafs.FileSystem.from_uri(uri)
        except (pa.ArrowException, OSError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise StateError(f"{self.text}: pyarrow cannot reach it ({first})") from e
        return fs, path.rstrip("/")
