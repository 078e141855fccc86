"""Clarion's signatures verify with the reference ``standardwebhooks`` package, also mid-rotation."""

from __future__ import annotations

import time

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from core.webhook_signing import headers, new_secret

BODY = '{"type":"notification.sent","timestamp":"2026-11-25T09:00:00.000000Z","data":{"n":"\\u00e9"}}'


def test_a_signed_payload_verifies_with_the_reference_package() -> None:
    secret = new_secret()
    signed = headers(
        secrets=[secret],
        msg_id="01936f0e-0000-7000-8000-000000000001",
        timestamp_s=int(time.time()),
        body=BODY,
    )
    assert Webhook(secret).verify(BODY, signed)["data"] == {"n": "é"}


def test_another_secret_or_a_changed_body_does_not_verify() -> None:
    secret = new_secret()
    signed = headers(secrets=[secret], msg_id="m1", timestamp_s=int(time.time()), body=BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(BODY, signed)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY.replace("sent", "failed"), signed)


def test_during_a_rotation_both_the_new_and_the_old_secret_verify() -> None:
    new, old = new_secret(), new_secret()
    signed = headers(secrets=[new, old], msg_id="m2", timestamp_s=int(time.time()), body=BODY)
    assert len(signed["webhook-signature"].split(" ")) == 2
    Webhook(new).verify(BODY, signed)
    Webhook(old).verify(BODY, signed)


def test_secrets_are_fresh_and_in_the_whsec_form() -> None:
    a, b = new_secret(), new_secret()
    assert a != b and a.startswith("whsec_") and len(a) == len("whsec_") + 44
