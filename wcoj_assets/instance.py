"""Dagster instances for wcoj: where runs and events are stored, and how they are written.

Two kinds of instance, each a folder with a ``dagster.yaml`` (a ``DAGSTER_HOME``):

* **SQLite**, Dagster's embedded default: `prepare_home` writes the demo's ``dagster.yaml``, whose
  storage is files in the folder. ``make demo`` and ``make ui`` use it; nothing to start.
* **Postgres**, the production setting: Dagster's ``storage: postgres:`` block pointing at a
  server (``wcoj_bench.infra.postgres`` starts one from a wheel for development and the tests).

Both instances let one run tagged ``wcoj/serial`` run at a time, so epochs queued by the sensor
run in order, each on the arrangements of the one before.

`dagster_env` is the environment every process that creates or executes runs must have (the
webserver, the daemon, the demo, the benchmarks, the tests' run helpers). Its two variables cut
Dagster's own cost of a run over a range of epochs:

* ``DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS=1`` — one planned-materialization event per
  asset and run, carrying the run's partitions, instead of one per asset and partition. Caveat
  (Dagster's): open-source Dagster derives an asset partition's *failed* and *in progress*
  statuses from per-partition planned events, so with the variable a running or failed run's
  partitions show as neither in the asset's partition bar, and the automation conditions built
  on those statuses (``execution_failed``; ``in_progress`` and ``any_deps_in_progress`` as far as
  runs go — a backfill in progress is still seen) do not see them. wcoj reports its failures
  elsewhere: a run's status, and asset checks that carry their partition (pandera on an epoch's
  changes; ``current_history`` on every partition a correction invalidated). An asset backfill
  finds its failed runs by their tags, and the ``wcoj/serial`` limit keeps epoch runs in order.
* ``DAGSTER_EVENT_BATCH_SIZE`` — a step's per-partition materializations of one asset are
  written in batches of this many events: one multi-row INSERT on Postgres (SQLite has no batch
  write and stores them one by one). See `EVENT_BATCH_SIZE` for the value.

Importing this module does no I/O and imports neither Dagster nor a database driver.

>>> sorted(dagster_env())
['DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS', 'DAGSTER_EVENT_BATCH_SIZE']
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# A step over a range writes one materialization per asset and epoch, each with that epoch's own
# figures (about 1-2 KB). 100 events per INSERT writes the benchmark's 100-epoch backfill in one
# statement per asset; a longer range takes one per 100 epochs, which still saves 99 % of the round
# trips of one event at a time, and no statement holds more than 100.
EVENT_BATCH_SIZE = 100

SERIAL_TAG = "wcoj/serial"  # the tag `wcoj_assets.sensors` puts on every epoch run

INSTANCE_SETTINGS = f"""\
concurrency:
  runs:
    tag_concurrency_limits:
      - key: "{SERIAL_TAG}"
        limit: 1
telemetry:
  enabled: false
"""

SQLITE_YAML = f"""\
# A wcoj instance: SQLite files in this folder, kept. Under `dagster dev` / `dg dev` (which run
# the daemon) queued runs of epochs run one at a time, oldest first.
{INSTANCE_SETTINGS}"""


def dagster_env() -> dict[str, str]:
    """The environment variables every process that creates or executes runs must have."""
    return {
        "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "1",
        "DAGSTER_EVENT_BATCH_SIZE": str(EVENT_BATCH_SIZE),
    }


@contextmanager
def dagster_settings() -> Iterator[None]:
    """Set `dagster_env` in this process for in-process runs; restore what was there after."""
    before = {k: os.environ.get(k) for k in dagster_env()}
    os.environ.update(dagster_env())
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def hold_connections(instance: Any) -> None:
    """Keep one database connection per storage open for the rest of this process, as Dagster
    does for its webserver. Dagster's Postgres storages open a connection for every statement
    (``NullPool``), and a check evaluation is written alone, in four statements: a range run
    writing one per check and partition spent most of its own time connecting (see
    docs/benchmarks.md, *What one event write costs*). A step calls this once; a run's process
    ends with the run. SQLite's storages ignore it."""
    instance.optimize_for_webserver(statement_timeout=0, pool_recycle=3600, max_overflow=4)


def prepare_home(root: Path, name: str = "dagster") -> Path:
    """Create ``<root>/<name>`` with the SQLite instance's ``dagster.yaml`` (if absent); return
    it."""
    home = root / name if name else root
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(SQLITE_YAML)
    return home


def init_project(root: Path) -> Path:
    """Give the project folder `root` an instance that keeps its history and runs epochs one
    at a time: ``<root>/.dagster/dagster.yaml`` (SQLite in that folder, the ``wcoj/serial``
    limit, telemetry off) and ``<root>/.env`` naming it ``DAGSTER_HOME`` with `dagster_env`'s
    settings — ``dagster dev`` and ``dg dev`` read a ``.env`` of the folder they run in. An
    existing ``.env`` keeps its other lines. Returns the home."""
    root = root.absolute()
    home = prepare_home(root / ".dagster", name="")
    env = root / ".env"
    wanted = {"DAGSTER_HOME": str(home), **dagster_env()}
    kept = []
    if env.exists():
        kept = [
            line
            for line in env.read_text().splitlines()
            if line.split("=", 1)[0].strip() not in wanted
        ]
    env.write_text("\n".join([*kept, *(f"{k}={v}" for k, v in wanted.items())]) + "\n")
    automation_on(home)
    return home


def automation_on(home: Path) -> None:
    """Record in the instance at `home` that automation is on, so that the UI's job and asset
    pages say "Auto-materialize on". Dagster 1.13 runs automation condition sensors whatever
    this legacy flag says (the pipeline's automation sensor runs by default), but the UI reads
    it, and an instance without it says "off"."""
    from dagster import DagsterInstance
    from dagster._daemon.asset_daemon import set_auto_materialize_paused

    with DagsterInstance.from_config(str(home)) as instance:
        set_auto_materialize_paused(instance, False)


# -- the command line ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wcoj_assets.instance", description=(__doc__ or "").split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("env", help="print the Dagster settings as KEY=VALUE lines (for env)")
    init = commands.add_parser(
        "init",
        help="give a project folder an instance that keeps history and runs epochs one at a "
        "time (.dagster/dagster.yaml, and DAGSTER_HOME in .env)",
    )
    init.add_argument("folder", nargs="?", default=".", help="the project folder (default: .)")
    args = parser.parse_args(argv)

    if args.command == "env":
        for key, value in dagster_env().items():
            print(f"{key}={value}")
        return 0
    home = init_project(Path(args.folder))
    print(f"instance: {home / 'dagster.yaml'}; DAGSTER_HOME set in {home.parent / '.env'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
