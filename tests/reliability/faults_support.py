"""The world of the fault tests (`test_faults.py`: processes killed, two writers;
`test_faults_disk.py`: full disks, unwritable states): a random undirected graph's state after
epoch 0, epoch 1's changes, and the undisturbed state after epoch 1, checked against the naive
oracle. The `world` fixture (`conftest.py`) is made once per module: the two modules are two
groups of a parallel run (`tests/tiers.py`), so their tests run on two workers at once.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from reliability_support import (
    History,
    build_state,
    contents,
    fingerprint,
    hashes,
    manifest_files,
    referenced_files,
    run_wcoj,
    summed,
)

from wcoj_core.store import names

# The graph: 50,000 edges over 5,000 vertices (a mean degree of 20, about 1,300 triangles). An
# epoch on it stages every trace's batch and every index's segment, which is what the faults
# interrupt; a larger graph only makes each of the dozens of `wcoj apply` runs longer.
VERTICES = 5_000
EDGES = 50_000


@dataclass(frozen=True)
class World:
    """A state after epoch 0, epoch 1's changes, and the undisturbed state after epoch 1."""

    history: History
    base: Path
    base_print: dict[str, str]
    done: Path
    expected: dict[str, str]

    def apply_args(self, state: Path, *extra: str) -> list[str]:
        return self.history.apply_args(state, 1, *extra)


def random_history(seed: int = 11, vertices: int = VERTICES, edges: int = EDGES) -> History:
    """A random undirected graph: 90% of its edges at epoch 0; at epoch 1 the other 10%
    inserted and 5% of the first ones deleted (named in the other direction)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, vertices, 3 * edges)
    b = rng.integers(0, vertices, 3 * edges)
    keep = a != b
    pairs = np.unique(np.stack([np.minimum(a, b), np.maximum(a, b)], 1)[keep], axis=0)
    pairs = pairs[rng.permutation(len(pairs))[:edges]]
    cut = int(0.9 * len(pairs))
    first, later = pairs[:cut], pairs[cut:]
    gone = first[rng.choice(cut, len(pairs) // 20, replace=False)]
    epoch0 = [(int(x), int(y), 1) for x, y in first]
    epoch1 = [(int(x), int(y), 1) for x, y in later] + [(int(y), int(x), -1) for x, y in gone]
    return History([epoch0, epoch1])


def make_world(root: Path) -> World:
    """The world under `root`: epoch 0 applied, epoch 1 applied to a copy (the undisturbed run,
    checked against the naive oracle)."""
    history = random_history().write(root / "in")
    base, done = root / "base", root / "undisturbed"
    build_state(history, base, 0)
    shutil.copytree(base, done, symlinks=True)
    applied = run_wcoj(*history.apply_args(done, 1, "--json"))
    assert applied.code == 0, applied.err
    # The undisturbed run itself is checked against the naive oracle.
    held = contents(done, ["rel/edge", "out/triangles"])
    assert summed(held, "rel/edge") == history.graph(1)
    answer = history.answer(1)
    assert summed(held, "out/triangles") == answer
    assert applied.payload["count"] == sum(answer.values()) > 0
    return World(history, base, fingerprint(base), done, fingerprint(done))


def fresh_copy(world: World, where: Path) -> Path:
    state = where / "state"
    shutil.copytree(world.base, state, symlinks=True)
    return state


def assert_as_before(
    world: World, state: Path, before: dict[str, bytes], files: dict[str, str]
) -> None:
    """The state is its previous generation: manifests byte-identical, every file they name
    byte-identical, the same contents; anything new is a folder wcoj names as its own."""
    assert manifest_files(state) == before
    assert referenced_files(state) == files
    assert fingerprint(state) == world.base_print
    now = hashes(state)
    for rel in set(now) - set(hashes(world.base)):
        parts = rel.split("/")
        assert parts[0] in (names.TRACES, names.ARRANGEMENTS, names.MANIFESTS, names.SCRATCH), rel
        if parts[0] == names.MANIFESTS:
            assert names.is_manifest_temp(parts[1]), rel
        elif len(parts) >= 3:
            assert names.is_own_batch(parts[2]) or names.is_own_segment_file(parts[2]), rel


def assert_undisturbed(world: World, state: Path) -> None:
    assert fingerprint(state) == world.expected
