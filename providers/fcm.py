"""Firebase Cloud Messaging, HTTP v1 API, with service-account OAuth2 credentials.

The access token comes from google-auth (JWT-bearer grant); its blocking refresh runs in a thread,
once for all concurrent sends, and the token is reused until shortly before it expires.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, ClassVar

import google.auth.exceptions
from google.auth.transport.requests import Request
from google.oauth2 import service_account

from providers.base import RenderedMessage, SendResult
from providers.errors import (
    PermanentProviderError,
    ProviderError,
    QuotaExceeded,
    TransientProviderError,
    overloaded,
    parse_retry_after,
    refusal,
)
from providers.session import LazySession, json_object, transport_errors
from providers.settings import FcmSettings
from schema.enums import Channel, Priority

SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
_FCM_ERROR_TYPE = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
_BAD_REQUEST_TYPE = "type.googleapis.com/google.rpc.BadRequest"
_TRANSIENT = frozenset(
    {"QUOTA_EXCEEDED", "UNAVAILABLE", "INTERNAL", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}
)
# A device address "fid:<Firebase installation ID>" targets ``fid``; anything else is a ``token``.
FID_PREFIX = "fid:"
_INVALID_RECIPIENT = frozenset({"UNREGISTERED", "SENDER_ID_MISMATCH"})


class _TimedRequest(Request):
    """google-auth's requests transport with our timeout instead of its 120 s default."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__()
        self._timeout_s = timeout_s

    def __call__(
        self,
        url: str,
        method: str = "GET",
        body: Any = None,
        headers: Any = None,
        timeout: Any = None,
        **kwargs: Any,
    ) -> Any:
        return super().__call__(url, method, body, headers, timeout or self._timeout_s, **kwargs)


class FcmProvider:
    """Sends to FCM registration tokens of one Firebase project."""

    name: ClassVar[str] = "fcm"
    channel: ClassVar[Channel] = Channel.push

    def __init__(self, settings: FcmSettings) -> None:
        info = settings.service_account_info()
        self._settings = settings
        self._credentials = service_account.Credentials.from_service_account_info(info, scopes=[SCOPE])
        project = settings.project_id or info.get("project_id")
        if not project:
            raise ValueError("FCM project_id is neither configured nor in the service account")
        self._url = f"{settings.base_url.rstrip('/')}/v1/projects/{project}/messages:send"
        self._auth_request = _TimedRequest(settings.timeout_s)
        self._token_lock = asyncio.Lock()
        self._http = LazySession(timeout_s=settings.timeout_s, max_connections=settings.max_connections)
        self.token_fetches = 0

    async def access_token(self, *, rejected: str | None = None) -> str:
        """A valid OAuth2 access token; fetched at most once at a time, and only when missing,
        near expiry, or equal to ``rejected`` (a token FCM just refused)."""

        def usable() -> bool:
            return bool(self._credentials.valid) and self._credentials.token != rejected

        if not usable():
            async with self._token_lock:
                if not usable():
                    await self._refresh()
        return str(self._credentials.token)

    async def _refresh(self) -> None:
        self.token_fetches += 1
        try:
            await asyncio.to_thread(self._credentials.refresh, self._auth_request)
        except google.auth.exceptions.TransportError as exc:
            raise TransientProviderError(
                f"OAuth token fetch failed: {exc}", provider=self.name, code="oauth_unavailable"
            ) from exc
        except google.auth.exceptions.RefreshError as exc:
            if exc.retryable:
                raise TransientProviderError(
                    f"OAuth token fetch failed: {exc}", provider=self.name, code="oauth_unavailable"
                ) from exc
            raise PermanentProviderError(
                f"OAuth token refused: {exc}", provider=self.name, code="oauth_refused"
            ) from exc

    async def send(self, message: RenderedMessage) -> SendResult:
        """Deliver one push; returns FCM's message ``name``. Raises from ``providers.errors``.

        Re-sends once, with a fresh access token, only after ``401 UNAUTHENTICATED``.
        """
        body = json.dumps({"message": _message(message)}, separators=(",", ":")).encode()
        token = await self.access_token()
        status, headers, document = await self._post(body, token)
        if status == 401 and _fcm_error_code(document) is None:
            token = await self.access_token(rejected=token)
            status, headers, document = await self._post(body, token)
        if status == 200 and isinstance(document.get("name"), str):
            return SendResult(provider=self.name, provider_message_id=document["name"], http_status=status)
        raise self._classify(status, headers, document)

    async def _post(self, body: bytes, token: str) -> tuple[int, dict[str, str], dict[str, Any]]:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        with transport_errors(provider=self.name, label="FCM"):
            async with self._http.get().post(self._url, data=body, headers=headers) as response:
                raw = await response.read()
                return response.status, dict(response.headers), json_object(raw)

    def _classify(self, status: int, headers: dict[str, str], document: dict[str, Any]) -> ProviderError:
        error = document.get("error") if isinstance(document.get("error"), dict) else {}
        assert isinstance(error, dict)
        error_code = _fcm_error_code(document)
        grpc_status = error.get("status") if isinstance(error.get("status"), str) else None
        code = error_code or grpc_status or f"http_{status}"
        text = f"FCM refused the message: {status} {code}: {error.get('message', '')}"
        retry_after_s = parse_retry_after(headers.get("Retry-After"))
        # A specific errorCode decides; without one (or UNSPECIFIED_ERROR), the gRPC status and HTTP status do.
        unspecified = error_code is None or error_code == "UNSPECIFIED_ERROR"
        projects = _projects_quota(error)
        if projects or error_code == "QUOTA_EXCEEDED":
            # Named as the project's, every tenant's pushes share it; else it may be the project's,
            # a device's or a topic's, and FCM does not say (``QuotaExceeded``).
            quota = TransientProviderError if projects else QuotaExceeded
            return quota(
                text,
                provider=self.name,
                code=code,
                http_status=status,
                retry_after_s=max(retry_after_s or 0.0, QUOTA_RETRY_AFTER_S),
            )
        return refusal(
            text,
            provider=self.name,
            code=code,
            http_status=status,
            invalid_recipient=error_code in _INVALID_RECIPIENT
            or (error_code == "INVALID_ARGUMENT" and _about_token(error)),
            transient=error_code in _TRANSIENT
            or (unspecified and (grpc_status in _TRANSIENT or overloaded(status))),
            retry_after_s=retry_after_s,
        )

    async def aclose(self) -> None:
        """Close the connection pool and the token fetcher's session."""
        await self._http.aclose()
        self._auth_request.session.close()


