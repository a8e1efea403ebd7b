"""The names wcoj writes in a state, and the patterns that prove a name is its own.

Everything wcoj creates under a state directory has a name made here, and every name it ever
deletes must match one of the patterns here (pruning, `Store.discard`): a file or folder a user
put into a state never matches, so it is never touched. The layout (docs/state.md)::

    wcoj-state.json                                 MARKER
    manifests/0000000007.json                       manifest_name(7)
    manifests/.0000000007.json.<hex32>.tmp          temp_name(...) while committing
    traces/<trace_dir>/b-<kind>-<time>-<hex12>/     new_batch_path(...)
    arrangements/<trace_dir>/s-<hex16>.seg          new_segment_path(...): a segment, one file
    scratch/<hex32>/                                scratch_name()
"""

from __future__ import annotations

import functools
import hashlib
import re
import uuid

MARKER = "wcoj-state.json"
MANIFESTS = "manifests"
TRACES = "traces"
ARRANGEMENTS = "arrangements"
SCRATCH = "scratch"

# A segment's one file (none for a segment of no rows), by role: the segment itself.
SEGMENT_LAYER = "layer"

_MANIFEST = re.compile(r"(\d{10,})\.json")
_MANIFEST_TEMP = re.compile(r"\.\d{10,}\.json\.[0-9a-f]{32}\.tmp")
_BATCH = re.compile(r"b-([a-z])-(-?\d+)-[0-9a-f]{12}")
_SEGMENT_ONE_FILE = re.compile(r"s-[0-9a-f]{16}\.seg")
_SCRATCH = re.compile(r"[0-9a-f]{32}")
_TRACE_DIR = re.compile(r"(?:[^\W_]|-){0,40}-[0-9a-f]{10}")
# What a batch folder holds when wcoj (pyarrow) or Spark wrote it: Parquet parts, Hadoop's
# checksums of them, Spark's success marker and its attempt folders.
_BATCH_FILE = re.compile(r"\.?(part-[\w.-]+|_SUCCESS)(\.crc)?|_temporary")


@functools.lru_cache(maxsize=4096)
def trace_dir(name: str) -> str:
    """A directory name for a trace: a readable prefix plus a hash of the full name.

    >>> trace_dir("rel/edge")
    'rel-edge-1a02791ee1'
    >>> is_trace_dir(trace_dir("counts/e[c0, c0]/(0,)"))
    True
    """
    readable = "".join(ch if ch.isalnum() else "-" for ch in name)[:40]
    digest = hashlib.sha1(name.encode()).hexdigest()[:10]
    return f"{readable}-{digest}"


def is_trace_dir(name: str) -> bool:
    """Whether `name` has the shape of a `trace_dir` (whichever trace it names)."""
    return _TRACE_DIR.fullmatch(name) is not None


# -- manifests -------------------------------------------------------------------------------


def manifest_name(generation: int) -> str:
    """The file of a committed generation (inside ``manifests/``).

    >>> manifest_name(7)
    '0000000007.json'
    """
    if generation < 0:
        raise ValueError(f"a generation is 0 or more, got {generation}")
    return f"{generation:010d}.json"


def generation_of(name: str) -> int | None:
    """The generation a manifest file holds, None for any other name.

    >>> generation_of("0000000007.json"), generation_of("README"), generation_of("7.json")
    (7, None, None)
    """
    found = _MANIFEST.fullmatch(name)
    return int(found.group(1)) if found else None


def temp_name(name: str) -> str:
    """A fresh temporary name for a file being written as `name` (in the same folder): a
    manifest being committed.

    >>> is_manifest_temp(temp_name("0000000007.json"))
    True
    """
    return f".{name}.{uuid.uuid4().hex}.tmp"


def is_manifest_temp(name: str) -> bool:
    """Whether `name` is a temporary file left by a commit (`temp_name`).

    >>> is_manifest_temp(".0000000007.json.tmp"), is_manifest_temp("0000000007.json")
    (False, False)
    """
    return _MANIFEST_TEMP.fullmatch(name) is not None


# -- batches, segments, scratch ----------------------------------------------------------------


