"""The ``wcoj`` command line: ``count``, ``replay``, ``apply``, ``verify``, ``status``, ``explain``
(one module each; docs/cli.md).

Everything that can be checked without Spark is checked before Spark starts (the query, the
inputs and their files, the numbers, ``--output``, the state); a Spark session is announced on
stderr first. With ``--json`` the last line on stdout is one JSON object. Exit status: 0 on
success; 1 when a replay check or Spark fails; 2 for a user mistake (any `WcojError`), one line
``wcoj: error: ...`` on stderr, never a traceback unless ``WCOJ_DEBUG=1``; 130 on interruption.

>>> main(["explain", "--query", "p(a) :- e(a"])
2
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]

EXIT_INTERRUPTED = 130
_ENDED: list[int] = []  # the command's status, once it returned


def _leave() -> None:
    """Run last at exit in a process that is the command: after its work and other exit handlers,
    leave with its status, not tearing every object down (unless an error escaped: 1)."""
    if _ENDED and not hasattr(sys, "last_value"):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(_ENDED[0])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status. The program is imported here, where an
    interruption is still one line; a process that is the command (`argv` None) keeps pandas out
    until Spark starts (`wcoj_core.fence`) and leaves without tearing itself down (`_leave`)."""
    try:
        if argv is None:  # the process is the command: pandas stays out until Spark starts
            atexit.register(_leave)  # registered first, so run last
            from wcoj_core.fence import fence_pandas

            fence_pandas()
            # No command multiplies matrices: numpy's OpenBLAS is kept from starting a thread
            # per core that spins between calls (on 2 cores it took the second core from the
            # kernel's threads).
            os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        from wcoj_core.cli.program import run
    except KeyboardInterrupt:
        print("wcoj: error: interrupted: nothing was applied", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    code = run(argv)
    if argv is None:
        _ENDED.append(code)
    return code
