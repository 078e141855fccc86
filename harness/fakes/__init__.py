"""Local servers that speak the providers' protocols, for tests and benchmarks.

Each fake starts on 127.0.0.1 and a free port (``async with FakeTwilio() as fake``), records every
request in ``fake.requests`` and has knobs (``force_rate_limit``, ``force_server_error``,
``force_timeout`` and per-address permanent errors). ``python -m harness.fakes.<name> --port N`` serves
one from a separate process and prints what a client needs as one JSON line.
"""

from __future__ import annotations

import uuid
from typing import Any

from providers.base import RenderedMessage
from schema.enums import Channel


def make_message(channel: Channel = Channel.email, **overrides: Any) -> RenderedMessage:
    """A rendered message with plausible defaults for ``channel``; override any field."""
    defaults: dict[str, Any] = {
        Channel.email: {"to": "ada@example.com", "subject": "Build finished", "html": "<p>main is green</p>"},
        Channel.sms: {"to": "+14155550100"},
        Channel.push: {"to": "a" * 64, "subject": "Build finished", "platform": "apns"},
    }[channel]
    fields: dict[str, Any] = {
        "notification_id": uuid.uuid4(),
        "tenant_id": "acme",
        "channel": channel,
        "body": "main is green",
        **defaults,
        **overrides,
    }
    return RenderedMessage(**fields)
