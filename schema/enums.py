"""Enumerations shared by every part of Clarion."""

from enum import StrEnum


class Channel(StrEnum):
    push = "push"
    sms = "sms"
    email = "email"


class Priority(StrEnum):
    critical = "critical"
    high = "high"
    normal = "normal"
    bulk = "bulk"


class Status(StrEnum):
    accepted = "accepted"
    queued = "queued"
    sending = "sending"
    sent = "sent"
    failed = "failed"
    suppressed = "suppressed"
    throttled = "throttled"
    duplicate = "duplicate"
    cancelled = "cancelled"
    expired = "expired"
    dead = "dead"
    scheduled = "scheduled"
    delayed = "delayed"
    retrying = "retrying"


TERMINAL_STATUSES = frozenset(
    {
        Status.sent,
        Status.failed,
        Status.suppressed,
        Status.throttled,
        Status.duplicate,
        Status.cancelled,
        Status.expired,
        Status.dead,
    }
)

# States from which a worker may claim a notification for sending.
CLAIMABLE_STATUSES = frozenset(
    {Status.accepted, Status.queued, Status.retrying, Status.delayed, Status.scheduled}
)


class Platform(StrEnum):
    apns = "apns"
    fcm = "fcm"


class Scope(StrEnum):
    send = "send"
    read = "read"
    admin = "admin"
    preferences = "preferences"


class EngagementType(StrEnum):
    """What happened to a notification after it was sent (one ``engagement`` row per type and link)."""

    delivered = "delivered"
    bounced = "bounced"
    opened = "opened"
    clicked = "clicked"
    unsubscribed = "unsubscribed"
    complained = "complained"
    prefetched = "prefetched"  # an open pixel or link fetched by a proxy or scanner, not a person
