"""Damage below the file system: never a wrong committed answer.

Bit rot, a bad disk or a block-level restore change a file's bytes while its size, inode and
times stay what they were, so nothing the file system says gives the damage away. Each case
copies a state of a few thousand edges (epochs 0 and 1 of an undirected graph: segments of
many 4 KiB blocks, a directory, recent segments, every batch kind), picks a file kind (the
marker, the manifest, a batch of the relation, of a counts trace, of the output or of the
ignored changes, a segment of the relation or of a counts trace), a file of that kind and an
offset at random, and changes the bytes there in place — random bytes, 64 bytes shifted by one
8-byte entry (the reproduction of issue 39), or a 4 KiB page zeroed — then restores the file's
access and modification times; every stamp the manifest records (inode, mtime, ctime) is set
to the file's own, as if the state had not been copied and the damage had left its inode alone
(what a copy and a write cannot: this is that case, exactly). The next epoch must then give the exact answer (the count it
reports, the manifest's figures and the output's batches against an independent triangle count
of the graph the state then holds) or stop on one line with nothing committed.

The state is built once and copied per case; the independent count is made once; the epoch
runs in this process (`wcoj_here`: the command's own `main`). ``WCOJ_DAMAGES=1000`` runs a
thousand cases (docs/reliability.md); the suite runs `CASES`. Each case records what it damaged
and how the epoch took it (``damage``, ``outcome``: refused, rebuilt, refused when read, or not
read) as test properties: ``--junitxml FILE`` keeps them.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from reliability_support import (
    contents,
    figures,
    manifest_files,
    one_line_error,
    summed,
    wcoj_here,
    write_changes,
)

from wcoj_core.errors import DamagedBatch
from wcoj_core.store.manifest import digest_of

CASES = int(os.environ.get("WCOJ_DAMAGES", "24"))
KINDS = [
    "marker",
    "manifest",
    "batch:rel",
    "batch:counts",
    "batch:out",
    "batch:ignored",
    "segment:rel",
    "segment:counts",
]
VERTICES = 1500
Edge = tuple[int, int]


def epochs(seed: int = 41) -> list[list[tuple[int, int, int]]]:
    """Epoch 0: 9,000 random edges and 60 cliques of six (triangles enough to miss); epochs 1
    and 2: 300 insertions, 150 deletions of held edges, an insertion of a held edge each."""
    rng = random.Random(seed)
    held: set[Edge] = set()
    while len(held) < 9000:
        a, b = rng.randrange(VERTICES), rng.randrange(VERTICES)
        if a != b:
            held.add((min(a, b), max(a, b)))
    for _ in range(60):
        clique = sorted(rng.sample(range(VERTICES), 6))
        held |= {(a, b) for i, a in enumerate(clique) for b in clique[i + 1 :]}
    out = [[(a, b, 1) for a, b in sorted(held)]]
    for _ in range(2):
        fresh: set[Edge] = set()
        while len(fresh) < 300:
            a, b = rng.randrange(VERTICES), rng.randrange(VERTICES)
            if a != b and (min(a, b), max(a, b)) not in held:
                fresh.add((min(a, b), max(a, b)))
        gone = rng.sample(sorted(held), 150)
        again = rng.choice(sorted(held - set(gone)))
        out.append([*((a, b, 1) for a, b in sorted(fresh)), *((b, a, -1) for a, b in gone)])
        out[-1].append((*again, 1))
        held = (held | fresh) - set(gone)
    return out


@functools.cache
def triangles() -> Counter[tuple[int, int, int]]:
    """The triangles ``a < b < c`` of the undirected set the epochs leave (an independent
    count: adjacency sets intersected), counted once: every case wants the same answer."""
    held: set[Edge] = set()
    for rows in epochs():
        for a, b, d in rows:
            e = (min(a, b), max(a, b))
            if d > 0:
                held.add(e)
            else:
                held.discard(e)
    near: dict[int, set[int]] = {}
    for a, b in held:
        near.setdefault(a, set()).add(b)
        near.setdefault(b, set()).add(a)
    return Counter({(a, b, c): 1 for a, b in held for c in near[a] & near[b] if c > b})


def apply(state: Path, files: list[Path], t: int) -> list[str]:
    return [
        *["apply", "--query", "triangles", "--state", str(state), "--epoch", str(t)],
        *["--changes", f"edge={files[t]}", "--undirected", "edge", "--json"],
    ]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    folder = tmp_path_factory.mktemp("below")
    files = [write_changes(folder / f"e{t}.csv", rows) for t, rows in enumerate(epochs())]
    state = folder / "state"
    for t in (0, 1):
        done = wcoj_here(*apply(state, files, t))
        assert done.code == 0, done.err
    return state, files


def kind_files(state: Path, kind: str) -> list[Path]:
    if kind == "marker":
        return [state / "wcoj-state.json"]
    if kind == "manifest":
        return sorted((state / "manifests").glob("*.json"))[-1:]
    what, trace = kind.split(":")
    top = state / ("traces" if what == "batch" else "arrangements")
    prefix = {"rel": "rel-edge-", "counts": "counts-edge-", "out": "out-", "ignored": "ignored-"}
    return sorted(p for d in top.glob(prefix[trace] + "*") for p in d.rglob("*") if p.is_file())


def damage(path: Path, rng: random.Random) -> str:
    """Change bytes of `path` in place, its size and times kept; what was done."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    how = rng.choice(["bytes", "shift", "page"])
    at = rng.randrange(len(data))
    if how == "bytes":
        for i in range(at, min(len(data), at + rng.randint(1, 16))):
            data[i] ^= rng.randint(1, 255)
    elif how == "shift":
        piece = data[at : at + 64]
        data[at : at + len(piece)] = piece[8:] + piece[:8]
    else:
        page = at - at % 4096
        data[page : page + 4096] = bytes(len(data[page : page + 4096]))
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.write(bytes(data))
    os.chmod(path, st.st_mode & 0o777)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return f"{how} at {at}"