def batch_name(time: int, kind: str) -> str:
    """A fresh batch folder name at `time`, written by `kind` (one letter: ``s`` Spark, ``k``
    the kernel on the driver, ``x`` executors, ...).

    >>> name = batch_name(12, "s")
    >>> name.startswith("b-s-12-"), is_own_batch(name)
    (True, True)
    """
    if re.fullmatch(r"[a-z]", kind) is None:
        raise ValueError(f"a batch kind is one lowercase letter, got {kind!r}")
    return f"b-{kind}-{time}-{uuid.uuid4().hex[:12]}"


def is_own_batch(name: str) -> bool:
    """Whether `name` is a batch folder name wcoj makes (`batch_name`).

    >>> is_own_batch("b-s-3-0123456789ab"), is_own_batch("b-s-3-0123456789"), is_own_batch("logs")
    (True, False, False)
    """
    return _BATCH.fullmatch(name) is not None


def segment_name() -> str:
    """A fresh segment file name (a segment is one file).

    >>> is_own_segment_file(segment_name()), is_own_segment_file("s-1.seg")
    (True, False)
    """
    return f"s-{uuid.uuid4().hex[:16]}.seg"


def is_own_segment_file(name: str) -> bool:
    """Whether `name` is a segment file name wcoj makes (`segment_name`)."""
    return _SEGMENT_ONE_FILE.fullmatch(name) is not None


def is_batch_file(name: str) -> bool:
    """Whether a name inside a batch folder is one wcoj or Spark writes there.

    >>> is_batch_file("part-0-000.snappy.parquet"), is_batch_file(".part-00000-x.parquet.crc")
    (True, True)
    >>> is_batch_file("_SUCCESS"), is_batch_file("notes.txt")
    (True, False)
    """
    return _BATCH_FILE.fullmatch(name) is not None


def scratch_name() -> str:
    """A fresh scratch folder name.

    >>> is_own_scratch(scratch_name()), is_own_scratch("mine")
    (True, False)
    """
    return uuid.uuid4().hex


def is_own_scratch(name: str) -> bool:
    """Whether `name` is a scratch folder name wcoj makes (`scratch_name`)."""
    return _SCRATCH.fullmatch(name) is not None


# -- paths relative to the state ---------------------------------------------------------------


def new_batch_path(trace: str, time: int, kind: str) -> str:
    """A fresh batch folder, relative to the state, for trace `trace` at `time`.

    >>> new_batch_path("rel/edge", 3, "k").startswith("traces/rel-edge-1a02791ee1/b-k-3-")
    True
    """
    return f"{TRACES}/{trace_dir(trace)}/{batch_name(time, kind)}"


def new_segment_path(trace: str) -> str:
    """A fresh segment file, relative to the state, for trace `trace`.

    >>> is_segment_path(new_segment_path("rel/edge"))
    True
    """
    return f"{ARRANGEMENTS}/{trace_dir(trace)}/{segment_name()}"


def is_batch_path(path: str) -> bool:
    """Whether `path` is ``traces/<trace dir>/<own batch name>``.

    >>> is_batch_path("traces/rel-edge-1a02791ee1/b-s-3-0123456789ab")
    True
    >>> is_batch_path("traces/../b-s-3-0123456789ab"), is_batch_path("/tmp/b-s-3-0123456789ab")
    (False, False)
    """
    parts = path.split("/")
    return (
        len(parts) == 3
        and parts[0] == TRACES
        and is_trace_dir(parts[1])
        and parts[1] not in (".", "..")
        and is_own_batch(parts[2])
    )


def is_segment_path(path: str) -> bool:
    """Whether `path` is ``arrangements/<trace dir>/<own segment file>``.

    >>> is_segment_path("arrangements/rel-edge-1a02791ee1/s-0123456789abcdef.seg")
    True
    >>> is_segment_path("arrangements/rel-edge-1a02791ee1/s-0123456789abcdef")
    False
    """
    parts = path.split("/")
    return (
        len(parts) == 3
        and parts[0] == ARRANGEMENTS
        and is_trace_dir(parts[1])
        and is_own_segment_file(parts[2])
    )


def is_plain_file_name(name: str) -> bool:
    """Whether `name` is one file name inside a folder (no separator, not ``.`` or ``..``).

    >>> is_plain_file_name("part-0-000.snappy.parquet"), is_plain_file_name("../x")
    (True, False)
    """
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")
