"""What a render gives (``RenderedContent``) and the CPU budget a request's renders share."""

from __future__ import annotations

import threading
import time
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
    1,000 times the per-render limit), and with ``wall_s`` a time by which its renders must be
    done, however long they waited. Safe to share between the render threads."""

    def __init__(self, total_ms: float, *, wall_s: float | None = None) -> None:
        self.total_ms = total_ms
        self._spent_s = 0.0
        self._lock = threading.Lock()
        self.deadline = time.monotonic() + wall_s if wall_s is not None else None

    @property
    def remaining_ms(self) -> float:
        """CPU left, or the time left before the deadline when that is less."""
        left = self.total_ms - self._spent_s * 1000
        if self.deadline is not None:
            left = min(left, (self.deadline - time.monotonic()) * 1000)
        return left

    def spend(self, seconds: float) -> None:
        with self._lock:
            self._spent_s += seconds
