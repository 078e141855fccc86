"""A local FCM HTTP v1: the OAuth2 token endpoint and ``POST /v1/projects/{project}/messages:send``.

The token endpoint verifies google-auth's RS256 JWT-bearer assertion against the public half of a
service-account key generated at start (``service_account_info()``, whose ``token_uri`` points
here), and issues bearer tokens that ``messages:send`` checks.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from typing import Any

import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from harness.fakes.base import AiohttpFake, json_response, run_cli

# google-auth signs this audience whatever token_uri says, and Google checks it.
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
SCOPES = {
    "https://www.googleapis.com/auth/firebase.messaging",
    "https://www.googleapis.com/auth/cloud-platform",
}
# errorCode -> (HTTP status, canonical status, message)
ERRORS = {
    "UNREGISTERED": (404, "NOT_FOUND", "Requested entity was not found."),
    "INVALID_ARGUMENT": (
        400,
        "INVALID_ARGUMENT",
        "The registration token is not a valid FCM registration token",
    ),
    "SENDER_ID_MISMATCH": (403, "PERMISSION_DENIED", "SenderId mismatch"),
    "QUOTA_EXCEEDED": (429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Messages sent'."),
    "UNAVAILABLE": (503, "UNAVAILABLE", "The service is currently unavailable."),
    "INTERNAL": (500, "INTERNAL", "Internal error encountered."),
    "THIRD_PARTY_AUTH_ERROR": (401, "UNAUTHENTICATED", "Auth error from APNS or Web Push Service"),
}


def error_body(status: int, grpc_status: str, message: str, error_code: str | None) -> dict[str, Any]:
    details = [{"@type": FCM_ERROR, "errorCode": error_code}] if error_code else []
    return {"error": {"code": status, "message": message, "status": grpc_status, "details": details}}


class FakeFcm(AiohttpFake):
    """One Firebase project. ``fail_token(token, errorCode)`` forces an FCM error for that device."""

    def __init__(self, *, port: int = 0, project_id: str = "clarion-test") -> None:
        super().__init__(port=port)
        self.project_id = project_id
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.private_key_id = secrets.token_hex(20)
        self.client_email = f"clarion@{project_id}.iam.gserviceaccount.com"
        self.access_tokens: dict[str, float] = {}  # token -> expiry (epoch s)
        self.token_requests = 0
        self.token_errors: dict[str, str] = {}
        self.expires_in_s = 3599
        self.delivered: list[dict[str, Any]] = []  # accepted messages, not validate_only ones

    def service_account_info(self) -> dict[str, Any]:
        """A service-account key file for this fake (``token_uri`` is the fake's token endpoint)."""
        pem = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return {
            "type": "service_account",
            "project_id": self.project_id,
            "private_key_id": self.private_key_id,
            "private_key": pem.decode(),
            "client_email": self.client_email,
            "client_id": "1" * 21,
            "token_uri": f"{self.url}/token",
        }

    def info(self) -> dict[str, Any]:
        return {"url": self.url, "service_account": self.service_account_info()}

    def fail_token(self, token: str, error_code: str) -> None:
        """Sends to device ``token`` get this FCM ``errorCode`` (see ``ERRORS``)."""
        self.token_errors[token] = error_code

    def expire_access_tokens(self) -> None:
        """Every access token issued so far is now refused with 401 UNAUTHENTICATED."""
        self.access_tokens.clear()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/token", self._token),
            web.post("/v1/projects/{project}/messages:send", self._send),
        ]

    async def _token(self, request: web.Request) -> web.StreamResponse:
        self.token_requests += 1
        form = await request.post()
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return json_response(
                400, {"error": "unsupported_grant_type", "error_description": "Invalid grant_type"}
            )
        problem = self._check_assertion(str(form.get("assertion", "")))
        if problem is not None:
            return json_response(400, {"error": problem[0], "error_description": problem[1]})
        token = "ya29.fake-" + secrets.token_urlsafe(24)
        self.access_tokens[token] = time.time() + self.expires_in_s
        return json_response(
            200, {"access_token": token, "expires_in": self.expires_in_s, "token_type": "Bearer"}
        )

    def _check_assertion(self, assertion: str) -> tuple[str, str] | None:
        try:
            header = jwt.get_unverified_header(assertion)
            if header.get("alg") != "RS256" or header.get("kid") != self.private_key_id:
                return "invalid_grant", "Invalid JWT Signature."
            claims = jwt.decode(
                assertion,
                self._key.public_key(),
                algorithms=["RS256"],
                audience=GOOGLE_TOKEN_AUDIENCE,
                issuer=self.client_email,
                leeway=60,
                options={"require": ["iss", "aud", "iat", "exp", "scope"]},
            )
        except jwt.InvalidAudienceError:
            return "invalid_grant", "Invalid JWT: Failed audience check."
        except jwt.InvalidSignatureError:
            return "invalid_grant", "Invalid JWT Signature."
        except jwt.PyJWTError as exc:
            return "invalid_grant", f"Invalid JWT: {exc}"
        if claims["exp"] - claims["iat"] > 3600:
            return "invalid_grant", "Invalid JWT: Token must be a short-lived token (60 minutes)."
        if not SCOPES & set(str(claims["scope"]).split()):
            return "invalid_scope", "Invalid OAuth scope or ID token audience provided."
        return None

    def _error(self, error_code: str, **headers: str) -> web.Response:
        status, grpc_status, message = ERRORS[error_code]
        return json_response(status, error_body(status, grpc_status, message, error_code), headers)

    async def _send(self, request: web.Request) -> web.StreamResponse:
        recorded = await self.capture(request)
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.access_tokens.get(bearer, 0) < time.time():
            message = "Request had invalid authentication credentials. Expected OAuth 2 access token."
            return json_response(401, error_body(401, "UNAUTHENTICATED", message, None))
        if request.match_info["project"] != self.project_id:
            return json_response(403, error_body(403, "PERMISSION_DENIED", "Permission denied.", None))
        forced = self.next_forced()
        if forced is not None and forced.kind == "rate_limit":
            return self._error("QUOTA_EXCEEDED", **{"Retry-After": str(int(forced.retry_after_s or 60))})
        if forced is not None and forced.kind == "server_error":
            extra = {"Retry-After": str(int(forced.retry_after_s))} if forced.retry_after_s else {}
            return self._error("INTERNAL" if forced.status == 500 else "UNAVAILABLE", **extra)
        if forced is not None and forced.kind == "timeout":
            await asyncio.sleep(forced.delay_s)
        document = recorded.body if isinstance(recorded.body, dict) else {}
        message_doc = document.get("message")
        problem = _unknown(document, {"message", "validate_only"}, "") or _validate(message_doc)
        if problem is None and not isinstance(document.get("validate_only", False), bool):
            problem = "Invalid value at 'validate_only' (TYPE_BOOL)"
        if problem is not None:
            return json_response(400, error_body(400, "INVALID_ARGUMENT", problem, "INVALID_ARGUMENT"))
        assert isinstance(message_doc, dict)
        target = message_doc.get("token") or message_doc.get("fid")
        if target in self.token_errors:
            return self._error(self.token_errors[target])
        if document.get("validate_only") is True:
            return json_response(200, {"name": f"projects/{self.project_id}/messages/fake_message_id"})
        self.delivered.append(message_doc)
        name = f"projects/{self.project_id}/messages/0:{time.time_ns()}%{secrets.token_hex(8)}"
        return json_response(200, {"name": name})


