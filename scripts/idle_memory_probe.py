"""Does memory untouched for a while cost more to touch again on this machine? (A probe.)

    python scripts/idle_memory_probe.py FILE.npy [--gap 120]

Maps FILE (one of a state's arrangement files) and touches 20,000 random elements of it and of
320 MB of ordinary memory the process filled at start, twice back to back and once after
sleeping GAP seconds; prints the seconds and the page faults the process saw for each. On a
machine whose host reclaims an idle guest's memory, the touch after the gap is slower with no
more faults visible inside (docs/benchmarks.md, "Epochs minutes apart on the cluster").
"""

import argparse
import resource
import time

import numpy as np


def touch(array: np.ndarray, rng: np.random.Generator, n: int = 20_000) -> str:
    picked = rng.integers(0, array.size, n)
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    int(array.reshape(-1)[picked].sum())
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    minor, major = after.ru_minflt - before.ru_minflt, after.ru_majflt - before.ru_majflt
    return f"{seconds:.4f} s ({minor} minor, {major} major faults)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--gap", type=float, default=120)
    args = parser.parse_args()
    rng = np.random.default_rng(3)
    ordinary = np.ones(40_000_000, dtype=np.int64)
    for label in ("back to back", "back to back", f"after {args.gap:g} s"):
        if label.startswith("after"):
            time.sleep(args.gap)
        mapped = np.load(args.file, mmap_mode="r")
        print(f"{label}: mapped {touch(mapped, rng)}; ordinary {touch(ordinary, rng)}", flush=True)
        del mapped


if __name__ == "__main__":
    main()
