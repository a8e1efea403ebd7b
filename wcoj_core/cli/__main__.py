"""``python -m wcoj_core.cli``: the ``wcoj`` command."""

from wcoj_core.cli import main

raise SystemExit(main())
