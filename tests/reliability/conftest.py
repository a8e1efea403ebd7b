"""Fixtures of the reliability tests (helpers: `reliability_support`, `faults_support`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from faults_support import World, make_world
from reliability_support import History, small_history


@pytest.fixture()
def history(tmp_path: Path) -> History:
    """16 epochs of a small undirected graph (`small_history`), written as CSV files."""
    return small_history(epochs=16).write(tmp_path / "in")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """The fault tests' world (`faults_support`), made once per module that uses it."""
    return make_world(tmp_path_factory.mktemp("faults"))
