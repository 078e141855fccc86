"""The Twilio fake driven by the official ``twilio`` SDK: it must agree with every answer."""

from __future__ import annotations

import asyncio

import pytest
from twilio.base.exceptions import TwilioRestException
from twilio.rest import Client

from harness.fakes.twilio import FakeTwilio
from tests.fixtures.provider_fakes import running_fake

FROM = "+15005550006"


fake = running_fake(FakeTwilio)


def client_for(fake: FakeTwilio) -> Client:
    client = Client(fake.account_sid, fake.auth_token)
    client.api.base_url = fake.url
    return client


async def create(fake: FakeTwilio, **kwargs: object) -> object:
    # The sync SDK blocks: run it off the loop that serves the fake.
    return await asyncio.to_thread(lambda: client_for(fake).messages.create(**kwargs))


async def test_sms_and_whatsapp_are_created(fake: FakeTwilio) -> None:
    sms = await create(fake, to="+14155550100", from_=FROM, body="hi")
    whatsapp = await create(fake, to="whatsapp:+14155550100", from_=f"whatsapp:{FROM}", body="hi")
    media = await create(fake, to="+14155550100", from_=FROM, media_url=["https://example.com/a.png"])

    assert [m.sid[:2] for m in (sms, whatsapp, media)] == ["SM", "SM", "SM"]  # type: ignore[attr-defined]
    assert whatsapp.to == "whatsapp:+14155550100"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("code", "status"), [(21211, 400), (21610, 400), (21614, 400)])
async def test_error_codes_reach_the_sdk(fake: FakeTwilio, code: int, status: int) -> None:
    fake.fail_number("+14155550100", code)

    with pytest.raises(TwilioRestException) as caught:
        await create(fake, to="+14155550100", from_=FROM, body="hi")

    assert (caught.value.status, caught.value.code) == (status, code)


async def test_rate_limit_is_20429_without_a_retry_hint(fake: FakeTwilio) -> None:
    fake.force_rate_limit()

    with pytest.raises(TwilioRestException) as caught:
        await create(fake, to="+14155550100", from_=FROM, body="hi")

    assert (caught.value.status, caught.value.code) == (429, 20429)


async def test_wrong_credentials_are_20003(fake: FakeTwilio) -> None:
    client = Client(fake.account_sid, "wrong")
    client.api.base_url = fake.url

    with pytest.raises(TwilioRestException) as caught:
        await asyncio.to_thread(lambda: client.messages.create(to="+14155550100", from_=FROM, body="x"))

    assert (caught.value.status, caught.value.code) == (401, 20003)
