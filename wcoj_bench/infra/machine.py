"""Facts about the machine and the Spark session a benchmark ran on, for its report and plots.

A figure means little without the machine behind it: how many cores and how much memory, which
Python, Java and Spark, which Spark settings, and how loaded the machine was. `machine_facts`
gathers these without starting anything (the Java facts come from a session that is already
running, when one is given); `machine_label` condenses them for a plot's title.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys
from importlib import metadata
from typing import Any

from pyspark.sql import SparkSession

# The optional packages whose versions a benchmark's figures depend on.
PACKAGES = ("pyspark", "dagster", "duckdb", "kuzu", "scipy", "matplotlib")
# The Spark settings that change what a figure measures.
SPARK_SETTINGS = (
    "spark.driver.memory",
    "spark.executor.memory",
    "spark.executor.pyspark.memory",
    "spark.sql.shuffle.partitions",
    "spark.sql.adaptive.enabled",
)


def cores() -> int:
    """The cores this process may run on (its affinity, where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def memory_bytes() -> int | None:
    """Physical memory, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def load_average() -> float | None:
    """The one-minute load average, or None where the platform has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def machine_facts(spark: SparkSession | None = None) -> dict[str, Any]:
    """Cores, memory, platform, versions and (given a running session) Java and Spark settings."""
    memory = memory_bytes()
    facts: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": cores(),
        "memory_gib": None if memory is None else round(memory / 2**30, 1),
        "platform": platform.platform(terse=True),
        "python": sys.version.split()[0],
        "packages": {p: _version(p) for p in PACKAGES},
    }
    if spark is not None:
        jvm: Any = getattr(spark.sparkContext, "_jvm", None)
        if jvm is not None:
            system = jvm.java.lang.System
            facts["java"] = (
                f"{system.getProperty('java.runtime.name')} {system.getProperty('java.version')}"
            )
        facts["spark_master"] = spark.sparkContext.master
        facts["spark_conf"] = {k: spark.conf.get(k, None) for k in SPARK_SETTINGS}
    return facts


def machine_label(facts: dict[str, Any]) -> str:
    """A short description for a plot's title.

    >>> machine_label({"cores": 2, "memory_gib": 23.4, "spark_master": "local[*]"})
    '2 cores, 23.4 GiB, Spark local[*]'
    >>> machine_label({"cores": 8, "memory_gib": None})
    '8 cores'
    """
    parts = [f"{facts['cores']} cores"]
    if facts.get("memory_gib") is not None:
        parts.append(f"{facts['memory_gib']} GiB")
    if facts.get("spark_master"):
        parts.append(f"Spark {facts['spark_master']}")
    return ", ".join(parts)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


__all__ = ["cores", "load_average", "machine_facts", "machine_label", "memory_bytes"]
