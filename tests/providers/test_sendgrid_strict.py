"""The SendGrid fake refuses what Mail Send refuses; SendGridProvider's mail passes it."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from harness.fakes import make_message
from harness.fakes.sendgrid import FakeSendGrid
from providers.sendgrid import SendGridProvider, _without_repeated_recipients
from schema.enums import Channel
from tests.fixtures.provider_fakes import running_fake
from tests.fixtures.provider_settings import sendgrid_settings

SENDER = {"email": "noreply@clarion.test"}
CONTENT = [{"type": "text/plain", "value": "hi"}]


fake = running_fake(FakeSendGrid)


async def mail_send(fake: FakeSendGrid, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{fake.url}/v3/mail/send", json=body, headers={"Authorization": f"Bearer {fake.api_key}"}
        ) as response:
            return response.status, (await response.json() if response.status >= 400 else {})


def person(**kinds: list[str]) -> dict[str, Any]:
    return {kind: [{"email": e} for e in emails] for kind, emails in kinds.items()}


@pytest.mark.parametrize(
    "people",
    [
        [person(to=["a@x.test"], cc=["A@x.test"])],
        [person(to=["a@x.test"], bcc=["a@x.test"])],
        [person(to=["a@x.test", "a@x.test"])],
        [person(to=[f"u{i}@x.test" for i in range(600)]), person(to=[f"v{i}@x.test" for i in range(401)])],
    ],
)
async def test_fake_refuses_repeated_addresses_and_over_1000_recipients(
    fake: FakeSendGrid, people: list[dict[str, Any]]
) -> None:
    status, body = await mail_send(
        fake, {"personalizations": people, "from": SENDER, "subject": "s", "content": CONTENT}
    )

    assert status == 400
    assert body["errors"][0]["field"].startswith("personalizations")


async def test_fake_accepts_1000_recipients(fake: FakeSendGrid) -> None:
    people = [person(to=[f"u{i}@x.test" for i in range(500)], cc=[f"c{i}@x.test" for i in range(500)])]

    status, _ = await mail_send(
        fake, {"personalizations": people, "from": SENDER, "subject": "s", "content": CONTENT}
    )

    assert status == 202


async def test_fake_accepts_a_dynamic_template_without_subject_or_content(fake: FakeSendGrid) -> None:
    people = [{**person(to=["a@x.test"]), "dynamic_template_data": {"name": "Ada"}}]
    template = "d-" + "0" * 32

    assert (await mail_send(fake, {"personalizations": people, "from": SENDER, "template_id": template}))[
        0
    ] == 202
    assert (await mail_send(fake, {"personalizations": people, "from": SENDER, "template_id": "nope"}))[
        0
    ] == 400
    assert (await mail_send(fake, {"personalizations": people, "from": SENDER}))[0] == 400


def test_adapter_never_sends_a_repeated_recipient() -> None:
    body = {"personalizations": [person(to=["a@x.test"], cc=["A@X.test", "b@x.test"], bcc=["b@x.test"])]}

    assert _without_repeated_recipients(body)["personalizations"] == [
        person(to=["a@x.test"], cc=["b@x.test"])
    ]


async def test_adapter_html_text_category_and_custom_args_pass_strict_fake(fake: FakeSendGrid) -> None:
    adapter = SendGridProvider(sendgrid_settings(fake))
    message = make_message(
        Channel.email, to="ada@x.test", subject="Hi", body="text", html="<p>html</p>", category="billing"
    )
    try:
        result = await adapter.send(message)
    finally:
        await adapter.aclose()

    sent = fake.requests[0].body
    assert result.provider_message_id
    assert [c["type"] for c in sent["content"]] == ["text/plain", "text/html"]
    assert sent["categories"] == ["billing"]
    assert sent["custom_args"]["notification_id"] == str(message.notification_id)
