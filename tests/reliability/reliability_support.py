"""Helpers for the reliability tests: running the ``wcoj`` and ``wcoj-bench`` scripts, watching and
comparing states.

Imported by the test modules of this folder (``from reliability_support import ...``).

*State contents* are what a state directory means, independent of how it is laid out: for every
trace of the current manifest, the multiset of ``(data..., time)`` with its summed multiplicity
(batch paths carry random names, so two runs that did the same work differ only there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from wcoj_core.state import StateStore

WCOJ = Path(sys.executable).with_name("wcoj")
WCOJ_BENCH = Path(sys.executable).with_name("wcoj-bench")
Contents = tuple[int | None, dict[str, Counter[tuple[int, ...]]]]


def wcoj_command(*argv: str | os.PathLike[str]) -> list[str]:
    return [str(WCOJ), *map(str, argv)]


def run_wcoj(
    *argv: str | os.PathLike[str], timeout: float = 900, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``wcoj`` script to the end."""
    return subprocess.run(
        wcoj_command(*argv), capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd
    )


def run_wcoj_bench(
    *argv: str | os.PathLike[str], timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``wcoj-bench`` script (its ``cluster`` command) to the end."""
    return subprocess.run(
        [str(WCOJ_BENCH), *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_wcoj(*argv: str | os.PathLike[str], cwd: Path | None = None) -> subprocess.Popen[str]:
    """Start the ``wcoj`` script in its own process group (so its JVM can be killed with it)."""
    return subprocess.Popen(
        wcoj_command(*argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,
    )


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a process started by `start_wcoj` together with its children (the driver JVM)."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)


def wait_for(
    ready: Callable[[], bool], what: str, timeout: float = 600, poll: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)


def staged_batches(state: Path, epoch: int) -> list[Path]:
    """Batch directories of `epoch` under a state's traces (staged or committed)."""
    return sorted((state / "traces").glob(f"*/b-*-{epoch}-*"))


def manifest_files(state: Path) -> dict[str, str]:
    """The committed manifests of a state, name -> text."""
    folder = state / "manifests"
    return {p.name: p.read_text() for p in sorted(folder.glob("*.json"))}


def committed_epoch(state: Path) -> int | None:
    """The epoch of the highest committed generation, read without Spark."""
    manifests = manifest_files(state)
    if not manifests:
        return None
    return json.loads(manifests[max(manifests)])["epoch"]


def contents(spark: SparkSession, state: Path) -> Contents:
    """The state's epoch and, per trace, its consolidated ``(data..., time) -> diff``."""
    store = StateStore(spark, state)
    manifest = store.current()
    traces: dict[str, Counter[tuple[int, ...]]] = {}
    for name, trace in sorted(manifest.traces.items()):
        total: Counter[tuple[int, ...]] = Counter()
        for row in store.read(trace, trace.batches).collect():
            total[(*(row[c] for c in trace.columns), row["time"])] += row["diff"]
        traces[name] = Counter({k: v for k, v in total.items() if v != 0})
    return manifest.epoch, traces


def output_multiset(contents: Contents, query: str) -> Counter[tuple[int, ...]]:
    """The accumulated output of `query` in some state contents (times summed away)."""
    final: Counter[tuple[int, ...]] = Counter()
    for (*data, _time), diff in contents[1][f"out/{query}"].items():
        final[tuple(data)] += diff
    return Counter({k: v for k, v in final.items() if v != 0})


def relation_multiset(contents: Contents, relation: str) -> Counter[tuple[int, ...]]:
    final: Counter[tuple[int, ...]] = Counter()
    for (*data, _time), diff in contents[1][f"rel/{relation}"].items():
        final[tuple(data)] += diff
    return Counter({k: v for k, v in final.items() if v != 0})


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def errors(text: str) -> Sequence[str]:
    return [
        line
        for line in text.splitlines()
        if line.startswith(("wcoj: error:", "wcoj-bench: error:"))
    ]
