"""Provider webhooks: ``POST /v1/webhooks/twilio/status`` and ``POST /v1/webhooks/sendgrid/events``.

No API key: each request is authenticated by the provider's signature (see ``api.webhooks`` and ``api.sendgrid_events``).
"""

from __future__ import annotations

from uuid import UUID

from fastapi import APIRouter, Request

from api.sendgrid_events import record_sendgrid_events
from api.sendgrid_signature import SENDGRID_SIGNATURE_HEADER, SENDGRID_TIMESTAMP_HEADER
from api.webhooks import TWILIO_SIGNATURE_HEADER, WebhookResult, record_twilio_status
from clarion.settings import Settings
from providers.settings import TWILIO_STATUS_CALLBACK_PATH

router = APIRouter(tags=["webhooks"])

SENDGRID_EVENTS_PATH = "/v1/webhooks/sendgrid/events"
# SendGrid posts a batch after about 30 seconds or once it reaches 768 KB (its Event Webhook guide,
# "Data Storage"; docs/providers.md 4.4), so a batch ends with the event that takes it past 768 KB:
# one event is at most tens of KB (custom args are capped at 10,000 bytes). A batch refused for size
# would be retried and refused again until SendGrid drops it, so the limit is a third above that,
# larger than a send's; past it, 413 ``payload_too_large`` before the body is read (it was 4 MB:
# 25,000 opens, a batch SendGrid does not send, and 16 s of SendGrid's turn before engagement was
# recorded set-based).
SENDGRID_EVENTS_MAX_BODY_BYTES = 1024 * 1024


@router.post(TWILIO_STATUS_CALLBACK_PATH, response_model=WebhookResult)
async def twilio_status(request: Request) -> WebhookResult:
    """A Twilio message status callback (form-encoded, signed with ``X-Twilio-Signature``)."""
    settings: Settings = request.app.state.settings
    token = settings.providers.twilio.auth_token
    # Twilio signs the URL it called: our public base URL, this path and the query string.
    url = settings.base_url.rstrip("/") + request.url.path
    if request.url.query:
        url += "?" + request.url.query
    return await record_twilio_status(
        pool=request.app.state.pool,
        gate=request.app.state.callback_gate,
        auth_token=token.get_secret_value() if token is not None else None,
        url=url,
        body=await request.body() if token is not None else b"",
        signature=request.headers.get(TWILIO_SIGNATURE_HEADER),
        notification_id=_uuid_or_none(request.query_params.get("notification_id")),
    )


@router.post(SENDGRID_EVENTS_PATH, response_model=WebhookResult)
async def sendgrid_events(request: Request) -> WebhookResult:
    """A batch of SendGrid Event Webhook events (JSON array, ECDSA-signed over the raw body)."""
    settings: Settings = request.app.state.settings
    key = settings.providers.sendgrid.webhook_public_key
    signature = request.headers.get(SENDGRID_SIGNATURE_HEADER)
    # Anonymous: up to 1 MB is read only for a request that could be verified at all.
    read = key is not None and signature is not None
    return await record_sendgrid_events(
        pool=request.app.state.pool,
        gate=request.app.state.callback_gate,
        public_key=key,
        payload=await request.body() if read else b"",
        signature=signature,
        timestamp=request.headers.get(SENDGRID_TIMESTAMP_HEADER),
    )


def _uuid_or_none(value: str | None) -> UUID | None:
    try:
        return UUID(value) if value else None
    except ValueError:
        return None
