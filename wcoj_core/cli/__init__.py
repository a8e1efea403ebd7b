"""The ``wcoj`` command line: count a query statically, replay it over epochs, apply an epoch to a
kept state, verify a state or say what it holds, explain a query's plan.

Commands (one module each)::

    wcoj count   --query Q --input REL=PATH [--input ...] [--undirected REL] [--output FILE]
                 [--deploy WHERE] [--json]
    wcoj replay  --query Q --input REL=PATH ... --epochs K [--delete-fraction F] [--seed S]
                 [--check] [--deploy WHERE] [--json]
    wcoj apply   --query Q --state DIR --epoch T --changes REL=PATH ... [--undirected REL]
                 [--set REL] [--bag REL] [--replace] [--output FILE [--force]]
                 [--deploy WHERE] [--json]
    wcoj verify  STATE [--repair] [--json]
    wcoj status  STATE [--json]
    wcoj explain --query Q
    wcoj --version

``count`` and ``replay`` also take ``--master URL`` (default ``local[*]``) and ``--state DIR``
(default: a fresh temporary directory, removed at exit; with ``--state`` the directory is kept).
``--deploy`` says where the join kernel runs: ``auto`` (default: the driver when the state is
local and the epoch fits its limits), ``driver`` or ``executors`` (`wcoj_core.deploy`). ``apply`` adds one epoch of changes to a kept state directory
(new or holding earlier epochs only: epochs are applied once, in increasing order; a second
writer of the same epoch is refused). ``Q`` is the name of a built-in query or query text.
``--undirected REL`` reads a binary relation as the set of its undirected edges, each present
in both directions. The benchmarks and the local Spark cluster are a separate command,
``wcoj-bench`` (`wcoj_bench`).

Contract:

* everything that can be checked without Spark is checked before Spark starts: the query text,
  the ``--input`` syntax, duplicate inputs, inputs the query does not use and relations it uses
  without an input, ``--undirected`` naming a relation that is not given or not binary, missing
  input files (generator specs such as ``rmat:scale=10`` are parsed instead), what is cheap to
  read of the files themselves (`wcoj_core.cli.inputs.check_files`), the epoch count, the
  delete fraction, the seed, ``--output`` and the state directory; a Spark session this command
  starts is announced on stderr first;
* with ``--json`` the last line on stdout is one JSON object: for ``count`` at least ``count``
  (the sum of the output's multiplicities) and ``seconds``; for ``replay`` at least
  ``final_count``, ``check`` (``passed``, ``failed`` or ``skipped``), ``epochs``,
  ``seconds_per_epoch`` and ``median_seconds``;
* exit status: 0 on success; 1 when a replay check fails or Spark fails; 2 for a user mistake
  (any `WcojError`, including bad arguments); 130 on interruption. An error is one line on stderr,
  ``wcoj: error: ...``, naming the file, line and column (or the query position) when it has
  them; never a traceback, unless the environment sets ``WCOJ_DEBUG=1``.

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
    """Run the command line; return the exit status.

    The program is imported here, where an interruption is still reported on one line (and
    the program imports the modules of the command it runs the same way: numpy, pyarrow, the
    engine, most of a second on a cold cache). A process that is the command
    (`argv` None: its own command line) keeps pandas out until Spark starts (see
    `wcoj_core.fence`) and leaves without tearing itself down (`_leave`).
    """
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
