"""The benchmark report's quick run, made once a session and shared (`report_support`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession
from report_support import QuickRun
from spark_support import interpreted

from wcoj_bench import report


@pytest.fixture(scope="session")
def quick(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuickRun]:
    """``wcoj-bench report --quick`` into a temporary root that starts as a copy of the
    repository's page (an end-to-end fixture: `tests.tiers.CLUSTER_FIXTURES`)."""
    root = tmp_path_factory.mktemp("report")
    shutil.copyfile(report.REPO_PAGE, root / "benchmarks.md")
    before = (root / "benchmarks.md").read_text()
    progress: list[str] = []
    with interpreted(spark):
        status = report.main(["--quick", "--root", str(root)], say=progress.append)
    assert status == 0, progress
    yield QuickRun(root, before, (root / "benchmarks.md").read_text(), progress)
