"""A local APNs: HTTP/2 (hypercorn), TLS with a self-signed certificate made at start (or cleartext h2).

Validates like APNs, in APNs' order: method, path, headers, provider token (ES256 signature against
the test key made at start, ``kid``, ``iss``, ``iat`` within one hour), body. Answers 200 with
``apns-id``, or ``{"reason": ...}`` (+ ``timestamp`` on 410).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import logging
import re
import secrets
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypercorn.asyncio import serve
from hypercorn.config import Config

from tests.fakes.base import FakeServer, Forced, RecordedRequest, free_port, run_cli

STATUS = {
    "BadCollapseId": 400, "BadDeviceToken": 400, "BadExpirationDate": 400, "BadMessageId": 400,
    "BadPriority": 400, "BadTopic": 400, "DeviceTokenNotForTopic": 400, "DuplicateHeaders": 400,
    "IdleTimeout": 400, "InvalidPushType": 400, "MissingDeviceToken": 400, "MissingTopic": 400,
    "PayloadEmpty": 400, "TopicDisallowed": 400, "BadCertificate": 403, "ExpiredProviderToken": 403,
    "Forbidden": 403, "InvalidProviderToken": 403, "MissingProviderToken": 403,
    "UnrelatedKeyIdInToken": 403, "BadEnvironmentKeyIdInToken": 403, "BadPath": 404,
    "MethodNotAllowed": 405, "ExpiredToken": 410, "Unregistered": 410, "PayloadTooLarge": 413,
    "TooManyProviderTokenUpdates": 429, "TooManyRequests": 429, "InternalServerError": 500,
    "ServiceUnavailable": 503, "Shutdown": 503,
}  # fmt: skip
PUSH_TYPES = set(
    "alert background location voip complication fileprovider mdm liveactivity pushtotalk".split()
)
_FORCED_REASON = {429: "TooManyRequests", 500: "InternalServerError"}
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_HEX = re.compile(r"^[0-9a-fA-F]+$")


class FakeApns(FakeServer):
    """One team/key/topic. ``fail_token(token, reason)`` forces an APNs reason for that device."""

    def __init__(self, *, port: int = 0, tls: bool = True, topic: str = "com.clarion.test") -> None:
        super().__init__(port=port)
        self.tls = tls
        self.topic = topic
        self.key_id = secrets.token_hex(5).upper()
        self.team_id = secrets.token_hex(5).upper()
        self._key = ec.generate_private_key(ec.SECP256R1())
        self.token_errors: dict[str, str] = {}
        self.min_iat = 0  # tokens issued before this are ExpiredProviderToken
        self.enforce_token_update_rate = False
        self.max_payload_bytes = 4096
        self._verified: dict[str, int] = {}  # JWT -> iat, for tokens whose signature checked out
        self._last_iat: int | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="fake-apns-"))

    # what a client needs --------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def private_key_pem(self) -> str:
        """The .p8 signing key (PKCS#8 PEM) the client signs provider tokens with."""
        pem = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return pem.decode()

    @property
    def ca_file(self) -> Path:
        """The self-signed certificate to trust (TLS mode)."""
        return self._dir / "cert.pem"

    def info(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "key_id": self.key_id,
            "team_id": self.team_id,
            "topic": self.topic,
            "private_key": self.private_key_pem(),
            "ca_file": str(self.ca_file) if self.tls else None,
        }

    # knobs ----------------------------------------------------------------------------------------
    def fail_token(self, device_token: str, reason: str) -> None:
        """Pushes to ``device_token`` get ``reason`` (status from ``STATUS``)."""
        self.token_errors[device_token] = reason

    def force_reason(self, reason: str, n: int = 1) -> None:
        """The next ``n`` pushes get ``reason`` (e.g. ``Shutdown``, ``ExpiredProviderToken``)."""
        self._forced.extend(Forced("reason", STATUS[reason], reason=reason) for _ in range(n))

    def expire_provider_tokens(self) -> None:
        """Every provider JWT seen so far is now refused with 403 ExpiredProviderToken."""
        self.min_iat = max(self._verified.values(), default=int(time.time())) + 1

    @property
    def jwts(self) -> list[str]:
        """Distinct provider tokens received, in order of first use."""
        seen = dict.fromkeys(
            r.headers.get("authorization", "").removeprefix("bearer ") for r in self.requests
        )
        return [token for token in seen if token]

    # server ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        config = Config()
        if self.port == 0:
            self.port = free_port()
        config.bind = [f"127.0.0.1:{self.port}"]
        config.accesslog = None
        config.errorlog = logging.getLogger("fake-apns")
        config.keep_alive_max_requests = 10**9
        config.graceful_timeout = 0.5
        if self.tls:
            self._write_certificate()
            config.certfile = str(self.ca_file)
            config.keyfile = str(self._dir / "key.pem")
            config.alpn_protocols = ["h2"]
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(serve(self._app, config, shutdown_trigger=self._stop.wait))  # type: ignore[arg-type]
        for _ in range(200):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.01)
                continue
            writer.close()
            return
        raise RuntimeError("fake APNs did not start")

    async def stop(self) -> None:
        self._stop.set()
        await self._task

    def _write_certificate(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
        now = datetime.datetime.now(datetime.UTC)
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        self.ca_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (self._dir / "key.pem").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            event = await receive()
            body += event.get("body", b"")
            if not event.get("more_body"):
                break
        raw_headers = [(k.decode().lower(), v.decode()) for k, v in scope["headers"]]
        headers = dict(raw_headers)
        client = scope.get("client") or ("", 0)
        recorded = RecordedRequest(
            scope["method"],
            scope["path"],
            headers,
            _json_or_none(body),
            body,
            peer=f"{client[0]}:{client[1]}",
        )
        if self.record:
            self.requests.append(recorded)
        apns_id = headers.get("apns-id") or str(uuid.uuid4())
        if scope["http_version"] != "2":
            return await _respond(send, 505, apns_id, None)
        forced: Forced | None = None
        reason = self._check(scope["method"], scope["path"], raw_headers, headers, body)
        if reason is None:
            forced = self.next_forced()
            if forced is not None and forced.kind == "timeout":
                await asyncio.sleep(forced.delay_s)
            elif forced is not None:
                reason = forced.reason or _FORCED_REASON.get(forced.status, "ServiceUnavailable")
            else:
                reason = self.token_errors.get(scope["path"].removeprefix("/3/device/"))
        extra = {"retry-after": str(int(forced.retry_after_s))} if forced and forced.retry_after_s else {}
        await _respond(send, STATUS[reason] if reason else 200, apns_id, reason, extra)

    def _check(
        self, method: str, path: str, raw: list[tuple[str, str]], headers: dict[str, str], body: bytes
    ) -> str | None:
        if method != "POST":
            return "MethodNotAllowed"
        if not path.startswith("/3/device/"):
            return "BadPath"
        device_token = path.removeprefix("/3/device/")
        if not device_token:
            return "MissingDeviceToken"
        if not _HEX.match(device_token):
            return "BadDeviceToken"
        if len(raw) != len(headers):
            return "DuplicateHeaders"
        if "apns-topic" not in headers:
            return "MissingTopic"
        if headers["apns-topic"] != self.topic:
            return "BadTopic"
        if headers.get("apns-push-type", "alert") not in PUSH_TYPES:
            return "InvalidPushType"
        if headers.get("apns-priority", "10") not in {"10", "5", "1"}:
            return "BadPriority"
        if not headers.get("apns-expiration", "0").isdigit():
            return "BadExpirationDate"
        if len(headers.get("apns-collapse-id", "").encode()) > 64:
            return "BadCollapseId"
        if "apns-id" in headers and not _UUID.match(headers["apns-id"]):
            return "BadMessageId"
        token_reason = self._check_token(headers.get("authorization"))
        if token_reason is not None:
            return token_reason
        if not body:
            return "PayloadEmpty"
        if len(body) > self.max_payload_bytes:
            return "PayloadTooLarge"
        return None

    def _check_token(self, authorization: str | None) -> str | None:
        if not authorization or not authorization.startswith("bearer "):
            return "MissingProviderToken"
        token = authorization.removeprefix("bearer ")
        iat = self._verified.get(token)
        if iat is None:
            try:
                header = jwt.get_unverified_header(token)
                if header.get("alg") != "ES256" or header.get("kid") != self.key_id:
                    return "InvalidProviderToken"
                claims = jwt.decode(
                    token,
                    self._key.public_key(),
                    algorithms=["ES256"],
                    options={"verify_exp": False, "verify_iat": False, "require": ["iss", "iat"]},
                )
            except jwt.PyJWTError:
                return "InvalidProviderToken"
            if claims["iss"] != self.team_id or not isinstance(claims["iat"], int):
                return "InvalidProviderToken"
            iat = claims["iat"]
            if self.enforce_token_update_rate and self._last_iat is not None and iat - self._last_iat < 1200:
                return "TooManyProviderTokenUpdates"
            self._verified[token] = iat
            self._last_iat = iat
        now = time.time()
        if iat > now + 60:
            return "InvalidProviderToken"
        if now - iat > 3600 or iat < self.min_iat:
            return "ExpiredProviderToken"
        return None


async def _respond(
    send: Any, status: int, apns_id: str, reason: str | None, extra: dict[str, str] | None = None
) -> None:
    headers = [(b"apns-id", apns_id.encode())] + [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    body = b""
    if reason is not None:
        document: dict[str, Any] = {"reason": reason}
        if status == 410:
            document["timestamp"] = int(time.time() * 1000)
        body = json.dumps(document).encode()
        headers.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


if __name__ == "__main__":
    run_cli(FakeApns, "Local APNs (HTTP/2) fake")
