"""A local APNs: HTTP/2 (``harness.fakes.h2server``, framed as APNs frames), TLS with a self-signed certificate made at start (or cleartext h2).

Validates like APNs, in APNs' order: method, path, headers, provider token (ES256 signature against
the test key made at start, ``kid``, ``iss``, ``iat`` within one hour), body. Answers 200 with
``apns-id``, or ``{"reason": ...}`` (+ ``timestamp`` on 410).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import re
import secrets
import shutil
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

from harness.fakes.base import FakeServer, Forced, RecordedRequest, run_cli
from harness.fakes.h2server import serve_h2, tls_context

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
VOIP_MAX_PAYLOAD_BYTES = 5120
_FORCED_REASON = {429: "TooManyRequests", 500: "InternalServerError"}
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_DEVICE_TOKEN = re.compile(r"[0-9a-fA-F]{64}")


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

    def drop_connections(self) -> None:
        """Close every client connection now, as a server restart or network cut would."""
        for transport in list(self._server.transports):
            transport.close()

    def send_goaway(self) -> None:
        """Send GOAWAY on every connection, as APNs does when it retires one."""
        for connection in list(self._server.connections):
            connection.goaway()

    @property
    def jwts(self) -> list[str]:
        """Distinct provider tokens received, in order of first use."""
        seen = dict.fromkeys(
            r.headers.get("authorization", "").removeprefix("bearer ") for r in self.requests
        )
        return [token for token in seen if token]

    # server ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        context = None
        if self.tls:
            self._write_certificate()
            context = tls_context(str(self.ca_file), str(self._dir / "key.pem"))
        self._server = await serve_h2(self._handle, self.port, context)
        assert self._server.server is not None
        self.port = int(self._server.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening, drop connections and in-flight requests, and remove the temp directory."""
        await self._server.close()
        shutil.rmtree(self._dir, ignore_errors=True)

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

    async def _handle(
        self, method: str, path: str, raw_headers: list[tuple[str, str]], body: bytes, peer: str
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        headers = dict(raw_headers)
        recorded = RecordedRequest(method, path, headers, _json_or_none(body), body, peer=peer)
        if self.record:
            self.requests.append(recorded)
        apns_id = headers.get("apns-id") or str(uuid.uuid4())
        forced: Forced | None = None
        reason = self._check(method, path, raw_headers, headers, body)
        if reason is None:
            forced = self.next_forced()
            if forced is not None and forced.kind == "timeout":
                await asyncio.sleep(forced.delay_s)
            elif forced is not None:
                reason = forced.reason or _FORCED_REASON.get(forced.status, "ServiceUnavailable")
            else:
                reason = self.token_errors.get(path.removeprefix("/3/device/"))
        extra = {"retry-after": str(int(forced.retry_after_s))} if forced and forced.retry_after_s else {}
        return _response(STATUS[reason] if reason else 200, apns_id, reason, extra)

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
        if not _DEVICE_TOKEN.fullmatch(device_token):
            return "BadDeviceToken"
        if len(raw) != len(headers):
            return "DuplicateHeaders"
        if "apns-topic" not in headers:
            return "MissingTopic"
        push_type = headers.get("apns-push-type", "alert")
        if push_type not in PUSH_TYPES:
            return "InvalidPushType"
        expected_topic = f"{self.topic}.voip" if push_type == "voip" else self.topic
        if headers["apns-topic"] != expected_topic:
            return "DeviceTokenNotForTopic" if headers["apns-topic"] in _topics(self.topic) else "BadTopic"
        if headers.get("apns-priority", "10") not in {"10", "5", "1"}:
            return "BadPriority"
        if push_type == "background" and headers.get("apns-priority", "10") != "5":
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
        limit = VOIP_MAX_PAYLOAD_BYTES if push_type == "voip" else self.max_payload_bytes
        if len(body) > limit:
            return "PayloadTooLarge"
        aps = (_json_or_none(body) or {}).get("aps") if isinstance(_json_or_none(body), dict) else None
        if push_type == "background" and isinstance(aps, dict) and {"alert", "badge", "sound"} & set(aps):
            return "InvalidPushType"  # APNs: a background push must not carry alert, badge or sound
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


def _response(
    status: int, apns_id: str, reason: str | None, extra: dict[str, str]
) -> tuple[int, list[tuple[str, str]], bytes]:
    headers = [("apns-id", apns_id), *extra.items()]
    if reason is None:
        return status, headers, b""
    document: dict[str, Any] = {"reason": reason}
    if status == 410:
        document["timestamp"] = int(time.time() * 1000)
    return status, [*headers, ("content-type", "application/json")], json.dumps(document).encode()


def _topics(bundle: str) -> set[str]:
    return {bundle, f"{bundle}.voip", f"{bundle}.complication", f"{bundle}.push-type.liveactivity"}


def _json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


if __name__ == "__main__":
    run_cli(FakeApns, "Local APNs (HTTP/2) fake")
