"""The tiers every test falls into, and what a parallel run keeps together (a pytest plugin:
`tests/conftest.py` takes its hook; docs/testing.md).

**Tiers** (markers registered in pyproject.toml, ``--strict-markers``). A test's tier follows
from what it uses, so a new test falls into the right one:

* *fast* (no marker): no JVM, no server — ``make test-fast``;
* ``spark``: a JVM. Added here to every test that uses the `spark` or `small` fixture,
  directly or through another fixture; a test that starts a JVM another way (a subprocess that
  starts Spark) carries the marker by hand;
* ``e2e``: a whole system — the Dagster daemon or webserver, a Postgres server, a Spark
  standalone cluster, the README's quick start, a benchmark's process runs or report. Added here
  to every test marked ``cluster`` (or using a fixture that starts one, `CLUSTER_FIXTURES`); a
  module whose tests start such a system carries ``pytestmark = pytest.mark.e2e``;
* ``slow``: the long real-data tests (by hand).

**Parallel runs** (``make test`` runs ``pytest -n 2 --dist loadgroup``: pytest-xdist, one
process per core). Each worker process has its own session fixtures — its own SparkSession and
JVM — and its own ``tmp_path`` folders; servers and clusters pick free ports. Two kinds of group
keep what must stay together on one worker, one test after another (`xdist_group`, set here):

* ``e2e:FOLDER``: the end-to-end tests of one folder (``e2e:tests/assets``: the Dagster
  daemon, webserver, Postgres and the quick starts; ``e2e:tests/bench``: the benchmark report's
  quick run and the ``dagster job execute`` runs; ``e2e:tests/reliability``: the standalone
  cluster), one after another, so that no two systems of one kind race each other (they start
  JVMs, servers and clusters of their own, and wait on them with timeouts). Two folders' groups
  may run at once, on two workers: the report's quick run is the longest single fixture (its
  local and cluster parts run as two streams at once), and one group of every end-to-end test
  was the whole suite's critical path;
* a module's tests that share a module-scoped fixture (one group per value of a parametrized
  one), so that the fixture is made once, not once per worker. Such a group runs on one
  worker: a long one is split into modules, each its own group, each making the fixture once
  (the fault tests: `test_faults.py` and `test_faults_disk.py`, the world of
  `tests/reliability/faults_support.py`).

pytest-xdist 3.8 passes a group to its scheduler by renaming the test's node id, which pytest
9.2 no longer allows: pyproject.toml keeps pytest below 9.2 until it does (`tests/test_tiers.py`
fails if the groups are lost).
"""

from __future__ import annotations

from collections import Counter

import pytest

SPARK_FIXTURES = frozenset({"spark", "small"})
# Fixtures that start a standalone cluster: `quick` of tests/bench/test_report.py runs the
# report's cluster parts on one of its own.
CLUSTER_FIXTURES = frozenset({"quick"})
E2E = "e2e"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its tier and, where it has one, its `xdist_group`."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if SPARK_FIXTURES & fixtures:
            item.add_marker(pytest.mark.spark)
        if CLUSTER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.cluster)
        if item.get_closest_marker("cluster") is not None:
            item.add_marker(pytest.mark.e2e)
        if item.get_closest_marker("xdist_group") is None:
            group = group_of(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))
    # The longest work first: the end-to-end groups (largest first), then the rest as collected
    # (``make test`` keeps this order: ``--no-loadscope-reorder``).
    sizes = Counter(e2e_group(item) for item in items)
    items.sort(key=lambda item: -sizes[e2e_group(item)] if e2e_group(item) else 0)


def e2e_group(item: pytest.Item) -> str | None:
    """The end-to-end group of a test, None if it has none."""
    marker = item.get_closest_marker("xdist_group")
    if marker is None:
        return None
    name = marker.args[0] if marker.args else marker.kwargs.get("name", "")
    return name if name.startswith(f"{E2E}:") else None


def group_of(item: pytest.Item) -> str | None:
    """``e2e:FOLDER`` for an end-to-end test (its module's folder); for a test using
    module-scoped fixtures, its module (and the fixtures' parameters); None for any other test."""
    if item.get_closest_marker("e2e") is not None:
        folder = item.nodeid.split("::")[0].rpartition("/")[0] or "."
        return f"{E2E}:{folder}"
    info = getattr(item, "_fixtureinfo", None)
    if info is None:  # a doctest
        return None
    shared = sorted(
        name
        for name, defs in info.name2fixturedefs.items()
        if defs and defs[-1].scope in ("module", "class", "package")
    )
    if not shared:
        return None
    callspec = getattr(item, "callspec", None)
    params = [f"{callspec.params[n]}" for n in shared if callspec and n in callspec.params]
    module = item.nodeid.split("::")[0]
    return module + "".join(f":{p}" for p in params)  # no "]" or "@": xdist splits on them
