"""Process-wide knobs: every ``WCOJ_*`` environment variable the product reads, in one table.

A knob changes how a process runs, never what it answers. Code reads one through `knob`, which
refuses a name missing from `KNOBS`, so this table (and the one in docs/cli.md, which a test
holds to it) names them all. The other process-wide settings live beside the code they govern:
the allocator's (`memory.keep_freed_memory`) and the compiled kernel's build
(`kernel.native`), each switched by a knob below.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Knob:
    name: str
    default: str
    meaning: str


KNOBS = {
    k.name: k
    for k in (
        Knob("WCOJ_DEBUG", "0", "1: a failing command shows its traceback and Spark's log"),
        Knob(
            "WCOJ_NATIVE_CACHE",
            "$XDG_CACHE_HOME/wcoj or ~/.cache/wcoj",
            "where the compiled kernel is kept between processes",
        ),
        Knob("WCOJ_READ_AHEAD", "faults", "the kernel's read-ahead: faults, never or always"),
        Knob("WCOJ_KEEP_MEMORY", "1", "0: leave glibc's allocator (mallopt) as it is"),
        Knob("WCOJ_SYNCFS", "0", "1: a commit is made durable by one syncfs, not an fsync a file"),
        Knob("WCOJ_SPARK_MASTER", "local[*]", "the default Dagster code location's Spark master"),
        Knob("WCOJ_EPOCH_START", "2020-01-01", "the default code location's first epoch (day)"),
        Knob("WCOJ_SENSOR_SECONDS", "30", "the default code location's sensor interval, seconds"),
    )
}


def knob(name: str) -> str | None:
    """The environment's value of knob `name`, None when unset or empty.

    >>> knob("NO_SUCH_KNOB")
    Traceback (most recent call last):
    KeyError: 'NO_SUCH_KNOB is not a knob: add it to wcoj_core.knobs.KNOBS'
    """
    if name not in KNOBS:
        raise KeyError(f"{name} is not a knob: add it to wcoj_core.knobs.KNOBS")
    return os.environ.get(name) or None
