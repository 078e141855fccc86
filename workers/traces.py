"""The worker's spans of a notification's trace (``clarion.tracing`` draws the whole tree).

The claim and the record are one statement for a whole batch, and the provider calls are timed by
their ``Attempt`` rows, so these spans are recorded once the step is over, one per notification,
with the step's own start and end: each trace shows its notification's part, nothing else. Every
function here is called only when ``tracing.enabled``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from uuid import UUID

from clarion import tracing
from schema.messages import NotificationMessage
from workers.outcome import Attempt, Outcome


def claim_spans(
    messages: Sequence[NotificationMessage], claimed: set[UUID], *, start_ns: int, end_ns: int
) -> dict[UUID, str]:
    """A ``clarion.claim`` span per message of the batch, each a child of its message's traceparent
    (none or invalid: a trace of its own); returns the traceparents of the claimed ones, the
    parents of their later steps."""
    parents: dict[UUID, str] = {}
    for m in {m.id: m for m in messages}.values():
        traceparent = tracing.emit(
            "clarion.claim",
            parent=m.traceparent,
            start_ns=start_ns,
            end_ns=end_ns,
            kind="consumer",
            attributes={
                "clarion.notification_id": str(m.id),
                "clarion.channel": m.channel.value,
                "clarion.claimed": m.id in claimed,
                "messaging.system": "kafka",
                "messaging.batch.message_count": len(messages),
            },
        )
        if m.id in claimed:
            parents[m.id] = traceparent
    return parents


def provider_spans(parent: str | None, attempts: Iterable[Attempt]) -> None:
    """A ``clarion.provider.send`` span per provider call, timed by its attempt row."""
    for a in attempts:
        if a.provider == "none":  # an infrastructure fault counted as an attempt, not a call
            continue
        attributes: dict[str, tracing.Value] = {
            "clarion.notification_id": str(a.notification_id),
            "clarion.provider": a.provider,
            "clarion.attempt": a.attempt,
            "clarion.outcome": a.outcome,
        }
        if a.http_status is not None:
            attributes["http.response.status_code"] = a.http_status
        tracing.emit(
            "clarion.provider.send",
            parent=parent,
            start_ns=_ns(a.started_at),
            end_ns=_ns(a.finished_at),
            kind="client",
            attributes=attributes,
            error_type=None if a.outcome == "sent" else (a.error_code or a.outcome),
        )


def record_spans(
    parents: dict[UUID, str], outcomes: Iterable[Outcome], *, start_ns: int, end_ns: int
) -> None:
    """A ``clarion.record`` span per recorded outcome; its parent is taken out of ``parents``."""
    for o in outcomes:
        parent = parents.pop(o.notification_id, None)
        if parent is None:
            continue
        tracing.emit(
            "clarion.record",
            parent=parent,
            start_ns=start_ns,
            end_ns=end_ns,
            attributes={"clarion.notification_id": str(o.notification_id), "clarion.status": o.status.value},
        )


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000) * 1_000
