"""A real Spark standalone cluster on 127.0.0.1 (`wcoj-bench cluster`), and the same results on it.

The module starts one two-worker cluster (`local_cluster`) for the comparisons: ``wcoj count``,
``wcoj replay --check`` and the Dagster pipeline (the demo's sensor-driven runs) each run against
it in a subprocess, the join kernel in the cluster's executors, and must leave exactly the state
a local run (``--master local[2]``, in a subprocess too) leaves: every trace's batches and every
index's segments, read back and checked against their digests (`fingerprint`). The worker-fault
test starts a cluster of its own, since it kills one of its workers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from oracle import naive_eval
from reliability_support import (
    TRIANGLES,
    committed_epoch,
    contents,
    fingerprint,
    last_line,
    run_wcoj,
    run_wcoj_bench,
    start_wcoj,
    summed,
    wait_for,
)

from wcoj_bench.infra import cluster

GRAPH = "rmat:scale=10,edges=6000,seed=5"

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.Cluster]:
    folder = tmp_path_factory.mktemp("cluster")
    started = cluster.up(folder, workers=2, cores=1, memory="2g", port=0, ui_port=0, timeout=300)
    try:
        yield started
    finally:
        cluster.down(folder)


def alive(ui: str) -> int:
    return cluster.alive_workers(cluster.master_state(ui))


def staged_batches(state: Path, epoch: int) -> list[Path]:
    """Batch folders of `epoch` under a state's traces (staged or committed)."""
    return sorted((state / "traces").glob(f"*/b-*-{epoch}-*"))


def local(*argv: str | os.PathLike[str]) -> None:
    """The same command on a local Spark (``local[2]``), in a subprocess."""
    done = run_wcoj(*argv, "--master", "local[2]")
    assert done.code == 0, done.err[-3000:]


def test_up_status_down_stop_exactly_what_was_started(
    tmp_path: Path, local_cluster: cluster.Cluster
) -> None:
    folder = tmp_path / "mine"
    flags = ["--dir", str(folder)]
    up = run_wcoj_bench(
        *["cluster", "up", "--workers", "1", "--memory", "1g", "--port", "0", "--ui-port", "0"],
        *[*flags, "--json"],
    )
    assert up.code == 0, up.err
    payload = up.payload
    assert payload["master"].startswith("spark://127.0.0.1:") and payload["workers"] == 1
    assert "worker 1/1 registered" in up.out
    record = cluster.Cluster.load(folder)
    assert record is not None and record.master == payload["master"]
    assert all(cluster.is_ours(p) for p in record.processes)

    again = run_wcoj_bench("cluster", "up", "--port", "0", "--ui-port", "0", *flags)
    assert again.code == 2
    assert f"is running at {record.master}" in again.errors[0]
    status = run_wcoj_bench("cluster", "status", *flags)
    assert status.code == 0 and "workers alive: 1" in status.out

    down = run_wcoj_bench("cluster", "down", *flags, "--json")
    assert down.code == 0, down.err
    assert down.payload["stopped"] == 2
    assert not any(cluster.is_ours(p) for p in record.processes)
    assert cluster.Cluster.load(folder) is None
    # The other cluster was not touched.
    assert alive(local_cluster.ui) == 2
    gone = run_wcoj_bench("cluster", "down", *flags)
    assert gone.code == 2 and "no cluster was started" in gone.errors[0]


def test_down_leaves_a_process_that_is_not_its_own(tmp_path: Path) -> None:
    """A recorded pid now used by another program (the daemon died, the pid was reused)."""
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        fake = cluster.Cluster(
            "spark://127.0.0.1:1",
            "http://127.0.0.1:1",
            (cluster.Process("master", other.pid, "m.log"), cluster.Process("worker-1", 1, "")),
        )
        tmp_path.joinpath(cluster.RECORD).write_text(fake.to_json())
        down = run_wcoj_bench("cluster", "down", "--dir", str(tmp_path))
        assert down.code == 0, down.err
        assert f"master pid {other.pid}: already gone" in down.out
        assert other.poll() is None, "a process wcoj did not start was stopped"
    finally:
        other.kill()
        other.wait()


def test_up_refuses_bad_settings_before_starting_anything(tmp_path: Path) -> None:
    for flags, fragment in [
        (["--workers", "0"], "--workers must be at least 1"),
        (["--memory", "lots"], "--memory takes a size"),
        (["--cores", "0"], "--cores must be at least 1"),
    ]:
        done = run_wcoj_bench("cluster", "up", "--dir", str(tmp_path / "c"), *flags)
        assert done.code == 2 and fragment in done.errors[0]
    assert not (tmp_path / "c").exists()


