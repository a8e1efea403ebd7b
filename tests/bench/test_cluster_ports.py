"""The local cluster finds its master where the master really is.

A free port picked for the master's UI can be bound by another process before the master binds
it (CI saw a Spark gateway's Py4J server answer there: ``BadStatusLine``, and the report's
cluster failed to start). The master then takes the next port and says so in its log; `up` reads
the ports from the log, and a port that does not speak HTTP is "not answering", never an error.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from wcoj_bench.infra.cluster import bound_port, master_state

LOG = """\
26/11/27 09:09:03 INFO Utils: Successfully started service 'sparkMaster' on port 51451.
26/11/27 09:09:03 INFO Master: Starting Spark master at spark://127.0.0.1:51451
26/11/27 09:09:05 WARN Utils: Service 'MasterUI' could not bind on port 38728. Attempting port 38729.
26/11/27 09:09:05 INFO Utils: Successfully started service 'MasterUI' on port 38729.
"""


def test_the_ports_come_from_the_masters_log(tmp_path: Path) -> None:
    log = tmp_path / "master.log"
    assert bound_port(log, "MasterUI") is None  # not written yet
    log.write_text(LOG)
    assert bound_port(log, "sparkMaster") == 51451
    assert bound_port(log, "MasterUI") == 38729


def test_a_port_that_does_not_speak_http_is_not_answering() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def gateway() -> None:  # what a Py4J server says to an HTTP request
            conn, _ = server.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"!zspy4j.Py4JException: Unknown command received: GET /json/\n")

        thread = threading.Thread(target=gateway, daemon=True)
        thread.start()
        assert master_state(f"http://127.0.0.1:{port}") is None
        thread.join(timeout=10)
