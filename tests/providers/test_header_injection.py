"""A subject that decodes to more than one header is refused by every email adapter before sending,
proved against a real SMTP server (aiosmtpd) on this machine's Python and the SendGrid fake."""

from __future__ import annotations

import email
from collections.abc import AsyncIterator, Callable, Iterator
from email import policy
from typing import Any

import pytest

from harness.fakes import make_message
from harness.fakes.sendgrid import FakeSendGrid
from providers.base import Provider
from providers.errors import PermanentProviderError
from providers.headers import check_header_value
from providers.sendgrid import SendGridProvider
from schema.enums import Channel
from tests.fixtures.mailbox import Mailbox, smtp_provider, smtp_server
from tests.fixtures.provider_settings import sendgrid_settings

INJECTIONS = [
    "=?utf-8?q?Ada=0D=0AReply-To:_attacker@evil.example=0D=0AContent-Type:_text/html=0D=0A=0D=0A<h1>Injected</h1>?=",
    "Hi =?utf-8?b?QWRhDQpCY2M6IGV2aWxAZXZpbC5leGFtcGxl?=",  # base64: "Ada\r\nBcc: evil@evil.example"
    "=?utf-8?q?Ada=0ABcc:_evil@evil.example?=",
    "=?iso-8859-1?q?x=00y?=",
    "Hello\u2028Bcc: evil@evil.example",
    "=?x-unknown?q?Ada=0D=0ABcc:_evil@evil.example?=",
]


@pytest.fixture
def smtp() -> Iterator[tuple[Mailbox, int]]:
    with smtp_server() as server:
        yield server


@pytest.fixture(params=["smtp", "sendgrid"])
async def adapter(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Provider, Callable[[], list[Any]]]]:
    """Each email adapter, and what has reached its server so far."""
    if request.param == "smtp":
        mailbox, port = request.getfixturevalue("smtp")
        yield smtp_provider(port), lambda: mailbox.messages
        return
    async with FakeSendGrid() as fake:
        provider = SendGridProvider(sendgrid_settings(fake, timeout_s=0.5))
        yield provider, lambda: fake.requests
        await provider.aclose()


@pytest.mark.parametrize("subject", INJECTIONS)
async def test_an_encoded_word_that_decodes_to_a_line_break_is_refused_before_sending(
    adapter: tuple[Provider, Callable[[], list[Any]]], subject: str
) -> None:
    provider, delivered = adapter
    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(make_message(Channel.email, subject=subject))
    assert caught.value.code == "header_injection"
    assert delivered() == []


async def test_an_ordinary_encoded_subject_still_goes_out_as_one_header(smtp: tuple[Mailbox, int]) -> None:
    mailbox, port = smtp
    await smtp_provider(port).send(make_message(Channel.email, subject="Caf\u00e9 =?utf-8?q?ol=C3=A9?= news"))
    (envelope,) = mailbox.messages
    received = email.message_from_bytes(envelope.content, policy=policy.default)
    assert received["Reply-To"] is None and received["Bcc"] is None
    assert "olé" in str(received["Subject"])
    assert received.get_content_type() in {"text/plain", "multipart/alternative"}


def test_plain_subjects_pass_unchanged() -> None:
    for subject in ["Your order shipped", "Prix: 10 € =? not a word", "=?utf-8?q?Caf=C3=A9?="]:
        assert check_header_value(subject, provider="smtp", field="subject") == subject


async def test_an_encoded_word_in_the_data_of_a_subject_is_refused_at_accept_time(client: Any) -> None:
    send = {
        "event_id": "inject-1",
        "user": {"id": "u-inject", "email": "ada@example.com"},
        "channel": "email",
        "content": {"subject": "Hello {{ name }}", "body": "b"},
        "data": {"name": INJECTIONS[0]},
    }
    response = await client.post("/v1/notifications", json=send)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "unsafe_template"
