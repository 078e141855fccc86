"""The retry lane and the dead-letter queue: where a recorded batch's late and dead notifications go.

After a batch is recorded, notifications rescheduled with a ``not_before``
(``retrying`` after provider failures, ``delayed`` by a gate) are published to
``notifications.<channel>.retry``, and ``dead`` ones to ``.dlq`` with their last error (undecodable
records go there too, wrapped with the decode error). A consumer group of its own
(``clarion-<channel>-retry``, on a broker client of its own so its group join runs alongside the
main lanes') reads the retry topic and, per batch, looks up each notification's ``not_before`` in
the log:

- due (or no longer waiting): delivered now, through the same claim as the main lane;
- due within ``retry.hold_max_s`` (seconds): the handler waits for it, so short retries are on time;
- due later: acked and left to the log, where the relay's ``not_before`` scan republishes it when due.

So a retry partition is held for at most ``hold_max_s`` per batch, never for minutes, and nothing
redelivers in a hot loop (no ``nack()``). Kafka is only the fast path: if a publish to ``.retry``
fails, or the worker dies, the relay republishes from the log, and the attempt count in the log
makes the schedule resume where it was. A notification reaching a worker by both paths is sent
once: only one claim succeeds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg

from clarion.kafka import Publisher
from schema.enums import Channel, Status
from schema.ids import created_window
from schema.messages import NotificationMessage, topic
from workers.outcome import Outcome

log = logging.getLogger(__name__)

WAITING = """
SELECT id, extract(epoch FROM not_before - now())::float8 AS wait_s
  FROM notifications
 WHERE id = ANY($1::uuid[]) AND created_at BETWEEN $2 AND $3
   AND status IN ('retrying', 'delayed') AND not_before > now()
"""


async def waiting_s(*, pool: asyncpg.Pool | None, ids: list[UUID]) -> dict[UUID, float]:
    """Seconds until due, for the notifications in ``ids`` still waiting (by the log's clock)."""
    if not ids or pool is None:
        return {}
    try:
        rows = await pool.fetch(WAITING, ids, *created_window(ids))
    except Exception as exc:  # deliver them all: the claim takes only due ones, the relay the rest
        log.warning("retry lane could not read not_before (%s: %s)", type(exc).__name__, exc)
        return {}
    return {r["id"]: float(r["wait_s"]) for r in rows}


async def deliver_when_due(
    messages: list[NotificationMessage],
    *,
    waits_s: dict[UUID, float],
    hold_s: float,
    deliver: Callable[[list[NotificationMessage]], Awaitable[None]],
) -> None:
    """Deliver the due ``messages`` now and those due within ``hold_s`` when they are due; the
    rest are left to the log, where the relay republishes them when due."""
    await deliver([m for m in messages if m.id not in waits_s])
    soon = sorted((m for m in messages if 0 < waits_s.get(m.id, 0) <= hold_s), key=lambda m: waits_s[m.id])
    started = time.monotonic()
    while soon:
        await asyncio.sleep(max(waits_s[soon[0].id] - (time.monotonic() - started), 0.0))
        elapsed = time.monotonic() - started
        wave = [m for m in soon if waits_s[m.id] <= elapsed + 0.05]
        soon = soon[len(wave) :]
        await deliver(wave)


class Forwarder:
    """Publishes a recorded batch's rescheduled notifications to the retry topic and its dead ones
    (and undecodable records) to the DLQ. Best effort: the log keeps both."""

    def __init__(self, *, publisher: Publisher, channel: Channel) -> None:
        self.publisher = publisher
        self.channel = channel

    async def forward(self, messages: list[NotificationMessage], outcomes: list[Outcome]) -> None:
        """Rescheduled ``outcomes`` to the retry topic, dead ones to the DLQ."""
        by_id = {m.id: m for m in messages}
        later = [
            by_id[o.notification_id]
            for o in outcomes
            if o.not_before is not None
            and o.status in (Status.retrying.value, Status.delayed.value)
            and o.notification_id in by_id
        ]
        if later:  # what the broker does not take, the relay republishes from the log when due
            await self.publisher.publish_many(later, lane="retry")
        for o in outcomes:
            if o.status == Status.dead.value and o.notification_id in by_id:
                m = by_id[o.notification_id]
                await self.dead_letter(dead_letter(m, o), m.key())

    async def dead_letter(self, value: bytes, key: bytes | None) -> None:
        """Publish ``value`` to the channel's DLQ; a failure is logged, not raised."""
        try:
            await self.publisher.publish_raw(topic(self.channel, "dlq"), value, key)
        except Exception as exc:  # the log keeps dead notifications; only the topic copy is missing
            log.warning("DLQ publish failed (%s: %s)", type(exc).__name__, exc)


def dead_letter(message: NotificationMessage, outcome: Outcome) -> bytes:
    """The DLQ record of a dead notification: the message plus its last error."""
    document: dict[str, Any] = message.model_dump(mode="json")
    document.update(
        status=outcome.status,
        error={"code": outcome.error_code, "message": outcome.error_message},
        detail=outcome.detail,
        dead_at=datetime.now(UTC).isoformat(),
    )
    return json.dumps(document).encode()
