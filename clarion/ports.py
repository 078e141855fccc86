"""Loopback ports of the processes Clarion starts itself: a free one to give a process, and waiting
until the process listens on it (the bundled broker, and the chaos scenarios' processes)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(port: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Return once 127.0.0.1:``port`` accepts connections; raise if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on port {port} within {timeout_s}s")
