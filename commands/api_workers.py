"""``clarion api --workers N``: N API processes sharing one port, and the parent that minds them.

Each child is an ordinary ``clarion api --reuse-port`` (uvloop, ``gc.freeze``, the lifespan that
opens and closes its pools, SIGTERM draining in-flight requests): the single-process path, run N
times. The children bind the port with ``SO_REUSEPORT``, so the kernel spreads new connections over
them by address hash; a shared accepting socket instead lets whichever process wakes first take a
burst of connections, and keep-alive clients then stay unevenly spread.

The parent only supervises: SIGTERM or SIGINT is passed to every child and the parent exits once
all have drained. A child that dies on its own ends the group (the others are stopped, exit 1), so
the process manager above restarts all of it, as it would restart a single ``clarion api``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from types import FrameType

log = logging.getLogger(__name__)

# A child still running this long after SIGTERM is killed: uvicorn's own drain has no limit.
STOP_TIMEOUT_S = 30.0


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT``: one of a group that share the port."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def _port_free(host: str, port: int) -> bool:
    """Nothing listens on ``host:port``, not even a ``SO_REUSEPORT`` group (a plain bind fails on one)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError:
            return False
    return True


def run(*, host: str, port: int, workers: int) -> int:
    """Start ``workers`` children on ``host:port`` and supervise them; returns the exit status."""
    if not _port_free(host, port):
        print(f"clarion: {host}:{port} is already in use", file=sys.stderr)
        return 2
    command = [
        sys.executable,
        "-m",
        "commands.cli",
        "api",
        "--reuse-port",
        "--host",
        host,
        "--port",
        str(port),
    ]
    # The children's metrics, shared so that any of them answers /metrics for all (clarion.metrics).
    metrics_dir = tempfile.mkdtemp(prefix="clarion-api-metrics-")
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir}
    try:
        return _supervise(command, workers, env)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _supervise(command: list[str], workers: int, env: dict[str, str]) -> int:
    children: dict[int, subprocess.Popen[bytes]] = {}
    stop_by = 0.0  # monotonic deadline once stopping; 0 while serving

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stop_by
        stop_by = stop_by or time.monotonic() + STOP_TIMEOUT_S
        for child in children.values():
            if child.returncode is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for _ in range(workers):
        child = subprocess.Popen(command, env=env)
        children[child.pid] = child
    log.info("api workers started: %s", sorted(children))
    status = 0
    while any(child.returncode is None for child in children.values()):
        if stop_by and time.monotonic() > stop_by:
            for child in children.values():
                if child.returncode is None:
                    log.error("api worker %d did not drain within %s s: killed", child.pid, STOP_TIMEOUT_S)
                    child.kill()
            status = 1
        # Blocks while serving (a signal runs ``stop`` and the wait resumes, PEP 475); polls while
        # stopping, to honour the deadline.
        pid, wait_status = os.waitpid(-1, os.WNOHANG if stop_by else 0)
        if pid == 0:
            time.sleep(0.05)
            continue
        exited = children.get(pid)
        if exited is None:
            continue
        exited.returncode = code = os.waitstatus_to_exitcode(wait_status)
        if code != 0:  # a drained child exits 0 (its SIGTERM handler is installed before it serves)
            status = 1
        if not stop_by:
            log.error("api worker %d exited (%d): stopping the others", pid, code)
            status = 1
            stop(signal.SIGTERM, None)
    return status
