"""One webhook call against a real receiver: the name in Host while the checked address is dialled,
no redirect followed, nothing called when the rule refuses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from core import ssrf
from core.webhook_signing import new_secret
from schema.ids import uuid7
from tests.fixtures.webhook_receiver import Receiver
from workers.webhook_claim import ClaimedDelivery
from workers.webhook_send import call, new_client

BODY = '{"type":"notification.opened","timestamp":"2026-11-25T09:00:00.000000Z","data":{}}'


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = await Receiver().start()
    r.secrets = [new_secret()]
    yield r
    await r.stop()


def _delivery(url: str, secret: str) -> ClaimedDelivery:
    return ClaimedDelivery(
        id=uuid7(),
        created_at=datetime.now(UTC),
        tenant_id="t-send",
        endpoint_id=uuid7(),
        event_id=uuid7(),
        body=BODY,
        attempts=1,
        url=url,
        secrets=(secret,),
    )


async def test_an_allow_listed_name_is_called_at_its_address_with_its_name_in_host(
    receiver: Receiver,
) -> None:
    url = f"http://localhost:{receiver.port}/hooks"
    async with new_client() as client:
        result = await call(
            client=client,
            delivery=_delivery(url, receiver.secrets[0]),
            allow=ssrf.AllowList.parse(["localhost"]),
            timeout_s=5,
        )
    assert result.ok and result.status == 204, result
    [received] = receiver.received
    assert received.headers["Host"] == f"localhost:{receiver.port}"
    assert received.headers["User-Agent"].startswith("Clarion-Webhooks/")


async def test_the_same_name_without_the_allow_list_is_never_called(receiver: Receiver) -> None:
    async with new_client() as client:
        result = await call(
            client=client,
            delivery=_delivery(f"http://localhost:{receiver.port}/hooks", receiver.secrets[0]),
            allow=ssrf.NOBODY,
            timeout_s=5,
        )
    assert not result.ok and result.refused and str(result.error).startswith("url_not_allowed")
    assert receiver.calls == 0


async def test_a_redirect_is_a_failure_not_followed(receiver: Receiver) -> None:
    receiver.status = 307
    async with new_client() as client:
        result = await call(
            client=client,
            delivery=_delivery(receiver.url, receiver.secrets[0]),
            allow=ssrf.AllowList.parse(["127.0.0.1"]),
            timeout_s=5,
        )
    assert (result.ok, result.status, result.error) == (False, 307, "redirect not followed HTTP 307")
    assert receiver.calls == 1
