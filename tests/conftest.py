"""Shared fixtures: one SparkSession per test process (each pytest-xdist worker has its own),
the shared data, hypothesis' profiles; the tiers' hook (`tiers`: which tier a test is in, and
what a parallel run keeps together).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from pyspark.sql import SparkSession
from report_support import QuickRun
from spark_support import interpreted
from tiers import pytest_collection_modifyitems  # noqa: F401 (the tiers' hook)

from wcoj_core import spark as wspark

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
# Every JVM the suite starts, here or in a process a test starts, reads tests/spark-conf (its
# JIT stops at C1: the file says why), unless the developer points Spark at a folder of their own.
os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).resolve().parent / "spark-conf"))

settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
settings.register_profile(
    "dev",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = wspark.session(
        "local[2]",
        conf={"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "4g"},
        app_name="wcoj-tests",
    )
    yield session
    session.stop()


@pytest.fixture()
def small(spark: SparkSession) -> Iterator[SparkSession]:
    """The session, tuned for tiny data: interpreted expressions beat compiling code per plan."""
    with interpreted(spark):
        yield spark


@pytest.fixture(scope="session")
def quick(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuickRun]:
    """``wcoj-bench report --quick`` into a temporary root that starts as a copy of the
    repository's page, once a session (`report_support`; an end-to-end fixture:
    `tiers.CLUSTER_FIXTURES`)."""
    import shutil

    from wcoj_bench import report

    root = tmp_path_factory.mktemp("report")
    shutil.copyfile(report.REPO_PAGE, root / "benchmarks.md")
    before = (root / "benchmarks.md").read_text()
    progress: list[str] = []
    with interpreted(spark):
        status = report.main(["--quick", "--root", str(root)], say=progress.append)
    assert status == 0, progress
    yield QuickRun(root, before, (root / "benchmarks.md").read_text(), progress)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