def restamped(state: Path) -> None:
    """Every stamp the current manifest records set to its file's own (see the module)."""
    manifest = sorted((state / "manifests").glob("*.json"))[-1]
    raw = json.loads(manifest.read_text())

    def fresh(folder: str, ref: list) -> None:
        st = (state / folder / ref[0]).stat()
        if len(ref) > 3 and ref[3]:
            ref[3] = [st.st_ino, st.st_mtime_ns, st.st_ctime_ns]

    for trace in raw["traces"].values():
        for b in trace["batches"]:
            for ref in b["files"]:
                fresh(b["path"], ref)
        for seg in (trace["index"] or {}).get("segments", ()):
            for ref in seg["files"].values():
                fresh(seg["path"].rpartition("/")[0], ref)
    raw["digest"] = digest_of(raw)
    os.chmod(manifest, 0o644)
    manifest.write_text(json.dumps(raw, sort_keys=True, separators=(",", ":")) + "\n")


@pytest.mark.parametrize("case", range(CASES))
def test_damage_below_the_file_system(
    pristine: tuple[Path, list[Path]],
    tmp_path: Path,
    case: int,
    record_property: Callable[[str, object], None],
) -> None:
    rng = random.Random(case)
    source, files = pristine
    state = tmp_path / "state"
    shutil.copytree(source, state)  # times kept (copy2)
    kind = KINDS[case % len(KINDS)]
    path = rng.choice(kind_files(state, kind))
    what = damage(path, rng)
    if kind != "manifest":
        restamped(state)
    before = manifest_files(state)
    done = wcoj_here(*apply(state, files, 2))
    record_property("damage", f"{kind} {path.relative_to(state)}: {what}")
    if done.code != 0:
        line = one_line_error(done)
        assert manifest_files(state) == before, (what, line)  # nothing committed
        record_property("outcome", f"refused: {line}")
        return
    want = triangles()
    assert done.payload["count"] == sum(want.values()), (kind, path, what)
    found = figures(state, "out/triangles")
    assert found is not None and found[1] == sum(want.values()), (kind, path, what)
    try:
        output = summed(contents(state, ["out/triangles"]), "out/triangles")
    except DamagedBatch as e:  # the damaged file is an output batch: refused when read
        assert str(path) in str(e) or str(path.parent) in str(e), (path, e)
        record_property("outcome", f"exact; the output batch refused when read: {e}")
    else:
        assert output == want, (kind, path, what)
        rebuilt = [x for x in done.err.splitlines() if "rebuilt from the batches" in x]
        record_property("outcome", f"exact; {rebuilt[0] if rebuilt else 'damage not read'}")


def test_issue_39_a_shifted_directory_is_caught_and_rebuilt(
    pristine: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    """Issue 39's reproduction: 64 bytes of the relation's segment directory shifted by one
    entry, the stamp unchanged. The next epoch finds the block, rebuilds the relation's
    arrangements from its batches (a warning says so) and commits the exact answer."""
    source, files = pristine
    state = tmp_path / "state"
    shutil.copytree(source, state)
    base = max(kind_files(state, "segment:rel"), key=lambda p: p.stat().st_size)
    header = base.read_bytes()[:64]
    assert int.from_bytes(header[32:40], "little") > 64  # it keeps a directory: entries
    st = base.stat()
    data = bytearray(base.read_bytes())
    at = 64 + 4 * 600  # inside the directory, which starts after the header
    data[at : at + 64] = data[at + 4 : at + 64] + data[at : at + 4]  # one uint32 entry
    os.chmod(base, 0o644)
    base.write_bytes(bytes(data))
    os.utime(base, ns=(st.st_atime_ns, st.st_mtime_ns))
    restamped(state)
    done = wcoj_here(*apply(state, files, 2))
    assert done.code == 0, done.err
    assert done.payload["count"] == sum(triangles().values())
    assert "arrangements rebuilt from the batches: rel/edge" in done.err
    assert str(base) in done.err and "does not match its checksum" in done.err
