"""Where a command runs: its state directory and its Spark session.

Contract: `prepare_state` checks and creates a ``--state`` directory before Spark starts (a new
or empty directory, never a file); `state_dir` yields that directory, kept, or a fresh temporary
one removed afterwards. `start_spark` is the only way a command gets its SparkSession: the
active one, or a new one whose console logging is cut down to errors, announced by one line on
stderr (``starting Spark (local[*])…``) because starting a JVM takes several seconds.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

from wcoj_core.cli.console import UsageError, note
from wcoj_core.knobs import knob
from wcoj_core.session import SparkStarter
from wcoj_core.store.location import Location


def prepare_state(path: str | None) -> None:
    """Check that ``--state`` names a new or empty directory, and create it."""
    if path is None:
        return
    state = Path(path)
    if state.is_symlink() and not state.exists():
        from wcoj_core.store.files import dangling

        raise UsageError(f"--state {dangling(path, state)}")
    if state.exists() and not state.is_dir():
        raise UsageError(f"--state {path}: exists and is not a directory")
    if state.is_dir() and any(state.iterdir()):
        raise UsageError(
            f"--state {path}: the directory is not empty; pass a new or empty directory"
        )
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--state {path}: cannot create the directory ({exc.strerror})") from exc


def new_state(path: str) -> bool | None:
    """For a local ``--state`` that holds nothing yet: whether its folder exists (an empty
    folder) — then `unmake_state` can take back a state a failed first epoch created there;
    None otherwise (a state, a remote one, anything else)."""
    where = Location.of(path)
    if not where.local:
        return None
    state = Path(where.path)
    if state.is_symlink() or (state.exists() and not state.is_dir()):
        return None
    if not state.exists():
        return False
    try:
        return None if any(state.iterdir()) else True
    except OSError:
        return None


def unmake_state(path: str, existed: bool) -> None:
    """Remove what a run that committed nothing wrote into a `new_state` folder: its marker and
    empty folders, and the folder itself when the run created it. Anything else found there (a
    commit by another run, a user's file) keeps everything as it is."""
    from wcoj_core.store.names import MARKER

    state = Path(Location.of(path).path)
    try:
        found = [p for p in state.rglob("*") if not p.is_dir() or p.is_symlink()]
        if [p.relative_to(state) for p in found] != [Path(MARKER)]:
            return
        if existed:
            for entry in state.iterdir():
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        else:
            shutil.rmtree(state)
    except OSError:
        return


@contextmanager
def state_dir(path: str | None) -> Iterator[str]:
    """`path` (prepared by `prepare_state`, kept), or a fresh temporary directory, removed after."""
    if path is not None:
        yield path
        return
    scratch = tempfile.mkdtemp(prefix="wcoj-state-")
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def start_spark(master: str | None, conf: Sequence[str] = (), reason: str = "") -> SparkSession:
    """The active session, or a new one for `master` with the ``--conf KEY=VALUE`` settings
    `conf`, announced on stderr with `reason`."""
    return starter(master, conf)(reason or "this command runs in Spark")


def starter(master: str | None, conf: Sequence[str] = ()) -> SparkStarter:
    """A `SparkStarter` for `master` with the ``--conf KEY=VALUE`` settings `conf`: Spark
    starts only when some work needs it, announced on stderr with the reason."""
    settings = spark_settings(conf)
    return SparkStarter(
        master,
        settings,
        announce=lambda line: note(f"{line}…"),
        quiet=knob("WCOJ_DEBUG") != "1",
    )


def spark_settings(conf: Sequence[str]) -> dict[str, str]:
    """``--conf KEY=VALUE`` arguments as Spark settings; a malformed one is a usage error.

    >>> spark_settings(["spark.driver.memory=1g"])
    {'spark.driver.memory': '1g'}
    """
    settings: dict[str, str] = {}
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"--conf {item!r}: expected KEY=VALUE, e.g. spark.driver.memory=1g")
        settings[key.strip()] = value.strip()
    return settings


def add_spark_arguments(p: argparse.ArgumentParser) -> None:
    """``--master`` and ``--conf``: the Spark session a command starts."""
    p.add_argument("--master", metavar="URL", help="Spark master (default local[*])")
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session started, e.g. spark.executor.memory=1g (repeatable)",
    )
