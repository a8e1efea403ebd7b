"""The default memory budget: a quarter of the machine's memory, or of the process's own limit
when that is smaller (an address-space limit here; a control group's ``memory.max`` is read the
same way)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from wcoj_core.budget import DEFAULT_FLOOR, default_budget, machine_memory, process_limit

PROBE = """
import resource, sys
cap = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
from wcoj_core.budget import default_budget
b = default_budget()
print(b.bytes, b.source)
"""


def test_without_a_limit_the_budget_is_a_quarter_of_the_machine() -> None:
    total = machine_memory()
    assert total is not None
    limit = process_limit()
    if limit is not None and limit[0] < total:
        pytest.skip(f"this process has a smaller limit: {limit[1]}")
    budget = default_budget()
    assert budget.bytes == max(DEFAULT_FLOOR, total // 4)
    assert "this machine's" in budget.source


def test_an_address_space_limit_sets_the_default_budget() -> None:
    cap = 2 << 30
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(cap)], capture_output=True, text=True, check=True
    )
    size, source = done.stdout.split(" ", 1)
    assert int(size) == cap // 4
    assert "address-space limit, 2.0 GiB" in source
