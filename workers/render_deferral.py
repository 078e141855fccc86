"""Render deferral: a send whose tenant's render turn is busy waits for a later batch, a bounded
number of times.

``workers/content.py`` raises ``RenderDeferred`` when a tenant's earlier renders hold its turn past
``turn_wait_s``; the send is then ``delayed`` (``render_deferred``) and booked behind the tenant's
other deferred renders. Each deferral costs the shared log a claim, a record and two history
entries, and nothing else ended it: a tenant whose renders stay slow could keep a row deferred for
ever. So a row already deferred ``max_deferrals`` times is ``dead`` at its next deferral
(``render_deferred_too_often``, on the DLQ, redrivable once the tenant's renders are lighter).

The count is a column of the log, ``deferrals``: the record that writes a ``render_deferred``
outcome adds one (``workers/record.py``), so counting costs no write of its own, and a redrive
resets it (``api/dlq.py``). A bound on the count, not on the age since accept: it bounds the work
one row can cause, and a send scheduled or held for quiet hours is old at its first render without
having cost anything. The default (200) is well past what a legitimate backlog costs: once the
bookings reach ``MAX_DEFER_S`` ahead, a row is deferred about every 5 minutes, so 100,000 sends of a
tenant rendering 20 a second are all sent within about 17 deferrals (83 minutes), and 200 is about
16 hours of deferrals.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from clarion import metrics
from schema.enums import Channel, Status
from workers.claim import ClaimedNotification
from workers.outcome import Outcome

RENDER_DEFERRED = "render_deferred"
TOO_OFTEN = "render_deferred_too_often"


def deferred(
    *, notification: ClaimedNotification, after_s: float, max_deferrals: int, channel: Channel
) -> Outcome:
    """The outcome of ``notification``'s render deferred now, ``after_s`` seconds ahead: ``delayed``
    until then, or ``dead`` once it was deferred ``max_deferrals`` times already."""
    if notification.deferrals >= max_deferrals:
        metrics.RENDER_DEFERRALS.labels(notification.tenant_id, channel.value, "dead").inc()
        return Outcome(
            notification_id=notification.id,
            status=Status.dead,
            error_code=TOO_OFTEN,
            error_message=(
                f"deferred {notification.deferrals} times because this tenant's earlier "
                "notifications were still rendering"
            ),
            detail=f"dead after {max_deferrals} render deferrals (CLARION_MAX_RENDER_DEFERRALS)",
        )
    metrics.RENDER_DEFERRALS.labels(notification.tenant_id, channel.value, "deferred").inc()
    return Outcome(
        notification_id=notification.id,
        status=Status.delayed,
        error_code=RENDER_DEFERRED,
        error_message="this tenant's earlier notifications were still rendering",
        not_before=datetime.now(UTC) + timedelta(seconds=after_s),
        detail="render deferred to a later batch",
    )
