"""The tiers and the parallel run's groups (`tiers`), on a small suite of their own.

A throwaway suite run by pytest with the `tiers` plugin: a test using a fixture named ``spark``
is in the ``spark`` tier; a ``cluster`` test and a module marked ``e2e`` are ``e2e``; the rest
are fast. Run on two pytest-xdist workers (``--dist loadgroup``, as ``make test`` runs), the
end-to-end tests of one folder run on one worker, a module-scoped fixture is made once, and a parametrized
one once per value — which fails as soon as pytest-xdist stops honouring the groups (it did with
pytest 9.2).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SUITE = {
    "pytest.ini": """\
[pytest]
markers =
    spark: a JVM
    e2e: a whole system
    cluster: a cluster
    slow: long
""",
    "conftest.py": """\
import os
import pytest


def record(what):
    with open(os.environ["TIERS_LOG"], "a") as log:
        log.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {what}\\n")


@pytest.fixture(scope="session")
def spark():
    return "a session"


@pytest.fixture(autouse=True)
def where(request):
    record(request.node.name)
""",
    "test_plain.py": """\
import pytest


@pytest.mark.parametrize("i", range(8))
def test_fast(i):
    pass


def test_spark(spark):
    pass
""",
    "test_shared.py": """\
import pytest
from conftest import record


@pytest.fixture(scope="module")
def world():
    record("made world")


@pytest.fixture(scope="module", params=["left", "right"])
def side(request):
    record(f"made side {request.param}")
    return request.param


@pytest.mark.parametrize("i", range(4))
def test_world(world, i):
    pass


@pytest.mark.parametrize("i", range(3))
def test_side(side, i):
    pass
""",
    "test_system.py": """\
import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("i", range(3))
def test_server(i):
    pass
""",
    "test_cluster.py": """\
import pytest


@pytest.mark.cluster
def test_on_a_cluster():
    pass


def test_beside_it():
    pass
""",
    "bench/test_report.py": """\
import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("i", range(3))
def test_report(i):
    pass
""",
}


def pytest_run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest with the `tiers` plugin on the suite in `root` (none of this run's settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tiers", "-p", "no:cacheprovider", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PYTHONPATH": str(HERE), "TIERS_LOG": str(root / "log")},
    )


@pytest.fixture()
def suite(tmp_path: Path) -> Path:
    for name, text in SUITE.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def selected(root: Path, marks: str) -> set[str]:
    done = pytest_run(root, "--collect-only", "-q", "-m", marks)
    assert done.returncode == 0, done.stdout + done.stderr
    return {line.split("::")[1] for line in done.stdout.splitlines() if "::" in line}


def test_a_test_falls_into_its_tier_by_what_it_uses(suite: Path) -> None:
    assert selected(suite, "spark") == {"test_spark"}
    e2e = {"test_server[0]", "test_server[1]", "test_server[2]", "test_on_a_cluster"}
    e2e |= {f"test_report[{i}]" for i in range(3)}
    assert selected(suite, "e2e") == e2e
    fast = selected(suite, "not spark and not e2e and not slow")
    assert "test_beside_it" in fast and "test_fast[0]" in fast and not fast & e2e


def test_two_workers_keep_the_groups_together(suite: Path) -> None:
    done = pytest_run(suite, "-n", "2", "--dist", "loadgroup", "-v")
    assert done.returncode == 0, done.stdout + done.stderr
    # One group per folder's end-to-end tests.
    assert "test_system.py::test_server[0]@e2e:." in done.stdout, done.stdout
    assert "test_cluster.py::test_on_a_cluster@e2e:." in done.stdout, done.stdout
    assert "bench/test_report.py::test_report[0]@e2e:bench" in done.stdout, done.stdout
    workers: dict[str, set[str]] = defaultdict(set)
    made: list[str] = []
    for line in (suite / "log").read_text().splitlines():
        worker, what = line.split(" ", 1)
        if what.startswith("made "):
            made.append(what)
        else:
            workers[what].add(worker)
    assert sorted(made) == ["made side left", "made side right", "made world"]
    assert len(set().union(*(workers[f"test_server[{i}]"] for i in range(3)))) == 1
    assert workers["test_on_a_cluster"] == workers["test_server[0]"]
    assert len(set().union(*(workers[f"test_report[{i}]"] for i in range(3)))) == 1
    assert len(set().union(*(workers[f"test_world[{i}]"] for i in range(4)))) == 1
    assert len(set().union(*workers.values())) == 2, "both workers ran tests"
