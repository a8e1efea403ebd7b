"""Shared fixtures: one session-scoped SparkSession for the whole test run; the test markers.

Markers (registered in pyproject.toml, ``--strict-markers``): ``spark`` is added here to every
test that uses the `spark` or `small` fixture, directly or through another fixture; a test that
starts a JVM another way carries it by hand. ``cluster`` marks tests that start a Spark
standalone cluster, ``slow`` the long real-data tests. ``make test-fast`` runs the rest:
``pytest -m "not spark and not cluster and not slow"``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from pyspark.sql import SparkSession
from spark_support import interpreted

from wcoj_core import spark as wspark

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SPARK_FIXTURES = frozenset({"spark", "small"})
# Fixtures that start a standalone cluster: `quick` of tests/bench/test_report.py runs the
# report's cluster parts on one of its own.
CLUSTER_FIXTURES = frozenset({"quick"})

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
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that needs the shared SparkSession ``spark``, and ``cluster`` every test
    whose fixtures start a standalone cluster."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if SPARK_FIXTURES & fixtures:
            item.add_marker(pytest.mark.spark)
        if CLUSTER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.cluster)
