"""GET /v1/analytics a page at a time: every row exactly once in the answer's order, whatever the
grouping; a cursor works only for the tenant and the question it was issued for; every bad
cursor or limit is a 422 with the error body."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from api.analytics_cursor import CURSOR_PATTERN
from harness.services import ApiServer, api_client
from harness.tenants import TenantInfo
from tests.conftest import make_tenant
from tests.fixtures.answers import assert_error

# Today, whose day partition exists: a fixed past day's rows landed in the default partition of
# the session's shared database, which tests/api/test_ops.py checks stays empty.
START = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
RANGE = {"since": START.isoformat(), "until": (START + timedelta(days=2)).isoformat()}
GROUPING = "channel,template,template_version,category,provider"
ALL = GROUPING.split(",")
# Empty values ('' template, category and provider; version 0) and values that sort around them.
VALUES = [
    ("email", "", 0, "", ""),
    ("email", "", 0, "", "sendgrid"),
    ("email", "a", 1, "", ""),
    ("email", "a", 2, "news", "sendgrid"),
    ("email", "b\u00e9", 1, " ", "ses"),
    ("sms", "", 0, "", "twilio"),
    ("sms", "a", 1, "alerts", "twilio"),
    ("push", "z", 10, "", "fcm"),
]


def _z(at: datetime) -> str:
    """``at`` as the API writes a UTC time."""
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


async def add_rollups(engine: AsyncEngine, tenant_id: str) -> None:
    """Six hours of ``VALUES`` (48 rows, every hour's eight sharing one ``at``), hours apart so a
    day holds them all."""
    rows = [
        {"t": tenant_id, "h": START + timedelta(hours=3 * i), "c": c, "tp": tp, "v": v, "cat": cat, "p": p}
        for i in range(6)
        for c, tp, v, cat, p in VALUES
    ]
    async with engine.begin() as conn:
        await conn.exec_driver_sql(
            "INSERT INTO analytics_hourly (tenant_id, hour, channel, template, template_version, category,"
            " provider, accepted, sent, opened) VALUES ($1, $2, $3, $4, $5, $6, $7, 4, 2, 1)",
            [tuple(r.values()) for r in rows],
        )


async def pages(client: httpx.AsyncClient, params: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        answer = await client.get("/v1/analytics", params=params | ({"cursor": cursor} if cursor else {}))
        assert answer.status_code == 200, answer.text
        out.append(answer.json())
        cursor = out[-1]["next_cursor"]
        if cursor is None:
            return out


def keys(rows: list[dict[str, Any]], dims: list[str]) -> list[tuple[Any, ...]]:
    return [(r["at"], *(r["group"][d] for d in dims)) for r in rows]


@pytest.mark.parametrize("limit", [1, 3, 7, 48, 1000])
@pytest.mark.parametrize(
    ("interval", "group_by"),
    [("hour", GROUPING), ("day", GROUPING), ("day", "provider,template"), ("day", "")],
)
async def test_pages_hold_every_row_once_in_the_whole_answers_order(
    engine: AsyncEngine,
    tenant: TenantInfo,
    client: httpx.AsyncClient,
    limit: int,
    interval: str,
    group_by: str,
) -> None:
    await add_rollups(engine, tenant.id)
    params = RANGE | {"interval": interval, "group_by": group_by}
    whole = (await client.get("/v1/analytics", params=params)).json()
    assert whole["next_cursor"] is None
    paged = await pages(client, params | {"limit": limit})
    dims = [d for d in group_by.split(",") if d]
    rows = [r for p in paged for r in p["rows"]]
    assert rows == whole["rows"]  # same rows, counts and rates, same order, none twice
    assert len(set(keys(rows, dims))) == len(rows)
    assert all(len(p["rows"]) == limit for p in paged[:-1]) and 0 < len(paged[-1]["rows"]) <= limit
    groups = {tuple(v[ALL.index(d)] for d in dims) for v in VALUES}
    assert len(rows) == (6 if interval == "hour" else 1) * len(groups)
    assert sum(r["counts"]["accepted"] for r in rows) == 4 * 48


async def test_a_full_last_page_says_there_is_no_next(
    engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    await add_rollups(engine, tenant.id)
    paged = await pages(client, RANGE | {"interval": "hour", "group_by": GROUPING, "limit": 8})
    assert [len(p["rows"]) for p in paged] == [8] * 6


async def test_a_cursor_is_refused_for_another_question_or_tenant(
    api: ApiServer, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    await add_rollups(engine, tenant.id)
    params = RANGE | {"interval": "hour", "group_by": GROUPING, "limit": 5}
    cursor = (await client.get("/v1/analytics", params=params)).json()["next_cursor"]
    assert (await client.get("/v1/analytics", params=params | {"cursor": cursor})).status_code == 200
    for other in (
        {"group_by": "channel,template,template_version,category"},
        {"interval": "day"},
        {"until": (START + timedelta(days=3)).isoformat()},
        {"channel": "email"},
        {"category": ""},
    ):
        answer = await client.get("/v1/analytics", params=params | other | {"cursor": cursor})
        assert_error(answer, 422, "invalid_cursor")
    other_tenant = await make_tenant(engine)
    await add_rollups(engine, other_tenant.id)
    async with api_client(api.url, other_tenant.key) as c:
        assert_error(await c.get("/v1/analytics", params=params | {"cursor": cursor}), 422, "invalid_cursor")


async def test_pages_of_the_default_range_keep_the_first_pages_range(
    engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    """Without since/until the range is the 7 days before now; the cursor carries it, so later
    pages read the same range however much later they are asked for."""
    async with engine.begin() as conn:
        await conn.exec_driver_sql(
            "INSERT INTO analytics_hourly (tenant_id, hour, channel, template, template_version, category,"
            " provider, accepted) SELECT $1, date_trunc('hour', now()) - make_interval(hours => h), 'email',"
            " 't-' || t, 1, '', '', 1 FROM generate_series(1, 5) h, generate_series(1, 3) t",
            (tenant.id,),
        )
    paged = await pages(client, {"interval": "hour", "group_by": "template", "limit": 4})
    assert len(paged) == 4 and len({(p["since"], p["until"]) for p in paged}) == 1
    rows = [r for p in paged for r in p["rows"]]
    assert len(set(keys(rows, ["template"]))) == len(rows) == 15


async def test_rollups_written_between_pages_show_ahead_of_the_cursor_never_behind_it(
    engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    """A keyset: a row that grows or first appears after the cursor is in the pages still to read;
    a group that first appears behind it (in a bucket already read) is not, and no row repeats."""
    await add_rollups(engine, tenant.id)
    params = RANGE | {"interval": "hour", "group_by": GROUPING, "limit": 8}
    first = (await client.get("/v1/analytics", params=params)).json()  # the first hour's 8 rows
    sql = (
        "INSERT INTO analytics_hourly (tenant_id, hour, channel, template, template_version, category,"
        " provider, accepted) VALUES ($1, $2, 'email', '', 0, '', 'aaa', 1)"
        " ON CONFLICT (tenant_id, hour, channel, template, template_version, category, provider)"
        " DO UPDATE SET accepted = analytics_hourly.accepted + 1"
    )
    async with engine.begin() as conn:
        for hour in (START, START + timedelta(hours=15)):  # a new group behind the cursor, one ahead
            await conn.exec_driver_sql(sql, (tenant.id, hour))
        await conn.exec_driver_sql(  # a row ahead grows
            "UPDATE analytics_hourly SET accepted = accepted + 10 WHERE tenant_id = $1 AND hour = $2",
            (tenant.id, START + timedelta(hours=15)),
        )
    rest = await pages(client, params | {"cursor": first["next_cursor"]})
    rows = first["rows"] + [r for p in rest for r in p["rows"]]
    shown = keys(rows, ALL)
    assert len(set(shown)) == len(shown) == 48 + 1
    behind, ahead = (_z(START), _z(START + timedelta(hours=15)))
    assert (ahead, "email", "", 0, "", "aaa") in shown
    assert (behind, "email", "", 0, "", "aaa") not in shown  # a new read has it
    assert sum(r["counts"]["accepted"] for r in rows if r["at"] == ahead) == 4 * 8 + 1 + 10 * 9


async def test_every_page_of_a_range_given_with_an_offset_answers_it_in_utc(
    engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    """Before, the first page echoed the caller's offset and the next ones the cursor's UTC: one
    read answered its range two ways."""
    await add_rollups(engine, tenant.id)
    plus_5 = timezone(timedelta(hours=5))
    params = {
        "since": START.astimezone(plus_5).isoformat(),
        "until": (START + timedelta(days=2)).astimezone(plus_5).isoformat(),
        "interval": "hour",
        "group_by": GROUPING,
        "limit": 20,
    }
    paged = await pages(client, params)
    assert len(paged) == 3
    assert {(p["since"], p["until"]) for p in paged} == {(_z(START), _z(START + timedelta(days=2)))}


async def test_a_range_an_offset_moves_out_of_the_years_1_to_9999_is_an_invalid_range(
    client: httpx.AsyncClient,
) -> None:
    params = {"since": "0001-01-01T00:00:00+05:00", "until": "0001-01-02T00:00:00Z"}
    assert_error(await client.get("/v1/analytics", params=params), 422, "invalid_range")


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


async def test_an_edited_cursor_is_refused(
    engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    await add_rollups(engine, tenant.id)
    params = RANGE | {"interval": "hour", "group_by": GROUPING, "limit": 5}
    cursor = (await client.get("/v1/analytics", params=params)).json()["next_cursor"]
    body, mac = cursor.split(".")
    payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    edited = payload.replace(b'"email"', b'"sms"')  # the group values are after the range
    assert edited != payload
    for bad in (f"{b64(edited)}.{mac}", f"{body}.{b64(b'x' * 16)}", f"{body}.{mac[:-2]}AA"):
        assert_error(
            await client.get("/v1/analytics", params=params | {"cursor": bad}), 422, "invalid_cursor"
        )


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage",
        "",
        ".",
        "a.b",
        b64(b"not json at all") + "." + b64(b"0" * 16),
        b64(b"[1e400]") + "." + b64(b"0" * 16),
        b64(b"[" * 5000) + "." + b64(b"0" * 16),
        b64(b'[99999999999999999999999999,"email"]') + "." + b64(b"0" * 16),
        b64(b"\x00\xff\xfe") + "." + b64(b"\x00" * 16),
        "A" * 2801 + "." + "A" * 22,
        "a\x00b.cccccccccccccccccccccc",
        "%00",
        "=" * 30,
    ],
)
async def test_a_hostile_cursor_is_a_422_with_the_error_body(client: httpx.AsyncClient, cursor: str) -> None:
    # The route's pattern (in the OpenAPI document) refuses what cannot be a cursor; the MAC the rest.
    code = "invalid_cursor" if re.fullmatch(CURSOR_PATTERN, cursor) else "validation_error"
    answer = await client.get("/v1/analytics", params=RANGE | {"group_by": GROUPING, "cursor": cursor})
    assert_error(answer, 422, code)


@pytest.mark.parametrize("limit", ["0", "-1", "1001", str(2**64), "1.5", "many"])
async def test_a_limit_out_of_bounds_is_a_422(client: httpx.AsyncClient, limit: str) -> None:
    assert_error(await client.get("/v1/analytics", params={"limit": limit}), 422, "validation_error")