_TARGETS = ("token", "topic", "condition", "fid")
_MESSAGE_FIELDS = {"name", "data", "notification", "android", "webpush", "apns", "fcm_options", *_TARGETS}
_NOTIFICATION_FIELDS = {"title", "body", "image"}
_ANDROID_FIELDS = {
    "collapse_key",
    "priority",
    "ttl",
    "restricted_package_name",
    "data",
    "notification",
    "fcm_options",
    "direct_boot_ok",
    "direct_book_ok",
    "bandwidth_constrained_ok",
    "restricted_satellite_ok",
}
_APNS_FIELDS = {"headers", "payload", "fcm_options", "live_activity_token"}
_TOPIC = re.compile(r"[a-zA-Z0-9\-_.~%]+")
_DURATION = re.compile(r"\d{1,9}(\.\d{1,9})?s")


def reserved_data_key(key: str) -> bool:
    """FCM refuses these ``data`` keys (docs/providers.md 7.1)."""
    return key in ("from", "message_type") or key.startswith(("google.", "gcm.notification."))


def _unknown(doc: dict[str, Any], allowed: set[str], where: str) -> str | None:
    for key in doc:
        if key not in allowed:
            return f"Invalid JSON payload received. Unknown name \"{key}\" at '{where}': Cannot find field."
    return None


