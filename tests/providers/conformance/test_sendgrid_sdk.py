"""The SendGrid fake driven by the official ``sendgrid`` SDK: it must agree with every answer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from python_http_client.exceptions import HTTPError
from sendgrid import SendGridAPIClient
from sendgrid.helpers.mail import Mail

from harness.fakes.sendgrid import FakeSendGrid
from tests.fixtures.provider_fakes import running_fake

fake = running_fake(FakeSendGrid)


async def send(fake: FakeSendGrid, mail: Mail, api_key: str | None = None) -> Any:
    client = SendGridAPIClient(api_key or fake.api_key, host=fake.url)
    return await asyncio.to_thread(client.send, mail)


def mail(**kwargs: Any) -> Mail:
    values = {"from_email": "noreply@clarion.test", "to_emails": "ada@x.test", "subject": "s"}
    return Mail(**{**values, "plain_text_content": "hi", **kwargs})


async def test_mail_is_accepted_with_a_message_id(fake: FakeSendGrid) -> None:
    response = await send(fake, mail(html_content="<p>hi</p>"))

    assert response.status_code == 202 and response.headers["X-Message-Id"]


async def test_dynamic_template_is_accepted(fake: FakeSendGrid) -> None:
    message = Mail(from_email="noreply@clarion.test", to_emails="ada@x.test")
    message.template_id = "d-" + "1" * 32
    message.dynamic_template_data = {"name": "Ada"}

    assert (await send(fake, message)).status_code == 202


async def test_repeated_recipient_is_a_400_with_errors(fake: FakeSendGrid) -> None:
    body = mail().get()  # the SDK's Personalization drops repeats itself: post raw JSON
    body["personalizations"][0]["cc"] = [{"email": "ADA@x.test"}]
    client = SendGridAPIClient(fake.api_key, host=fake.url)

    with pytest.raises(HTTPError) as caught:
        await asyncio.to_thread(lambda: client.client.mail.send.post(request_body=body))

    assert caught.value.status_code == 400
    assert json.loads(caught.value.body)["errors"][0]["field"].startswith("personalizations")


async def test_bad_key_is_401(fake: FakeSendGrid) -> None:
    with pytest.raises(HTTPError) as caught:
        await send(fake, mail(), api_key="SG.wrong.key")

    assert caught.value.status_code == 401


async def test_rate_limit_is_429_with_reset_header(fake: FakeSendGrid) -> None:
    fake.force_rate_limit()

    with pytest.raises(HTTPError) as caught:
        await send(fake, mail())

    assert caught.value.status_code == 429
    assert int(caught.value.headers["X-RateLimit-Reset"]) > 0
