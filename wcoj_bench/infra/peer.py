"""The peer triangle counter ``tc``: a small C program beside the project, built and fed here.

The source is ``../shared/peers/tc.c`` relative to the project root (it is not the project's
code and is never copied in). `build_tc` compiles it with the machine's C compiler (``cc``, else
``gcc``), trying ``-O3 -march=native -fopenmp`` first and dropping OpenMP, then ``-march=native``,
when the compiler refuses them; the program is kept in a cache folder
(``$XDG_CACHE_HOME/wcoj-bench``, default ``~/.cache/wcoj-bench``) under a name keyed by the
source's bytes, the compiler and the flags, so a changed source or compiler builds anew and
concurrent builds never see a half-written program. When the program cannot be had — no source,
no compiler, every build refused — `build_tc` raises `PeerMissing` with a one-line reason.

`write_pairs` writes what ``tc`` reads: an undirected simple graph as raw little-endian
``uint32`` pairs ``(lo, hi)``, ``lo < hi``, each edge once. Ids outside ``uint32`` are relabelled
densely (order-preserving, so ``lo < hi`` stays); a triangle count does not depend on the labels.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from wcoj_bench.infra.measure import BenchError

TC_SOURCE = Path(__file__).resolve().parents[2].parent / "shared" / "peers" / "tc.c"
FLAG_SETS = (("-O3", "-march=native", "-fopenmp"), ("-O3", "-march=native"), ("-O3",))


class PeerMissing(BenchError):
    """The peer program cannot be built here; the message is the one-line reason."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wcoj-bench"


def build_tc(source: Path = TC_SOURCE, cache: Path | None = None) -> Path:
    """The built ``tc`` program (built now unless the cache has it); `PeerMissing` if it cannot be."""
    if not source.is_file():
        raise PeerMissing(f"its source {source} is not there")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise PeerMissing("no C compiler (cc or gcc) on PATH")
    folder = cache or cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    text = source.read_bytes()
    refused = ""
    for flags in FLAG_SETS:
        key = hashlib.sha256(b"\0".join([text, compiler.encode(), *map(str.encode, flags)]))
        program = folder / f"tc-{key.hexdigest()[:16]}"
        if program.exists():
            return program
        fd, partial = tempfile.mkstemp(prefix="tc-", dir=folder)
        os.close(fd)
        done = subprocess.run(
            [compiler, *flags, "-o", partial, str(source)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            os.replace(partial, program)
            return program
        Path(partial).unlink(missing_ok=True)
        refused = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
    raise PeerMissing(f"{compiler} could not build {source.name}: {refused}")


def write_pairs(src: np.ndarray, dst: np.ndarray, path: Path) -> None:
    """The edges (``src < dst``, each once) as little-endian uint32 pairs in `path`."""
    if len(src) and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= 2**32 - 1):
        _, index = np.unique(np.concatenate([src, dst]), return_inverse=True)
        src, dst = index[: len(src)], index[len(src) :]
    pairs = np.empty((len(src), 2), dtype="<u4")
    pairs[:, 0], pairs[:, 1] = src, dst
    path.parent.mkdir(parents=True, exist_ok=True)
    pairs.tofile(path)


def run_tc(program: Path, edges: Path) -> int:
    """``tc``'s count of the pairs in `edges` (one process, exec to exit)."""
    done = subprocess.run([str(program), str(edges)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BenchError(f"{program} failed ({done.returncode}): {tail}")
    return int(done.stdout.split()[-1])
