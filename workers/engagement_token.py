"""The token a push carries so the device can report its open or click without an API key.

Added to every push's data under ``clarion_event_token`` (``PUSH_DATA_KEY``): APNs puts data keys
beside ``aps``, FCM in ``message.data``; the key is none of FCM's reserved ones (``from``,
``message_type``, ``google.*``, ``gcm.*``). Signed with ``CLARION_SECRET_KEY``
(``clarion.engagement_tokens``), valid ``CLARION_ENGAGEMENT_TOKEN_TTL_S``; the app posts it to
``POST /v1/device/events``.
"""

from __future__ import annotations

from dataclasses import dataclass

from clarion.engagement_tokens import PUSH_DATA_KEY, make_engagement_token
from workers.claim import ClaimedNotification


@dataclass(frozen=True, slots=True)
class PushEventToken:
    secret: str
    ttl_s: float

    def data(self, n: ClaimedNotification) -> dict[str, str]:
        """The push data entry carrying ``n``'s token (it wins over a tenant data key of that name)."""
        token = make_engagement_token(
            secret=self.secret, tenant_id=n.tenant_id, notification_id=n.id, ttl_s=self.ttl_s
        )
        return {PUSH_DATA_KEY: token}
