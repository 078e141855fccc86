"""The sandbox provider: records what would have been sent, never sends.

Every message lands in the ``sandbox_messages`` table, so the API (any process) can show it at
``GET /v1/sandbox/messages``.
"""

from __future__ import annotations

from typing import ClassVar

from sqlalchemy.ext.asyncio import AsyncEngine

from providers.base import RenderedMessage, SendResult
from schema.enums import Channel
from schema.ids import uuid7
from schema.models import SandboxMessage

_table = SandboxMessage.__table__  # type: ignore[attr-defined]


class SandboxProvider:
    """Accepts every message for any channel and stores it; the message id is ``sbx-<uuid7>``."""

    name: ClassVar[str] = "sandbox"
    channel: ClassVar[Channel] = Channel.email  # serves every channel; the attribute names the default

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def send(self, message: RenderedMessage) -> SendResult:
        message_id = f"sbx-{uuid7()}"
        async with self._engine.begin() as conn:
            await conn.execute(
                _table.insert().values(
                    notification_id=message.notification_id,
                    tenant_id=message.tenant_id,
                    channel=message.channel.value,
                    recipient=message.to,
                    subject=message.subject,
                    body=message.body,
                    html=message.html,
                    data={
                        **message.data,
                        **({"unsubscribe_url": message.unsubscribe_url} if message.unsubscribe_url else {}),
                    },
                    provider_message_id=message_id,
                )
            )
        return SendResult(provider=self.name, provider_message_id=message_id)

    async def aclose(self) -> None:
        return None
