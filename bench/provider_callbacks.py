"""Another tenant's accept latency while signed provider callbacks flood the API.

    .venv/bin/python -m bench.provider_callbacks [--loops 40] [--seconds 8] [--only twilio-one ...]

Starts its own Tansu broker, a fresh database and `clarion api` as a separate process, with a
Twilio auth token and a SendGrid verification key the probe holds (so its callbacks verify).
Tenant B sends an email every 10 ms from two loops (``bench.lone_api.paced_accepts``). Phases of
``--seconds`` each: B alone, then each variant, then B alone again. A variant is ``--loops``
keep-alive connections in a process of their own (``bench.anonymous_flood``'s), each asking again
as soon as it is answered:

- ``get-control``: tenant A's ``GET /v1/users/{id}`` by API key, a cheap read (the control);
- ``twilio-one``: one signed ``delivered`` status callback on one of A's SMS, over and over;
- ``sendgrid-one``: a signed batch of 200 ``deferred`` and ``open`` events about one of A's emails;
- ``sendgrid-wide``: a signed batch of 2,000 ``delivered`` events, one on each of 2,000 of A's emails.

Prints B's accept count, p50, p99 and max per phase, the API's CPU, and how the flood was answered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import secrets
import time
from collections import Counter
from urllib.parse import urlencode

import sqlalchemy as sa
from twilio.request_validator import RequestValidator

from bench.anonymous_flood import _accepts, _flood, _measured, _print
from bench.lone_api import LoneApi, lone_api
from harness.fakes.sendgrid import FakeSendGrid
from harness.tenants import TenantInfo, make_tenant
from schema.ids import uuid7

VARIANTS = ("get-control", "twilio-one", "sendgrid-one", "sendgrid-wide")
TWILIO_PATH = "/v1/webhooks/twilio/status"
SENDGRID_PATH = "/v1/webhooks/sendgrid/events"
WIDE = 2_000


def _raw(method: str, path: str, host: str, *, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: flood\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    if body:
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


async def _seed(api: LoneApi, tenant: TenantInfo) -> tuple[str, list[str]]:
    """One SMS with a Twilio sid, ``WIDE`` emails, all ``sent``, of one user: (the sid, email ids)."""
    sid = "SM" + secrets.token_hex(16)
    emails = [uuid7() for _ in range(WIDE)]
    async with api.engine.begin() as conn:
        user = await conn.scalar(
            sa.text(
                "INSERT INTO users (id, tenant_id, external_id, email, phone) VALUES"
                " (gen_random_uuid(), :t, 'a-1', 'a1@example.com', '+14155550100') RETURNING id"
            ),
            {"t": tenant.id},
        )
        insert = sa.text(
            "INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, category,"
            " priority, data, status, attempts, provider, provider_message_id, history)"
            " VALUES (:id, :t, :ev, 'x', :u, :ch, 'orders', 'normal', '{}'::jsonb, 'sent', 1, :p, :pmid,"
            " '[]'::jsonb)"
        )
        rows = [{"id": uuid7(), "ch": "sms", "p": "twilio", "pmid": sid}]
        rows += [{"id": n, "ch": "email", "p": "sendgrid", "pmid": None} for n in emails]
        await conn.execute(insert, [{**r, "t": tenant.id, "ev": f"e-{r['id']}", "u": user} for r in rows])
    return sid, [str(n) for n in emails]


def _sendgrid(events: list[dict[str, object]], sendgrid: FakeSendGrid, host: str) -> bytes:
    body = json.dumps(events).encode()
    return _raw("POST", SENDGRID_PATH, host, headers=sendgrid.signed_headers(body), body=body)


def _requests(
    variant: str, *, api: LoneApi, tenant: TenantInfo, auth_token: str, sendgrid: FakeSendGrid,
    sid: str, emails: list[str], host: str,
) -> list[bytes]:  # fmt: skip
    def event(nid: str, kind: str) -> dict[str, object]:
        return {
            "email": "a1@example.com", "timestamp": int(time.time()), "event": kind,
            "sg_event_id": secrets.token_urlsafe(16), "notification_id": nid,
        }  # fmt: skip

    if variant == "get-control":
        auth = {"Authorization": f"Bearer {tenant.key}"}
        return [_raw("GET", "/v1/users/a-1", host, headers=auth)]
    if variant == "twilio-one":
        params = {"MessageSid": sid, "SmsSid": sid, "MessageStatus": "delivered", "To": "+14155550100"}
        url = api.settings.base_url.rstrip("/") + TWILIO_PATH
        signature = RequestValidator(auth_token).compute_signature(url, params)
        headers = {"X-Twilio-Signature": signature, "Content-Type": "application/x-www-form-urlencoded"}
        return [_raw("POST", TWILIO_PATH, host, headers=headers, body=urlencode(params).encode())]
    if variant == "sendgrid-one":
        return [
            _sendgrid([event(emails[0], "deferred" if i % 2 else "open") for i in range(200)], sendgrid, host)
            for _ in range(8)
        ]
    return [_sendgrid([event(nid, "delivered") for nid in emails], sendgrid, host)]


async def main(*, loops: int, seconds: float, variants: list[str]) -> None:
    auth_token, sendgrid = secrets.token_hex(16), FakeSendGrid()
    env = {
        "CLARION_PROVIDERS__TWILIO__ACCOUNT_SID": "AC" + secrets.token_hex(16),
        "CLARION_PROVIDERS__TWILIO__AUTH_TOKEN": auth_token,
        "CLARION_PROVIDERS__TWILIO__FROM_NUMBER": "+14155550199",
        "CLARION_PROVIDERS__SENDGRID__WEBHOOK_PUBLIC_KEY": sendgrid.public_key,
    }
    async with lone_api("clarion_bench_callbacks", extra_env=env) as api:
        hostile, accepting = await make_tenant(api.engine), await make_tenant(api.engine)
        sid, emails = await _seed(api, hostile)
        await _accepts(api.url, accepting.key, 2)  # warm-up: connections, caches
        _print("alone", *await _measured(api.pid, api.url, accepting.key, seconds))
        context = multiprocessing.get_context("spawn")
        host = f"127.0.0.1:{api.settings.api_port}"
        for variant in variants:
            requests = _requests(
                variant, api=api, tenant=hostile, auth_token=auth_token, sendgrid=sendgrid,
                sid=sid, emails=emails, host=host,
            )  # fmt: skip
            out: multiprocessing.Queue = context.Queue()
            flood = context.Process(target=_flood, args=(api.url, requests, loops, seconds + 1.5, out))
            flood.start()
            await asyncio.sleep(1.0)  # the flood's process started and its loops connected
            latency, api_cores = await _measured(api.pid, api.url, accepting.key, seconds)
            answers = Counter(await asyncio.to_thread(out.get))
            flood.join()
            _print(variant, latency, api_cores)
            rate = sum(answers.values()) / (seconds + 1.5)
            print(
                f"{'':16s} flood {rate:6.0f}/s: " + ", ".join(f"{k} x{v}" for k, v in answers.most_common())
            )
        _print("alone again", *await _measured(api.pid, api.url, accepting.key, seconds))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--loops", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--only", nargs="*", choices=VARIANTS, default=list(VARIANTS))
    args = parser.parse_args()
    asyncio.run(main(loops=args.loops, seconds=args.seconds, variants=args.only))
