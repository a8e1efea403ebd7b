"""A Spark standalone cluster on this machine, from the installed pyspark: `up`, `status`, `down`.

``wcoj-bench cluster up`` starts one master and N workers bound to 127.0.0.1, each a JVM run by
pyspark's own ``bin/spark-class`` (nothing is downloaded), waits until every worker has
registered with the master, and records what it started in ``<dir>/cluster.json``::

    {"master": "spark://127.0.0.1:7077", "ui": "http://127.0.0.1:8080",
     "processes": [{"role": "master", "pid": 1234, "log": "..."}, {"role": "worker-1", ...}]}

``wcoj-bench cluster down`` stops exactly those processes (each started in its own process group, so a
worker's executors go with it) and nothing else: a recorded pid that now belongs to another
program is left alone. Logs stay in ``<dir>/logs``.

The cluster is for one machine: a user who needs more points ``--master`` at a real cluster.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from wcoj_core.errors import WcojError

HOST = "127.0.0.1"
DEFAULT_DIR = ".wcoj/cluster"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
RECORD = "cluster.json"


class ClusterError(WcojError):
    """The local cluster could not be started, found or stopped."""


@dataclass(frozen=True, slots=True)
class Process:
    role: str  # "master" or "worker-<n>"
    pid: int
    log: str


@dataclass(frozen=True, slots=True)
class Cluster:
    """A running local cluster, as recorded by `up`."""

    master: str  # spark://127.0.0.1:<port>
    ui: str  # http://127.0.0.1:<webui port>
    processes: tuple[Process, ...]

    @property
    def workers(self) -> tuple[Process, ...]:
        return tuple(p for p in self.processes if p.role != "master")

    def to_json(self) -> str:
        return json.dumps(
            {
                "master": self.master,
                "ui": self.ui,
                "processes": [asdict(p) for p in self.processes],
            },
            indent=1,
        )

    @staticmethod
    def load(directory: str | os.PathLike[str]) -> Cluster | None:
        """The cluster recorded in `directory`, or ``None`` when none is."""
        path = Path(directory) / RECORD
        try:
            raw = json.loads(path.read_text())
            return Cluster(
                raw["master"],
                raw["ui"],
                tuple(Process(p["role"], int(p["pid"]), p["log"]) for p in raw["processes"]),
            )
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as e:
            raise ClusterError(f"{path}: not a cluster record ({e}); remove it") from e


def spark_home() -> Path:
    """The Spark distribution bundled with the installed pyspark."""
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").exists():
        raise ClusterError(f"{home}: this pyspark has no bin/spark-class to start a cluster with")
    return home


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def _environment(directory: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP=HOST,
        SPARK_LOG_DIR=str(directory / "logs"),
        # Executors start Python workers with the interpreter wcoj runs in (it has pyspark).
        PYSPARK_PYTHON=sys.executable,
    )
    env.pop("SPARK_CONF_DIR", None)
    return env


def _spawn(
    directory: Path, role: str, argv: Sequence[str]
) -> tuple[Process, subprocess.Popen[bytes]]:
    log = directory / "logs" / f"{role}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_environment(directory),
            cwd=directory,
            start_new_session=True,  # its own process group: `down` stops its children too
        )
    return Process(role, proc.pid, str(log)), proc


def master_state(ui: str, timeout: float = 2.0) -> dict[str, object] | None:
    """The master's JSON status page, or ``None`` when it does not answer (or something that
    does not speak HTTP answers on the port)."""
    try:
        with urllib.request.urlopen(f"{ui}/json/", timeout=timeout) as response:
            return json.loads(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        return None


def bound_port(log: str | os.PathLike[str], service: str) -> int | None:
    """The port the master's log says `service` started on (``sparkMaster``, ``MasterUI``):
    Spark takes the next port when the one asked for was taken meanwhile — a free port picked
    here may be bound by another process (a JVM's gateway, say) before the master binds it."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return None
    found = re.findall(rf"Successfully started service '{service}' on port (\d+)", text)
    return int(found[-1]) if found else None


def alive_workers(state: dict[str, object] | None) -> int:
    if state is None:
        return 0
    workers = state.get("workers", [])
    return sum(1 for w in workers if isinstance(w, dict) and w.get("state") == "ALIVE")  # type: ignore[union-attr]


def _log_tail(process: Process, lines: int = 5) -> str:
    try:
        text = Path(process.log).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


def is_ours(process: Process) -> bool:
    """Whether `process.pid` is still the Spark daemon this record describes."""
    try:
        os.kill(process.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    cmdline = Path(f"/proc/{process.pid}/cmdline")
    if not cmdline.exists():  # no procfs: the pid is alive, trust the record
        return True
    try:
        argv = cmdline.read_bytes().decode(errors="replace")
    except OSError:
        return False
    wanted = MASTER_CLASS if process.role == "master" else WORKER_CLASS
    return wanted in argv


def is_running(process: Process) -> bool:
    """Alive and not a zombie (a killed child of this process that was not reaped yet)."""
    if not is_ours(process):
        return False
    status = Path(f"/proc/{process.pid}/status")
    try:
        return "zombie" not in status.read_text()
    except OSError:
        return True


def up(
    directory: str | os.PathLike[str] = DEFAULT_DIR,
    *,
    workers: int = 2,
    cores: int = 1,
    memory: str = "2g",
    port: int = 7077,
    ui_port: int = 8080,
    timeout: float = 120.0,
    say: Callable[[str], None] = lambda _line: None,
) -> Cluster:
    """Start a master and `workers` workers; return once every worker has registered.

    ``port=0`` / ``ui_port=0`` pick free ports. On any failure everything started is stopped.
    """
    if workers < 1:
        raise ClusterError(f"--workers must be at least 1, got {workers}")
    if cores < 1:
        raise ClusterError(f"--cores must be at least 1, got {cores}")
    if not memory[:-1].isdigit() or memory[-1].lower() not in "mg":
        raise ClusterError(f"--memory takes a size such as 512m or 2g, got {memory!r}")
    root = Path(directory).absolute()
    existing = Cluster.load(root)
    if existing is not None and any(is_running(p) for p in existing.processes):
        raise ClusterError(
            f"a cluster started from {root} is running at {existing.master}; "
            "stop it first with 'wcoj-bench cluster down'"
        )
    port = port or free_port()
    ui_port = ui_port or free_port()
    for name, p in (("--port", port), ("--ui-port", ui_port)):
        if _port_taken(p):
            raise ClusterError(
                f"{name} {p} is in use on {HOST}; pass another, or 0 for any free port"
            )
    root.mkdir(parents=True, exist_ok=True)
    master_url, ui = f"spark://{HOST}:{port}", f"http://{HOST}:{ui_port}"
    started: list[Process] = []
    handles: list[subprocess.Popen[bytes]] = []

    def record() -> Cluster:
        cluster = Cluster(master_url, ui, tuple(started))
        (root / RECORD).write_text(cluster.to_json())
        return cluster

    try:
        master, handle = _spawn(
            root,
            "master",
            [MASTER_CLASS, "--host", HOST, "--port", str(port), "--webui-port", str(ui_port)],
        )
        started.append(master)
        handles.append(handle)
        record()
        bound: dict[str, int] = {}

        def answers() -> bool:
            """Whether the master's UI answers, on the port its log says it bound (the one
            asked for while the log does not say)."""
            for service in ("sparkMaster", "MasterUI"):
                if service not in bound and (at := bound_port(master.log, service)) is not None:
                    bound[service] = at
            return master_state(f"http://{HOST}:{bound.get('MasterUI', ui_port)}") is not None

        _wait(answers, master, handle, timeout, "the master to answer")
        master_url = f"spark://{HOST}:{bound.get('sparkMaster', port)}"
        ui = f"http://{HOST}:{bound.get('MasterUI', ui_port)}"
        record()
        say(f"master {master_url} (UI {ui}), pid {master.pid}")
        for n in range(1, workers + 1):
            work = root / f"work-{n}"
            work.mkdir(exist_ok=True)
            worker, handle = _spawn(
                root,
                f"worker-{n}",
                [
                    WORKER_CLASS,
                    master_url,
                    "--host",
                    HOST,
                    "--cores",
                    str(cores),
                    "--memory",
                    memory,
                    "--webui-port",
                    "0",
                    "--work-dir",
                    str(work),
                ],
            )
            started.append(worker)
            handles.append(handle)
            record()
        for n, (worker, handle) in enumerate(zip(started[1:], handles[1:], strict=True), start=1):
            _wait(
                lambda n=n: alive_workers(master_state(ui)) >= n,
                worker,
                handle,
                timeout,
                f"worker {n} to register",
            )
            say(f"worker {n}/{workers} registered ({cores} cores, {memory}), pid {worker.pid}")
        return record()
    except BaseException:
        # Started by this process, so certainly ours: stop their groups without asking /proc.
        for h in handles:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(h.pid, signal.SIGKILL)
            h.wait()
        (root / RECORD).unlink(missing_ok=True)
        raise


def _wait(
    ready: Callable[[], bool],
    process: Process,
    handle: subprocess.Popen[bytes],
    timeout: float,
    what: str,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if handle.poll() is not None:
            raise ClusterError(
                f"{process.role} (pid {process.pid}) exited while waiting for {what}; "
                f"its log {process.log} ends: {_log_tail(process)}"
            )
        time.sleep(0.25)
    raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}; see {process.log}")


def _stop(processes: Sequence[Process], grace: float = 15.0) -> list[Process]:
    """Stop the process groups of `processes` that are still ours: TERM, then KILL."""
    ours = [p for p in processes if is_ours(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in ours:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(is_running(p) for p in ours):
            _reap(ours)
            time.sleep(0.2)
        if not any(is_running(p) for p in ours):
            break
    _reap(ours)
    return ours


def _reap(processes: Sequence[Process]) -> None:
    """Collect exit statuses of processes that are children of this one (no zombies left)."""
    for p in processes:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p.pid, os.WNOHANG)


def down(
    directory: str | os.PathLike[str] = DEFAULT_DIR, say: Callable[[str], None] = lambda _l: None
) -> Cluster:
    """Stop the processes `up` started from `directory` (workers first); forget the record."""
    root = Path(directory).absolute()
    cluster = Cluster.load(root)
    if cluster is None:
        raise ClusterError(f"no cluster was started from {root} (no {RECORD} there)")
    stopped = _stop([*cluster.workers, *[p for p in cluster.processes if p.role == "master"]])
    for p in cluster.processes:
        state = "stopped" if p in stopped else "already gone"
        say(f"{p.role} pid {p.pid}: {state}")
    (root / RECORD).unlink(missing_ok=True)
    return cluster


def status(directory: str | os.PathLike[str] = DEFAULT_DIR) -> tuple[Cluster, int]:
    """The recorded cluster and how many workers its master reports alive."""
    root = Path(directory).absolute()
    cluster = Cluster.load(root)
    if cluster is None:
        raise ClusterError(f"no cluster was started from {root} (no {RECORD} there)")
    state = master_state(cluster.ui)
    if state is None:
        raise ClusterError(
            f"the master of {root} ({cluster.master}) does not answer at {cluster.ui}"
        )
    return cluster, alive_workers(state)
