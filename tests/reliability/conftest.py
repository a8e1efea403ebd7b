"""Fixtures of the reliability tests (helpers: `reliability_support`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability_support import History, small_history


@pytest.fixture()
def history(tmp_path: Path) -> History:
    """16 epochs of a small undirected graph (`small_history`), written as CSV files."""
    return small_history(epochs=16).write(tmp_path / "in")
