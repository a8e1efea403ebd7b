"""Memory running out while a batch is read is memory, never damage.

An allocation failure injected where pyarrow decodes a batch file — Arrow's own
(`pa.ArrowMemoryError`, what its memory pools raise: ``malloc of size N failed``), an
``OSError(ENOMEM)`` and a plain `MemoryError` — reaches each reader of batches (a whole read, a
record batch reader, ``wcoj verify``) as `OutOfMemory`, naming the file and saying it is no sign
of damage, never as `DamagedBatch`; the command line says it on one line. With the failure gone,
the state verifies healthy and reads the oracle's answer.

The slow test makes the failure real: a fresh process reading a 4.5 M-row change whole under an
address-space limit it cannot meet (Arrow on the system allocator, so that the limit is what
refuses the allocation), then, the limit lifted, reading it again and verifying the state.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from wcoj_support import set_oracle, updates

from wcoj_assets.outputs import Form, read_output
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import DEFAULT_SPECS, Topology
from wcoj_core import cli
from wcoj_core.check.verify import verify_state
from wcoj_core.errors import DamagedBatch, OutOfMemory

FAILURES = {
    "arrow": lambda: pa.ArrowMemoryError("malloc of size 33554432 failed"),
    "enomem": lambda: OSError(errno.ENOMEM, "Cannot allocate memory"),
    "python": MemoryError,
}


def small_state(tmp_path: Path) -> tuple:
    history = updates(seed=5, epochs=3, nodes=10, inserts=14, deletes=4)
    topology = Topology.of(DEFAULT_SPECS, undirected=["edge"])
    engine = WcojResource(storage=str(tmp_path / "state")).engine(topology)
    for n, changes in enumerate(history):
        table = pa.table(
            {
                "c0": [a for (a, _), _ in changes],
                "c1": [b for (_, b), _ in changes],
                "diff": [d for _, d in changes],
            }
        )
        engine.apply(n, {"edge": table}, replace=True)
    return engine, topology, history


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_an_allocation_failure_reading_a_batch_is_memory_and_the_state_stays_healthy(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    failure: str,
) -> None:
    engine, topology, history = small_state(tmp_path)
    query = topology.query("triangles")

    def fail(*_args: object, **_kwargs: object) -> None:
        raise FAILURES[failure]()

    monkeypatch.setattr(pq.ParquetFile, "read", fail)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", fail)
    readers = {
        "whole": lambda: read_output(engine, query, 2, form=Form.ARROW),
        "reader": lambda: read_output(engine, query, 2, form=Form.BATCHES).read_all(),
        "verify": lambda: verify_state(engine.store),
    }
    for name, read in readers.items():
        with pytest.raises(OutOfMemory) as raised:
            read()
        message = str(raised.value)
        assert not isinstance(raised.value, DamagedBatch), name
        assert isinstance(raised.value, MemoryError), name
        assert ".snappy.parquet: memory ran out reading this batch file" in message, name
        assert "no sign of damage, and nothing was changed" in message, name
    assert cli.main(["verify", str(tmp_path / "state")]) == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "out of memory" in said[0] and "no sign of damage" in said[0]
    assert "damaged" not in said[0]

    monkeypatch.undo()
    assert verify_state(engine.store).ok
    got = Counter()
    for row in read_output(engine, query, 2, form=Form.ARROW).to_pylist():
        got[(row["a"], row["b"], row["c"])] += row["diff"]
    assert got == set_oracle(topology, "triangles", history, 2)


LIMITED = """
import json, resource, sys
from wcoj_assets.outputs import Form, read_output
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import DEFAULT_SPECS, Topology
from wcoj_core.errors import DamagedBatch, OutOfMemory
from wcoj_core.check.verify import verify_state

topology = Topology.of(DEFAULT_SPECS)
engine = WcojResource(storage=sys.argv[1]).engine(topology, create=False)
query = topology.query("triangles")
read_output(engine, query, 0, change=True, form=Form.BATCHES).read_next_batch()  # threads up
with open("/proc/self/status") as f:
    size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (size + (16 << 20), resource.RLIM_INFINITY))
try:
    read_output(engine, query, 0, change=True, form=Form.ARROW)
    said = {"read": "whole"}
except OutOfMemory as e:
    said = {"memory": str(e)}
except DamagedBatch as e:
    said = {"damaged": str(e)}
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
table = read_output(engine, query, 0, change=True, form=Form.ARROW)
said.update(rows=table.num_rows, total=table["diff"].to_numpy().sum().item())
said.update(healthy=verify_state(engine.store).ok)
print(json.dumps(said))
"""


@pytest.mark.slow
def test_a_real_allocation_failure_reading_a_change_whole_is_memory(tmp_path: Path) -> None:
    """The triangles of the complete graph on 300 vertices (4,455,100), one epoch's change of
    143 MB as Arrow columns, read whole with 16 MiB of address space to spare."""
    n = 300
    topology = Topology.of(DEFAULT_SPECS)
    engine = WcojResource(storage=str(tmp_path / "state")).engine(topology)
    edges = [(a, b) for a in range(n) for b in range(a + 1, n)]
    table = pa.table(
        {"c0": [a for a, _ in edges], "c1": [b for _, b in edges], "diff": [1] * len(edges)}
    )
    assert engine.apply(0, {"edge": table}).count("triangles") == n * (n - 1) * (n - 2) // 6
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system"}
    ran = subprocess.run(
        [sys.executable, "-c", LIMITED, str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    said = json.loads(ran.stdout.strip().splitlines()[-1])
    assert "memory ran out reading this batch file" in said["memory"], said
    assert said["rows"] == said["total"] == n * (n - 1) * (n - 2) // 6
    assert said["healthy"] is True
