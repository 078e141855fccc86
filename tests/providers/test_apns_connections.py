"""ApnsProvider's HTTP/2 connections against the local APNs fake: shared by concurrent sends, a
server's stream limit and flow-control window respected, a lost or GOAWAY'd connection replaced,
a timed-out stream leaving its connection usable (providers/h2client.py)."""

from __future__ import annotations

import asyncio
import uuid
from functools import partial
from typing import Any

import pytest

from harness.fakes import make_message
from harness.fakes.apns import FakeApns
from harness.services import wait_until
from providers.apns import ApnsProvider
from providers.base import RenderedMessage
from providers.errors import TransientProviderError
from schema.enums import Channel
from tests.fixtures.provider_fakes import running_fake
from tests.fixtures.provider_settings import apns_settings

fake = running_fake(FakeApns)
settings_for = partial(apns_settings, timeout_s=0.5)  # short: the timed-out stream waits it out


def push(**overrides: Any) -> RenderedMessage:
    return make_message(Channel.push, **{"to": "ab" * 32, **overrides})


@pytest.mark.parametrize("connections", [1, 3])
async def test_concurrent_sends_share_the_configured_http2_connections(
    fake: FakeApns, connections: int
) -> None:
    provider = ApnsProvider(settings_for(fake, connections=connections))
    try:
        results = await asyncio.gather(
            *(provider.send(push(notification_id=uuid.uuid4())) for _ in range(50))
        )
    finally:
        await provider.aclose()

    assert len({r.provider_message_id for r in results}) == 50
    assert fake.connections_opened == connections


async def test_sends_beyond_the_servers_stream_limit_wait_for_a_free_stream(fake: FakeApns) -> None:
    provider = ApnsProvider(settings_for(fake, connections=1, timeout_s=10))
    try:  # the fake (h2's default) allows 100 concurrent streams per connection
        results = await asyncio.gather(
            *(provider.send(push(notification_id=uuid.uuid4())) for _ in range(350))
        )
    finally:
        await provider.aclose()

    assert len({r.provider_message_id for r in results}) == 350
    assert fake.connections_opened == 1


async def test_bodies_beyond_the_connection_flow_control_window_all_arrive(fake: FakeApns) -> None:
    provider = ApnsProvider(settings_for(fake, connections=1, timeout_s=10))
    blob = "x" * 3900  # 60 x ~4 KB in flight: four times HTTP/2's initial 64 KB connection window
    try:
        await asyncio.gather(*(provider.send(push(data={"blob": blob})) for _ in range(60)))
    finally:
        await provider.aclose()

    assert len(fake.requests) == 60
    assert all(request.body["blob"] == blob for request in fake.requests)


async def test_a_lost_connection_is_replaced_on_a_later_send(fake: FakeApns) -> None:
    provider = ApnsProvider(settings_for(fake, connections=1))

    async def delivered() -> bool:
        try:
            await provider.send(push())
        except TransientProviderError as exc:  # a send racing the drop may see the old connection die
            assert exc.code == "connection_error"
            return False
        return True

    try:
        await provider.send(push())
        fake.drop_connections()
        await wait_until(delivered, timeout_s=5)
    finally:
        await provider.aclose()

    assert fake.connections_opened == 2


async def test_after_goaway_pushes_go_to_a_new_connection(fake: FakeApns) -> None:
    provider = ApnsProvider(settings_for(fake, connections=1))
    try:
        await provider.send(push())
        fake.send_goaway()

        async def delivered_elsewhere() -> bool:
            await provider.send(push())  # the GOAWAY'd connection takes no new stream: never an error
            return fake.connections_opened == 2

        await wait_until(delivered_elsewhere, timeout_s=5)
    finally:
        await provider.aclose()


async def test_a_timed_out_stream_does_not_spoil_the_connection(fake: FakeApns) -> None:
    provider = ApnsProvider(settings_for(fake, connections=1))
    fake.force_timeout(delay_s=2)
    try:
        with pytest.raises(TransientProviderError) as caught:
            await provider.send(push())
        result = await provider.send(push())
    finally:
        await provider.aclose()

    assert caught.value.code == "timeout"
    assert result.http_status == 200
    assert fake.connections_opened == 1
