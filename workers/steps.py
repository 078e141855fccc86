"""The checks a notification passes between claim and send, as pluggable steps.

- A ``Screen`` runs on the whole claimed batch before rendering (one query for the batch):
  opt-out preferences, quiet hours. It returns an ``Outcome`` for each notification it stops.
- A ``Gate`` runs per notification after rendering, right before the provider call: content
  dedupe, rate limits. It returns an ``Outcome`` to stop (``duplicate``, ``delayed``,
  ``throttled``) or ``None`` to let it through.

A stopping outcome is recorded like any other (status, error code, detail, ``not_before`` for a
delay) and the relay republishes delayed notifications when they are due.
"""

from __future__ import annotations

from typing import Protocol
from uuid import UUID

from core.render import RenderedContent
from workers.claim import ClaimedNotification
from workers.outcome import Outcome
from workers.recipients import Address


class Screen(Protocol):
    name: str

    async def screen(self, rows: list[ClaimedNotification]) -> dict[UUID, Outcome]:
        """Outcomes for the notifications that must not be sent now; absent ids go on."""
        ...


class Gate(Protocol):
    name: str

    async def admit(
        self, row: ClaimedNotification, content: RenderedContent, addresses: list[Address]
    ) -> Outcome | None:
        """None to send now, or the outcome that stops this notification."""
        ...
