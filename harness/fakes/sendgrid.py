"""A local SendGrid v3 Mail Send: ``POST /v3/mail/send`` with Bearer auth and field validation.

Answers 202 + ``X-Message-Id`` (200 in sandbox mode), errors in SendGrid's ``{"errors": [...]}``
shape, and ``X-RateLimit-*`` headers on every response. With ``webhook_url`` set, each accepted
(non-sandbox) send is followed by a signed Event Webhook batch (``processed``, then ``delivered``
or ``bounce`` per ``bounce_email``) carrying the custom args at top level (docs/providers.md 4.4, 4.5):
ECDSA P-256 over timestamp + raw body, with a key generated per fake (``public_key`` is its
base64 DER, what SendGrid shows as the verification key).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from harness.fakes.base import AiohttpFake, json_response, run_cli
from harness.fakes.reports import Reports

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_TEMPLATE_ID = re.compile(r"^d-[0-9a-f]{32}$")
_RESERVED_HEADERS = {
    "x-sg-id", "x-sg-eid", "received", "dkim-signature", "content-type", "content-transfer-encoding",
    "to", "from", "subject", "reply-to", "cc", "bcc",
}  # fmt: skip
SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"


@dataclass
class EventPost:
    """One signed Event Webhook POST the fake made, and how the receiver answered."""

    events: list[dict[str, Any]]
    status: int = 0


class FakeSendGrid(AiohttpFake):
    """Accepts mail for ``api_key``; ``fail_email(address, status, message, field)`` forces an error."""

    def __init__(self, *, port: int = 0, api_key: str | None = None, rate_limit: int = 600) -> None:
        super().__init__(port=port)
        self.api_key = api_key or f"SG.{secrets.token_urlsafe(16)}.{secrets.token_urlsafe(24)}"
        self.rate_limit = rate_limit
        self.email_errors: dict[str, tuple[int, str, str | None]] = {}
        self.webhook_url: str | None = None
        self.webhook_delay_s = 0.3
        self.bounces: dict[str, str] = {}
        self.event_posts: list[EventPost] = []
        self._signing_key = ec.generate_private_key(ec.SECP256R1())
        self.public_key = base64.b64encode(
            self._signing_key.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        ).decode()
        self._reports = Reports()

    def info(self) -> dict[str, Any]:
        return {"url": self.url, "api_key": self.api_key, "webhook_public_key": self.public_key}

    def bounce_email(
        self, address: str, *, reason: str = "550 5.1.1 The email account does not exist."
    ) -> None:
        """Sends to ``address`` are accepted, then reported as a permanent ``bounce`` event."""
        self.bounces[address] = reason

    def sign(self, payload: bytes, timestamp: str) -> str:
        """The Event Webhook signature of ``payload`` sent at ``timestamp`` (docs/providers.md 4.5)."""
        der = self._signing_key.sign(timestamp.encode() + payload, ec.ECDSA(hashes.SHA256()))
        return base64.b64encode(der).decode()

    def signed_headers(self, payload: bytes, timestamp: int | None = None) -> dict[str, str]:
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        return {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: self.sign(payload, stamp),
            TIMESTAMP_HEADER: stamp,
        }

    async def stop(self) -> None:
        await self._reports.aclose()
        await super().stop()

    async def events_settled(self) -> None:
        """Return once every Event Webhook batch scheduled so far has been posted (or failed)."""
        await self._reports.settled()

    def _schedule_events(self, body: dict[str, Any], message_id: str) -> None:
        if not self.webhook_url:
            return
        now = int(time.time())
        events: list[dict[str, Any]] = []
        for n, person in enumerate(body["personalizations"]):
            for to in person["to"]:
                address = to["email"]
                common = {
                    "email": address,
                    "timestamp": now,
                    "smtp-id": f"<{message_id}@ismtpd-fake>",
                    "sg_message_id": f"{message_id}.filter0001.{n}.0",
                    "category": body.get("categories", []),
                    **body.get("custom_args", {}),
                    **person.get("custom_args", {}),
                }
                events.append({**common, "event": "processed", "sg_event_id": secrets.token_urlsafe(16)})
                if address in self.bounces:
                    final = {
                        "event": "bounce",
                        "type": "bounce",
                        "status": "5.1.1",
                        "reason": self.bounces[address],
                    }
                else:
                    final = {"event": "delivered", "response": "250 OK"}
                events.append({**common, **final, "sg_event_id": secrets.token_urlsafe(16)})
        self._reports.schedule(self.post_events(events, delay_s=self.webhook_delay_s))

    async def post_events(self, events: list[dict[str, Any]], *, delay_s: float = 0.0) -> EventPost:
        """POST one signed batch of ``events`` to ``webhook_url`` (as SendGrid does)."""
        assert self.webhook_url, "set webhook_url first"
        await asyncio.sleep(delay_s)
        payload = json.dumps(events).encode()
        post = EventPost(events)
        self.event_posts.append(post)
        post.status = await self._reports.post(
            self.webhook_url, data=payload, headers=self.signed_headers(payload)
        )
        return post

    def fail_email(
        self,
        address: str,
        *,
        status: int = 400,
        message: str = "Does not contain a valid address.",
        field: str | None = "personalizations.0.to.0.email",
    ) -> None:
        """Sends to ``address`` get this error (e.g. an invalid recipient, or a 403 unverified sender)."""
        self.email_errors[address] = (status, message, field)

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v3/mail/send", self._send)]

    def _rate_headers(self, reset_in_s: float = 60.0) -> dict[str, str]:
        return {
            "X-RateLimit-Limit": str(self.rate_limit),
            "X-RateLimit-Remaining": str(self.rate_limit - 1),
            "X-RateLimit-Reset": str(int(time.time() + reset_in_s)),
        }

    def _error(self, status: int, message: str, field: str | None = None, **headers: str) -> web.Response:
        document = {"errors": [{"message": message, "field": field, "help": None}]}
        return json_response(status, document, {**self._rate_headers(), **headers})

    async def _send(self, request: web.Request) -> web.StreamResponse:
        recorded = await self.capture(request)
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._error(401, "The provided authorization grant is invalid, expired, or revoked")
        forced = self.next_forced()
        if forced is not None and forced.kind == "rate_limit":
            reset_s = forced.retry_after_s or 1.0
            response = self._error(429, "too many requests")
            response.headers.update(self._rate_headers(reset_s))
            response.headers["X-RateLimit-Remaining"] = "0"
            return response
        if forced is not None and forced.kind == "server_error":
            extra = {"Retry-After": str(int(forced.retry_after_s))} if forced.retry_after_s else {}
            return self._error(forced.status, "internal error", **extra)
        if forced is not None and forced.kind == "timeout":
            await asyncio.sleep(forced.delay_s)
        if not isinstance(recorded.body, dict):
            return self._error(400, "Bad Request: invalid JSON")
        problem = _validate(recorded.body)
        if problem is not None:
            return self._error(400, problem[1], problem[0])
        for person in recorded.body["personalizations"]:
            for to in person["to"]:
                if to["email"] in self.email_errors:
                    status, message, field = self.email_errors[to["email"]]
                    return self._error(status, message, field)
        sandbox = recorded.body.get("mail_settings", {}).get("sandbox_mode", {}).get("enable") is True
        message_id = secrets.token_urlsafe(16)[:22]
        if not sandbox:  # sandbox mode generates no events
            self._schedule_events(recorded.body, message_id)
        headers = {**self._rate_headers(), "X-Message-Id": message_id}
        return web.Response(status=200 if sandbox else 202, headers=headers)


def _validate(body: dict[str, Any]) -> tuple[str | None, str] | None:
    """The first (field, message) SendGrid would reject, or None."""
    people = body.get("personalizations")
    if not isinstance(people, list) or not 1 <= len(people) <= 1000:
        return "personalizations", "The personalizations field is required and must have at least one item."
    for i, person in enumerate(people):
        to = person.get("to") if isinstance(person, dict) else None
        if not isinstance(to, list) or not to:
            return f"personalizations.{i}.to", "The to array is required for all personalization objects."
        for j, address in enumerate(to):
            if not isinstance(address, dict) or not _EMAIL.match(str(address.get("email", ""))):
                return f"personalizations.{i}.to.{j}.email", "Does not contain a valid address."
    problem = _recipients(people)
    if problem is not None:
        return problem
    sender = body.get("from")
    if not isinstance(sender, dict) or not _EMAIL.match(str(sender.get("email", ""))):
        return "from.email", "The from email does not contain a valid address."
    template = body.get("template_id")
    if template is not None and not (isinstance(template, str) and _TEMPLATE_ID.match(template)):
        return "template_id", "The template_id is not a valid template ID."
    if template is not None and not body.get("content"):
        content: Any = []  # a dynamic template carries its own subject and content
    elif not body.get("subject") and not all(p.get("subject") for p in people):
        return "subject", "The subject is required."
    else:
        content = body.get("content")
    if (
        not isinstance(content, list)
        or not all(isinstance(c, dict) for c in content)
        or not (content or template)
    ):
        return "content", "Unless a valid template_id is provided, the content parameter is required."
    types = [c.get("type") for c in content]
    if any(not c.get("value") for c in content):
        return "content.0.value", "The content value must be a string at least one character in length."
    if ("text/plain" in types and types.index("text/plain") != 0) or types.count("text/plain") > 1:
        return "content", "The text/plain content type must be first, and appear once."
    if "text/html" in types and (types.count("text/html") > 1 or types.index("text/html") > 1):
        return "content", "The text/html content type must follow text/plain, and appear once."
    categories = body.get("categories", [])
    if (
        len(categories) > 10
        or len(set(categories)) != len(categories)
        or any(len(c) > 255 for c in categories)
    ):
        return "categories", "Categories must be up to 10 unique strings of at most 255 characters."
    if any(not isinstance(v, str) for v in body.get("custom_args", {}).values()):
        return "custom_args", "Custom args values must be strings."
    if any(name.lower() in _RESERVED_HEADERS for name in body.get("headers", {})):
        return "headers", "Reserved headers cannot be set."
    for name, setting in body.get("mail_settings", {}).items():
        if not isinstance(setting.get("enable"), bool):
            return f"mail_settings.{name}.enable", "The enable field must be a boolean."
    return None


def _recipients(people: list[Any]) -> tuple[str, str] | None:
    """SendGrid refuses an address repeated across a personalization's to/cc/bcc, and more than
    1,000 recipients in one request (docs/providers.md 7.4)."""
    total = 0
    for i, person in enumerate(people):
        seen: set[str] = set()
        for kind in ("to", "cc", "bcc"):
            addresses = person.get(kind, [])
            if not isinstance(addresses, list):
                return f"personalizations.{i}.{kind}", f"The {kind} field must be an array."
            for address in addresses:
                email = str(address.get("email", "") if isinstance(address, dict) else "").lower()
                if email in seen:
                    return (
                        f"personalizations.{i}",
                        "Each email address in the personalization block should be unique between "
                        "to, cc, and bcc. We found the first duplicate instance of "
                        f"[{email}] in the personalizations.{i}.{kind} field.",
                    )
                seen.add(email)
            total += len(addresses)
    if total > 1000:
        return "personalizations", "The total number of recipients must be no more than 1000."
    return None


if __name__ == "__main__":
    run_cli(FakeSendGrid, "Local SendGrid Mail Send fake")
