"""Who may post a provider webhook: Twilio's and SendGrid's signatures checked against
docs/providers.md's test vectors, and a provider that is not configured answers 404."""

from __future__ import annotations

from starlette.datastructures import FormData
from twilio.request_validator import RequestValidator

from api.sendgrid_signature import sendgrid_signature_valid
from api.webhooks import twilio_signature_valid
from harness.services import ApiServer, api_client
from tests.fixtures.answers import assert_error
from tests.fixtures.hooks import SENDGRID_PATH, TWILIO_PATH, callback

# docs/providers.md 3.5 and 4.5.
TWILIO_VECTOR = {
    "token": "12345",
    "url": "https://mycompany.com/myapp.php?foo=1&bar=2",
    "params": {
        "CallSid": "CA1234567890ABCDE",
        "Caller": "+12349013030",
        "Digits": "1234",
        "From": "+12349013030",
        "To": "+18005551212",
    },
    "signature": "0/KCTR6DLpKmkAf8muzZqo1nDgQ=",
}


SENDGRID_VECTOR = {
    "public_key": "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==",
    "timestamp": "1588788367",
    "payload": b'{"category":"example_payload","event":"test_event","message_id":"message_id"}',
    "signature": "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH2j/0=",
}


def test_twilio_signature_matches_the_documented_test_vector() -> None:
    v = TWILIO_VECTOR
    assert RequestValidator(v["token"]).compute_signature(v["url"], v["params"]) == v["signature"]
    params = FormData(list(v["params"].items()))  # type: ignore[union-attr]
    assert twilio_signature_valid(
        auth_token=v["token"], url=v["url"], params=params, signature=v["signature"]
    )
    tampered = FormData([*v["params"].items(), ("Extra", "1")])  # type: ignore[union-attr]
    assert not twilio_signature_valid(
        auth_token=v["token"], url=v["url"], params=tampered, signature=v["signature"]
    )
    assert not twilio_signature_valid(
        auth_token="54321", url=v["url"], params=params, signature=v["signature"]
    )


def test_sendgrid_signature_matches_the_documented_test_vector_within_ten_minutes() -> None:
    v = SENDGRID_VECTOR
    at_s = int(v["timestamp"]) + 60  # type: ignore[call-overload]
    common = {"public_key": v["public_key"], "signature": v["signature"], "timestamp": v["timestamp"]}
    assert sendgrid_signature_valid(payload=v["payload"], now_s=at_s, **common)  # type: ignore[arg-type]
    assert not sendgrid_signature_valid(payload=v["payload"] + b" ", now_s=at_s, **common)  # type: ignore[arg-type, operator]
    assert not sendgrid_signature_valid(payload=v["payload"], now_s=at_s + 600, **common)  # type: ignore[arg-type]


async def test_webhooks_answer_404_when_the_provider_is_not_configured(api: ApiServer) -> None:
    async with api_client(api.url, None) as client:
        twilio = await client.post(TWILIO_PATH, data=callback("SM1", "delivered"))
        sendgrid = await client.post(SENDGRID_PATH, content=b"[]")
    assert_error(twilio, 404, "not_configured")
    assert_error(sendgrid, 404, "not_configured")