# FCM's ErrorCode reference asks for at least a minute before retrying QUOTA_EXCEEDED for the
# project's or a topic's rate, and a device's 240 is counted per minute: sooner is refused again.
QUOTA_RETRY_AFTER_S = 60.0

# FCM refuses an AndroidConfig.ttl above 4 weeks (400 INVALID_ARGUMENT, docs/providers.md), which is
# also its default: a send that may wait longer than that is still worth delivering within it.
MAX_ANDROID_TTL_S = 28 * 24 * 3600


def _message(message: RenderedMessage) -> dict[str, Any]:
    high = message.priority in (Priority.high, Priority.critical)
    notification = {"body": message.body}
    if message.subject:
        notification["title"] = message.subject
    android: dict[str, str] = {"priority": "HIGH" if high else "NORMAL"}
    apns_headers = {"apns-priority": "10" if high else "5"}
    if message.expires_at is not None:
        left = int(message.expires_at.timestamp() - time.time())
        android["ttl"] = f"{min(max(0, left), MAX_ANDROID_TTL_S)}s"
        apns_headers["apns-expiration"] = str(max(0, int(message.expires_at.timestamp())))
    if message.collapse_id:
        android["collapse_key"] = message.collapse_id
        apns_headers["apns-collapse-id"] = message.collapse_id
    target, _, fid = message.to.partition(FID_PREFIX)
    body: dict[str, Any] = {
        **({"fid": fid} if not target and fid else {"token": message.to}),
        "notification": notification,
        "android": android,
        "apns": {"headers": apns_headers},
    }
    if message.data:
        body["data"] = {str(k): _data_value(v) for k, v in message.data.items()}
        for key in body["data"]:
            if reserved_data_key(key):
                raise PermanentProviderError(
                    f"FCM refuses the data key {key!r} (reserved)", provider="fcm", code="reserved_data_key"
                )
    return body


def _data_value(value: Any) -> str:
    """FCM carries only strings in ``data``: text as it is, anything else as JSON, which is what the
    same push's APNs payload holds natively (``str`` gave Python's ``True``, ``None`` and
    ``{'a': 1}``, which no app's JSON parser reads)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def reserved_data_key(key: str) -> bool:
    """FCM answers 400 INVALID_ARGUMENT for these ``data`` keys: ``from``, ``message_type`` and any
    key starting with ``google`` or ``gcm``, as the v1 reference words it (docs/providers.md 7.1).
    The Admin SDKs' lists are narrower (``google.``, ``gcm.notification.``); the reference's is
    the one a send is held to, so a key FCM may refuse is refused at accept, not after it."""
    return key in ("from", "message_type") or key.startswith(("google", "gcm"))


def _details(document: dict[str, Any]) -> list[dict[str, Any]]:
    error = document.get("error")
    details = error.get("details") if isinstance(error, dict) else None
    return [d for d in details if isinstance(d, dict)] if isinstance(details, list) else []


def _fcm_error_code(document: dict[str, Any]) -> str | None:
    for detail in _details(document):
        if detail.get("@type") == _FCM_ERROR_TYPE and isinstance(detail.get("errorCode"), str):
            return str(detail["errorCode"])
    return None


_ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"


def _projects_quota(error: dict[str, Any]) -> bool:
    """A refusal that names the project's own send quota. Google's quota layer answers it as ``429
    RESOURCE_EXHAUSTED`` with a ``google.rpc.ErrorInfo`` of reason ``RATE_LIMIT_EXCEEDED`` whose
    metadata give the quota's unit, ``1/min/{project}`` (limit ``SendsPerMinutePerProject``), as
    reported from production in firebase/firebase-admin-go#719. A device's or a topic's quota
    (``QUOTA_EXCEEDED`` alone) does not carry it."""
    for detail in _details({"error": error}):
        if detail.get("@type") != _ERROR_INFO_TYPE or detail.get("reason") != "RATE_LIMIT_EXCEEDED":
            continue
        metadata = detail.get("metadata")
        if isinstance(metadata, dict) and (
            "{project}" in str(metadata.get("quota_unit", ""))
            or str(metadata.get("quota_limit", "")).endswith("PerProject")
        ):
            return True
    return False


def _about_token(error: dict[str, Any]) -> bool:
    """An INVALID_ARGUMENT that blames the registration token rather than the message."""
    if "registration token" in str(error.get("message", "")).lower():
        return True
    for detail in _details({"error": error}):
        if detail.get("@type") == _BAD_REQUEST_TYPE:
            for violation in detail.get("fieldViolations") or []:
                if isinstance(violation, dict) and violation.get("field") == "message.token":
                    return True
    return False
