"""The benchmark report's quick run, shared (the `quick` fixture of `tests/conftest.py`, once a session).

``wcoj-bench report --quick`` runs every part as its own process on tiny generated graphs (the
local parts and the cluster parts as two streams at once): the longest fixture of the suite.
`test_report.py` checks the report itself (each part's JSON, the page, the
plots); the parts' own tests read that run's results where they would only run the same part
again (`QuickRun.part`): `test_cold.py` (the cold part: whole processes, a fresh JVM per
recompute) and `test_dagster_run.py` (a fresh ``dagster job execute`` per epoch and job).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class QuickRun:
    root: Path
    before: str  # the page before the run
    after: str  # the page after it
    progress: list[str]

    def part(self, name: str) -> dict:
        """Part `name`'s JSON line as its command printed it: the report's record of it keeps
        the machine apart from the result."""
        record = json.loads((self.root / "bench" / f"{name}.json").read_text())
        return {**record["result"], "machine": record["machine"]}