def _string_map(value: Any, where: str) -> str | None:
    if not isinstance(value, dict):
        return f"Invalid value at '{where}' (type.googleapis.com/google.protobuf.Struct), {value!r}"
    for i, item in enumerate(value.values()):
        if not isinstance(item, str):
            return f"Invalid value at '{where}[{i}].value' (TYPE_STRING), {item!r}"
    return None


def _validate(message: Any) -> str | None:
    """FCM's INVALID_ARGUMENT message for a bad ``message``, or None."""
    if not isinstance(message, dict):
        return "Request contains an invalid argument: message is required."
    problem = _unknown(message, _MESSAGE_FIELDS, "message")
    if problem:
        return problem
    targets = [t for t in _TARGETS if message.get(t)]
    if len(targets) != 1:
        return "Exactly one of token, topic, condition or fid must be set."
    if not all(isinstance(message[t], str) for t in targets):
        return f"Invalid value at 'message.{targets[0]}' (TYPE_STRING)"
    topic = message.get("topic")
    if isinstance(topic, str) and not _TOPIC.fullmatch(topic.removeprefix("/topics/")):
        return "Invalid topic name"
    data = message.get("data", {})
    problem = _string_map(data, "message.data")
    if problem:
        return problem
    for key in data:
        if reserved_data_key(key):
            return f"Invalid data payload key: {key}"
    notification = message.get("notification", {})
    if not isinstance(notification, dict):
        return "Invalid value at 'message.notification' (type.googleapis.com/google.firebase.fcm.v1.Notification)"
    problem = _unknown(notification, _NOTIFICATION_FIELDS, "message.notification")
    if problem or not all(isinstance(v, str) for v in notification.values()):
        return problem or "Invalid value at 'message.notification' (TYPE_STRING)"
    problem = _android(message.get("android", {})) or _apns(message.get("apns", {}), bool(notification))
    if problem:
        return problem
    size = len(json.dumps({"notification": notification, "data": data}).encode())
    if size > 4096:
        return "Message is too big"
    return None


def _android(android: Any) -> str | None:
    if not isinstance(android, dict):
        return "Invalid value at 'message.android' (type.googleapis.com/google.firebase.fcm.v1.AndroidConfig)"
    problem = _unknown(android, _ANDROID_FIELDS, "message.android")
    if problem:
        return problem
    priority = android.get("priority", "NORMAL")
    if not isinstance(priority, str) or priority.upper() not in {"NORMAL", "HIGH"}:
        return "Invalid value at 'message.android.priority' (type.googleapis.com/google.firebase.fcm.v1.AndroidMessagePriority)"
    ttl = android.get("ttl", "0s")
    if not isinstance(ttl, str) or not _DURATION.fullmatch(ttl) or float(ttl[:-1]) > 2_419_200:
        return "Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration)"
    for key in ("collapse_key", "restricted_package_name"):
        if key in android and not isinstance(android[key], str):
            return f"Invalid value at 'message.android.{key}' (TYPE_STRING)"
    if "data" in android:
        return _string_map(android["data"], "message.android.data")
    return None


def _apns(apns: Any, has_notification: bool) -> str | None:
    if not isinstance(apns, dict):
        return "Invalid value at 'message.apns' (type.googleapis.com/google.firebase.fcm.v1.ApnsConfig)"
    problem = _unknown(apns, _APNS_FIELDS, "message.apns")
    if problem:
        return problem
    headers = apns.get("headers", {})
    problem = _string_map(headers, "message.apns.headers")
    if problem:
        return problem
    payload = apns.get("payload", {})
    if not isinstance(payload, dict):
        return "Invalid value at 'message.apns.payload' (type.googleapis.com/google.protobuf.Struct)"
    aps = payload.get("aps", {})
    alert = has_notification or (
        isinstance(aps, dict) and bool(aps.get("alert") or aps.get("badge") or aps.get("sound"))
    )
    if headers.get("apns-priority") == "10" and not alert:
        return "Invalid APNs priority: a data-only (background) message must use apns-priority 5."
    return None


if __name__ == "__main__":
    run_cli(FakeFcm, "Local FCM HTTP v1 fake")
