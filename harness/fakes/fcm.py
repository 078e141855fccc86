"""A local FCM HTTP v1: the OAuth2 token endpoint and ``POST /v1/projects/{project}/messages:send``.

The token endpoint verifies google-auth's RS256 JWT-bearer assertion against the public half of a
service-account key generated at start (``service_account_info()``, whose ``token_uri`` points
here), and issues bearer tokens that ``messages:send`` checks. As FCM, it takes at most
``device_quota_per_minute`` (240) sends to one device in any minute; past that it answers
``429 QUOTA_EXCEEDED``, the answer it also gives for ``force_rate_limit``: FCM's ErrorCode reference
uses the one code for the project's message rate too. ``use_up_project_quota(n)`` answers the next
``n`` sends as Google's quota layer answers a project past its sends a minute, naming the quota
(``google.rpc.ErrorInfo``, reason ``RATE_LIMIT_EXCEEDED``; the shape reported from production in
firebase/firebase-admin-go#719).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter, deque
from typing import Any

import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from harness.fakes.base import AiohttpFake, json_response, run_cli
from harness.fakes.fcm_message import unknown_fields, validate_message

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


def project_quota_body(project_number: str) -> dict[str, Any]:
    """Google's answer to a project past its sends a minute: no FcmError, the quota named."""
    message = (
        "Quota exceeded for quota metric 'Send requests' and limit 'Send requests per minute' of "
        f"service 'fcm.googleapis.com' for consumer 'project_number:{project_number}'."
    )
    info = {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "RATE_LIMIT_EXCEEDED",
        "domain": "googleapis.com",
        "metadata": {
            "quota_limit_value": "600000",
            "consumer": f"projects/{project_number}",
            "quota_metric": "fcm.googleapis.com/send_requests",
            "quota_unit": "1/min/{project}",
            "service": "fcm.googleapis.com",
            "quota_location": "global",
            "quota_limit": "SendsPerMinutePerProject",
        },
    }
    return {"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED", "details": [info]}}


class FakeFcm(AiohttpFake):
    """One Firebase project. ``fail_token(token, errorCode)`` forces an FCM error for that device."""

    def __init__(
        self, *, port: int = 0, project_id: str = "clarion-test", device_quota_per_minute: int = 240
    ) -> None:
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
        # FCM's per-device quota: past it, 429 QUOTA_EXCEEDED, the same answer as the project's
        self.device_quota_per_minute = device_quota_per_minute
        self._recent: deque[tuple[float, str]] = deque()  # (time, device) of the last minute's sends
        self._per_device: Counter[str] = Counter()  # and how many each device had
        self._project_refusals = 0  # sends still to be refused as past the project's quota

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

    def use_up_device_quota(self, token: str) -> None:
        """Device ``token`` has had its minute's quota of pushes: the next ones get QUOTA_EXCEEDED."""
        self._recent.extend([(time.monotonic(), token)] * self.device_quota_per_minute)
        self._per_device[token] += self.device_quota_per_minute

    def use_up_project_quota(self, refusals: int) -> None:
        """The next ``refusals`` sends are refused as past the project's quota, the quota named."""
        self._project_refusals = refusals

    def reset(self) -> None:
        super().reset()
        self._project_refusals = 0

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

    def _over_device_quota(self, target: str) -> bool:
        """Count one send to ``target`` in its last minute; True past the quota (not counted)."""
        horizon = time.monotonic() - 60
        while self._recent and self._recent[0][0] <= horizon:
            device = self._recent.popleft()[1]
            self._per_device[device] -= 1
            if not self._per_device[device]:
                del self._per_device[device]
        if self._per_device[target] >= self.device_quota_per_minute:
            return True
        self._recent.append((time.monotonic(), target))
        self._per_device[target] += 1
        return False

    async def _send(self, request: web.Request) -> web.StreamResponse:
        recorded = await self.capture(request)
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.access_tokens.get(bearer, 0) < time.time():
            message = "Request had invalid authentication credentials. Expected OAuth 2 access token."
            return json_response(401, error_body(401, "UNAUTHENTICATED", message, None))
        if request.match_info["project"] != self.project_id:
            return json_response(403, error_body(403, "PERMISSION_DENIED", "Permission denied.", None))
        if self._project_refusals > 0:  # before the queue: the forced answers keep their turn
            self._project_refusals -= 1
            return json_response(429, project_quota_body("1" * 12))
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
        problem = unknown_fields(document, {"message", "validate_only"}, "") or validate_message(message_doc)
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
        if self._over_device_quota(str(target)):
            return self._error("QUOTA_EXCEEDED")
        self.delivered.append(message_doc)
        name = f"projects/{self.project_id}/messages/0:{time.time_ns()}%{secrets.token_hex(8)}"
        return json_response(200, {"name": name})


if __name__ == "__main__":
    run_cli(FakeFcm, "Local FCM HTTP v1 fake")