def test_count_on_the_cluster_equals_local(local_cluster: cluster.Cluster, tmp_path: Path) -> None:
    args = ["count", "--query", "triangles", "--input", f"edge={GRAPH}", "--undirected", "edge"]
    # On the cluster the kernel runs in its executors; locally, on the driver.
    remote = run_wcoj(
        *args,
        "--master",
        local_cluster.master,
        "--state",
        tmp_path / "remote",
        "--json",
        "--deploy",
        "executors",
    )
    assert remote.code == 0, remote.err
    local(*args, "--state", tmp_path / "local")
    assert fingerprint(tmp_path / "remote") == fingerprint(tmp_path / "local")
    held = contents(tmp_path / "remote")
    expected = naive_eval(TRIANGLES, {"edge": summed(held, "rel/edge")})
    assert summed(held, "out/triangles") == expected
    assert remote.payload["count"] == sum(expected.values()) > 0


def test_replay_check_on_the_cluster_equals_local(
    local_cluster: cluster.Cluster, tmp_path: Path
) -> None:
    args = [
        *["replay", "--query", "triangles", "--input", f"edge={GRAPH}", "--undirected", "edge"],
        *["--epochs", "4", "--delete-fraction", "0.2", "--seed", "3", "--check", "--json"],
    ]
    # As for count: the cluster's executors, then the driver locally.
    remote = run_wcoj(
        *args,
        "--master",
        local_cluster.master,
        "--state",
        tmp_path / "remote",
        "--deploy",
        "executors",
    )
    assert remote.code == 0, remote.err
    assert remote.payload["check"] == "passed"
    local(*args, "--state", tmp_path / "local")
    on_cluster = fingerprint(tmp_path / "remote" / "engine")
    assert on_cluster == fingerprint(tmp_path / "local" / "engine")
    assert on_cluster["epoch"] == "3"


def run_demo(root: Path, master: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *[sys.executable, "-m", "wcoj_assets.demo", "--root", str(root)],
            *["--scale", "9", "--edges", "3000", "--epochs", "3", "--master", master],
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
        env={**os.environ, "DAGSTER_HOME": str(root / "dagster")},
    )


DEMO_END = re.compile(r"demo: 3 epochs, (\d+) checks passed, 0 failed")


def test_the_dagster_pipeline_on_the_cluster_equals_local(
    local_cluster: cluster.Cluster, tmp_path: Path
) -> None:
    remote = run_demo(tmp_path / "remote", local_cluster.master)
    assert remote.returncode == 0, remote.stdout + remote.stderr
    checks = DEMO_END.search(remote.stdout)
    assert checks is not None and int(checks.group(1)) > 0, remote.stdout
    here = run_demo(tmp_path / "local", "local[2]")
    assert here.returncode == 0, here.stdout + here.stderr
    assert f"demo: 3 epochs, {checks.group(1)} checks passed, 0 failed" in here.stdout
    on_cluster = fingerprint(tmp_path / "remote" / "state")
    assert on_cluster == fingerprint(tmp_path / "local" / "state")
    assert summed(contents(tmp_path / "remote" / "state"), "out/triangles"), "no triangles"


def test_a_killed_worker_costs_time_not_results(tmp_path: Path) -> None:
    """One of two workers (and its executor) is SIGKILLed while epoch 2 is being applied."""
    own = cluster.up(tmp_path / "cluster", workers=2, port=0, ui_port=0, timeout=300)
    try:
        state = tmp_path / "remote"
        args = [
            *["replay", "--query", "triangles", "--input", "edge=rmat:scale=11,edges=20000,seed=9"],
            *["--undirected", "edge", "--epochs", "4", "--delete-fraction", "0.2", "--check"],
            "--deploy",
            "executors",  # the executors must be at work when the worker dies
        ]
        proc = start_wcoj(*args, "--master", own.master, "--state", state, "--json")
        engine = state / "engine"
        wait_for(lambda: bool(staged_batches(engine, 2)) or proc.poll() is not None, "epoch 2")
        assert proc.poll() is None, proc.communicate()
        victim = own.workers[0]
        os.killpg(victim.pid, signal.SIGKILL)
        applied_at_kill = committed_epoch(engine)
        out, err = proc.communicate(timeout=1200)
        assert proc.returncode == 0, err
        assert applied_at_kill == 1, "the worker died after epoch 2 was committed"
        assert json.loads(last_line(out))["check"] == "passed"
        assert not cluster.is_running(victim)
        wait_for(lambda: alive(own.ui) == 1, "the master to drop the killed worker", 180, 1.0)
    finally:
        cluster.down(tmp_path / "cluster")
    local(*args, "--state", tmp_path / "local")
    assert fingerprint(engine) == fingerprint(tmp_path / "local" / "engine")
