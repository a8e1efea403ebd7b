"""The kernel's compiled inner loops (`_native.c`), loaded once per process, never stale.

`pip install` builds the C extension `wcoj_core.kernel._native` (setup.py), stamped with a hash
of its source. At import this module checks the stamp against the source beside it (an editable
checkout whose C source has moved on since its install, a merge, a pull) and, when the module
is missing or stale, builds it once with the C compiler Python was built with, into a cache a
fresh process finds again (``$WCOJ_NATIVE_CACHE``, else ``$XDG_CACHE_HOME/wcoj`` or
``~/.cache/wcoj``; a temporary folder when that is not writable). A missing, stale or
unwritable cache costs one build, never a wrong answer; no C compiler at all is an error that
says what to do. A user of an installed package pays nothing: the module is loaded in well
under a millisecond, and Spark's worker daemon loads it before it forks its workers.

Why C and not numba: measured on this machine (docs/benchmarks.md, "The compiled kernel"),
`import numba` alone costs more than a whole fresh `wcoj apply` of 1,000 changes may take, and
its compiled functions need a writable cache or a compile of seconds in every new process
(every executor worker included); a C extension imports in a fraction of a millisecond and
builds wherever the package is installed, gcc and Python's headers being on every machine we
use.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

from wcoj_core.errors import WcojError
from wcoj_core.knobs import knob

SOURCE = Path(__file__).with_name("_native.c")
NAME = "wcoj_core.kernel._native"


def source_hash(path: Path = SOURCE) -> str | None:
    """The stamp a build of `path` carries (None when the source is not shipped)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def cache_dir() -> Path:
    """Where modules built on first use are kept."""
    given = knob("WCOJ_NATIVE_CACHE")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wcoj"


def _load_file(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def build(target: Path, digest: str) -> None:
    """Compile the source into `target` (written beside it, then renamed into place)."""
    import subprocess  # (only to build: a process that finds its module never needs it)

    cc = (sysconfig.get_config_var("CC") or "cc").split()
    include = sysconfig.get_paths()["include"]
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.part")
    os.close(fd)
    command = [
        *cc,
        "-O3",
        "-std=gnu11",
        "-shared",
        "-fPIC",
        f"-I{include}",
        f'-DWCOJ_SOURCE_HASH="{digest}"',
        str(SOURCE),
        "-lz",  # zlib's CRC-32, which checks a segment's blocks
        "-o",
        tmp,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise WcojError(
                f"the kernel's compiled module could not be built ({' '.join(command[:1])} "
                f"failed: {done.stderr.strip()[-400:]}); reinstall wcoj with `pip install` on a "
                "machine with a C compiler and Python's headers"
            )
        os.replace(tmp, target)
    except FileNotFoundError as e:
        raise WcojError(
            f"the kernel's compiled module is missing or out of date and no C compiler was "
            f"found ({e.filename}); reinstall wcoj with `pip install`"
        ) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _built(digest: str) -> ModuleType:
    """The module for source `digest` from the cache, built there first if need be."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    name = f"_native-{digest}{suffix}"
    for folder in (cache_dir(), Path(tempfile.gettempdir()) / f"wcoj-native-{os.getuid()}"):
        target = folder / name
        if target.exists():
            module = _load_file(target)
            if getattr(module, "SOURCE_HASH", None) == digest:
                return module
        try:
            build(target, digest)
        except OSError:
            continue  # not writable: the next place
        return _load_file(target)
    raise WcojError(
        "the kernel's compiled module could not be written anywhere (the cache "
        f"{cache_dir()} and the temporary folder are not writable); set WCOJ_NATIVE_CACHE"
    )


def load() -> ModuleType:
    """The compiled module matching the source beside this file."""
    digest = source_hash()
    try:
        from wcoj_core.kernel import _native  # pyright: ignore[reportAttributeAccessIssue]

        if digest is None or getattr(_native, "SOURCE_HASH", None) == digest:
            return _native
    except ImportError:
        pass
    if digest is None:
        raise WcojError(
            "the kernel's compiled module is missing and its source is not installed; "
            "reinstall wcoj with `pip install`"
        )
    return _built(digest)


# When a search faults on a mapped layer (its pages not in memory), the kernel can read the rest
# of the call's pages ahead, all at once (`_native.c`, "reading ahead from disk"):
# ``WCOJ_READ_AHEAD`` = ``faults`` (the default), ``never`` or ``always`` (every call; tests).
# It is the one way a cold segment's pages are read ahead (docs/benchmarks.md, "One way to read
# a cold segment": the A/B that kept it).
READ_AHEAD_MODES = {"never": 0, "faults": 1, "always": 2}


def read_ahead_mode(value: str | None) -> int:
    """The kernel's read-ahead mode named by ``WCOJ_READ_AHEAD`` (unset: faults).

    >>> read_ahead_mode(None), read_ahead_mode("never")
    (1, 0)
    """
    if not value:
        return READ_AHEAD_MODES["faults"]
    try:
        return READ_AHEAD_MODES[value.strip().lower()]
    except KeyError:
        raise WcojError(
            f"WCOJ_READ_AHEAD={value!r}: expected one of {', '.join(READ_AHEAD_MODES)}"
        ) from None


native = load()
native.read_ahead(read_ahead_mode(knob("WCOJ_READ_AHEAD")))
