"""``python -m wcoj_bench``: the ``wcoj-bench`` command."""

from wcoj_bench.cli import main

raise SystemExit(main())
