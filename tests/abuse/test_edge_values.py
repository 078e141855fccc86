"""Values at the edge of what Python and UTF-8 can hold, which a fuzzing round on 2026-11-28 found
answered with a 500: each is now the request's own 4xx, and a batch still accepts its good items.

- times whose arithmetic leaves the years 1-9999 (a default range, a window around an id's time,
  a conversion to UTC);
- a lone surrogate (``"\\ud800"`` in the JSON) quoted back in a refusal's message, which made the
  refusal itself impossible to encode;
- a lone surrogate in one item of a batch, which pydantic's JSON parser refused for the whole body.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from tests.fixtures.answers import refused
from tests.fixtures.sends import email_send
from tests.fixtures.webhooks import register


def uuid7_at(ms: int) -> uuid.UUID:
    """A UUIDv7 whose 48-bit time is ``ms`` milliseconds since 1970."""
    return uuid.UUID(int=(ms << 80) | (0x7 << 76) | (0b10 << 62) | 12345)


def raw_json(value: object) -> bytes:
    """``value`` as JSON text with its lone surrogates written as ``\\udXXX`` escapes, as a caller's
    JSON encoder would (``json.dumps`` escapes them; UTF-8 cannot hold one)."""
    return json.dumps(value).encode()


@pytest.mark.parametrize("until", ["0001-01-03T00:00:00Z", "0001-01-01T00:00:00+00:00"])
async def test_analytics_until_in_the_first_week_of_year_1(client: httpx.AsyncClient, until: str) -> None:
    response = await client.get("/v1/analytics", params={"until": until})
    assert refused(response, 422)["code"] == "invalid_range"


@pytest.mark.parametrize("ms", [253402257600000, 253402300799999])  # 9999-12-31 12:00 and its last ms
async def test_webhook_replay_of_an_event_id_at_the_end_of_9999(local: httpx.AsyncClient, ms: int) -> None:
    endpoint = await register(local, "http://127.0.0.1:9/h")
    body = {"event_id": str(uuid7_at(ms))}
    response = await local.post(f"/v1/webhook-endpoints/{endpoint['id']}/replay", json=body)
    assert refused(response, 404)["code"] == "not_found"


@pytest.mark.parametrize("occurred_at", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:00:00-05:00"])
async def test_engagement_occurred_at_outside_utc(client: httpx.AsyncClient, occurred_at: str) -> None:
    body = {"type": "opened", "occurred_at": occurred_at}
    response = await client.post(f"/v1/notifications/{uuid.uuid4()}/events", json=body)
    error = refused(response, 422)
    assert error["details"][0]["field"] == "occurred_at", error


@pytest.mark.parametrize(
    ("profile", "quoted"),
    [
        ({"phone": "\ud800"}, True),  # the phone and time checks quote the value in their message
        ({"quiet_hours": {"start": "\ud800", "end": "07:00"}}, True),
        ({"timezone": "x\udfff"}, False),  # pydantic refuses the text before the check sees it
    ],
)
async def test_a_refusal_quoting_a_lone_surrogate_is_still_a_422(
    client: httpx.AsyncClient, profile: dict[str, object], quoted: bool
) -> None:
    response = await client.put(
        "/v1/users/u-edge", content=raw_json(profile), headers={"content-type": "application/json"}
    )
    error = refused(response, 422)
    assert ("\ufffd" in error["message"]) is quoted, error


async def test_a_lone_surrogate_refuses_only_its_item_of_a_batch(client: httpx.AsyncClient) -> None:
    good, bad, bad_key = email_send(), email_send(data={"name": "a\ud800b"}), email_send()
    bad_key["data"] = {"k\udc00": "v"}
    response = await client.post(
        "/v1/notifications/batch",
        content=raw_json({"notifications": [good, bad, bad_key]}),
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 202, response.text
    body = response.json()
    assert (body["accepted"], body["rejected"]) == (1, 2), body
    first, second, third = body["results"]
    assert first["id"] is not None and first["error"] is None
    assert second["error"]["code"] == "validation_error" and "surrogate" in second["error"]["message"]
    assert third["error"]["code"] == "validation_error"


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b'{"notifications": [{"x": "\\ud800"}, NaN]}', 400, "malformed_json"),
        (
            b'{"notifications": [{"x": "\\ud800"}], "n": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            400,
            "malformed_json",
        ),
        (b'{"notifications": [], "x": "\\ud800"}', 422, "validation_error"),
        (b'{"notifications\\ud800": []}', 422, "validation_error"),
    ],
)
async def test_a_batch_read_past_a_surrogate_still_refuses_bad_json(
    client: httpx.AsyncClient, raw: bytes, status: int, code: str
) -> None:
    response = await client.post(
        "/v1/notifications/batch", content=raw, headers={"content-type": "application/json"}
    )
    assert refused(response, status)["code"] == code
