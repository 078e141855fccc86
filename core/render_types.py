"""What a render gives (``RenderedContent``) and the CPU budget a request's renders share."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RenderedContent:
    subject: str | None
    """Email subject or push title."""
    body: str
    """Text body."""
    html: str | None
    """Email HTML body."""


class RequestBudget:
    """CPU time shared by every render of one request (a batch of 1,000 items gets this once, not
    1,000 times the per-render limit), and with ``wall_s`` the time its renders may take in all,
    however long they waited for a render thread or the render box. Only time inside `rendering`
    counts against ``wall_s``: a batch's database work between its renders (its templates, its
    recipients, a pool connection while another tenant loads the database) is not a render, and
    counting it refused good items as ``template_render_limit``. Safe to share between threads."""

    def __init__(
        self, total_ms: float, *, wall_s: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.total_ms = total_ms
        self.wall_s = wall_s
        self._clock = clock
        self._spent_s = 0.0
        self._wall_spent_s = 0.0
        self._active = 0
        self._since = 0.0
        self._lock = threading.Lock()

    @property
    def remaining_ms(self) -> float:
        """CPU left, or the render time left when that is less."""
        left = self.total_ms - self._spent_s * 1000
        if self.wall_s is not None:
            with self._lock:
                running = self._clock() - self._since if self._active else 0.0
                left = min(left, (self.wall_s - self._wall_spent_s - running) * 1000)
        return left

    def spend(self, seconds: float) -> None:
        with self._lock:
            self._spent_s += seconds

    @contextlib.contextmanager
    def rendering(self) -> Iterator[None]:
        """Count the block's time against ``wall_s`` (overlapping blocks count once)."""
        with self._lock:
            if self._active == 0:
                self._since = self._clock()
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self._wall_spent_s += self._clock() - self._since
