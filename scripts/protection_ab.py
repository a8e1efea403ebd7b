"""Time warm epochs with the state's file and manifest checks on, or stubbed out (an A/B).

    python scripts/protection_ab.py on|off STATE EPOCHS_DIR [--epochs 11]

STATE is a web-NotreDame state after epoch 0 and EPOCHS_DIR holds ``e-1.csv`` ... (both are in the
cache ``make benchmarks ARGS='--only cold'`` leaves under ``.wcoj/bench/cache``). The state is
copied, stamped with ``wcoj verify --repair``, and epochs 1..N applied in one process; the median of
epochs 2..N is printed. "off" patches two private functions, which is why this is a script and not a
benchmark part: run "on" and "off" alternately and compare medians (docs/reliability.md).
"""

import argparse
import contextlib
import io
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["on", "off"])
    parser.add_argument("state", type=Path)
    parser.add_argument("epochs_dir", type=Path)
    parser.add_argument("--epochs", type=int, default=11)
    args = parser.parse_args()
    if args.mode == "off":
        import wcoj_core.store.manifest as manifest
        import wcoj_core.store.segments as segments

        segments._check = lambda path, ref, expect, *, digest: len(segments._header(expect))
        manifest.digest_of = lambda body: body.get("digest", "0" * 64)
    from wcoj_core.cli import main as wcoj

    quiet = io.StringIO()
    with tempfile.TemporaryDirectory() as scratch:
        state = Path(scratch) / "state"
        shutil.copytree(args.state, state)
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            assert wcoj(["verify", str(state), "--repair"]) == 0
        seconds = []
        for t in range(1, args.epochs + 1):
            started = time.perf_counter()
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                code = wcoj(
                    [
                        "apply",
                        "--query",
                        "triangles",
                        "--state",
                        str(state),
                        "--epoch",
                        str(t),
                        "--changes",
                        f"edge={args.epochs_dir}/e-{t}.csv",
                        "--undirected",
                        "edge",
                    ]
                )
            assert code == 0, quiet.getvalue()[-2000:]
            seconds.append(time.perf_counter() - started)
    print(args.mode, round(statistics.median(seconds[1:]), 4))


if __name__ == "__main__":
    main()
