"""The sandbox provider: records what would have been sent, never sends.

Every message is handed to a ``SandboxStore`` (in deployments ``clarion.sandbox_store``, the
``sandbox_messages`` table), so the API (any process) can show it at ``GET /v1/sandbox/messages``.
"""

from __future__ import annotations

from typing import ClassVar, Protocol
from uuid import UUID

from providers.base import RenderedMessage, SendResult
from schema.enums import Channel
from schema.ids import uuid7

# notification_id, tenant_id, channel, recipient, subject, body, html, data, provider_message_id
SandboxRecord = tuple[UUID, str, str, str, str | None, str, str | None, dict[str, str], str]


class SandboxStore(Protocol):
    async def save(self, record: SandboxRecord) -> None:
        """Keep ``record``; return once it is stored."""
        ...

    async def aclose(self) -> None: ...


class SandboxProvider:
    """Accepts every message for any channel and stores it; the message id is ``sbx-<uuid7>``."""

    name: ClassVar[str] = "sandbox"
    channel: ClassVar[Channel] = Channel.email  # serves every channel; the attribute names the default

    def __init__(self, store: SandboxStore) -> None:
        self.store = store

    async def send(self, message: RenderedMessage) -> SendResult:
        """Store the message; it is never sent anywhere."""
        message_id = f"sbx-{uuid7()}"
        data = dict(message.data)
        if message.unsubscribe_url:
            data["unsubscribe_url"] = message.unsubscribe_url
        await self.store.save(
            (
                message.notification_id, message.tenant_id, message.channel.value, message.to,
                message.subject, message.body, message.html, data, message_id,
            )
        )  # fmt: skip
        return SendResult(provider=self.name, provider_message_id=message_id)

    async def aclose(self) -> None:
        await self.store.aclose()
