"""One push reaches at most ``MAX_ACTIVE_DEVICES`` of its user's devices, the newest
(``core/devices.py``), whatever the devices table holds: a tenant cannot make one push into
thousands of provider calls on the worker every tenant shares."""

from __future__ import annotations

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from core.devices import MAX_ACTIVE_DEVICES
from schema.enums import Channel
from schema.ids import uuid7
from tests.conftest import make_tenant
from tests.fixtures.claimed import claimed
from workers.recipients import addresses_for


async def test_a_push_goes_to_the_newest_devices_only(pool: asyncpg.Pool, engine: AsyncEngine) -> None:
    tenant = await make_tenant(engine)
    user = uuid7()
    await pool.execute(
        "INSERT INTO users (id, tenant_id, external_id) VALUES ($1, $2, 'many-devices')", user, tenant.id
    )
    # Straight into the table, past the registration's own bound (rows from before it, say).
    tokens = [f"{n:04d}" + "a" * 60 for n in range(MAX_ACTIVE_DEVICES + 30)]
    await pool.executemany(  # one a second, the last one now
        "INSERT INTO devices (id, user_id, platform, token, created_at)"
        " VALUES ($1, $2, 'apns', $3, now() - make_interval(secs => $4))",
        [(uuid7(), user, token, len(tokens) - n) for n, token in enumerate(tokens)],
    )
    await pool.execute(
        "UPDATE devices SET active = false WHERE user_id = $1 AND token = $2", user, tokens[-1]
    )
    row = claimed(channel=Channel.push, tenant_id=tenant.id, user_id=user)
    sent_to = [a.to for a in (await addresses_for(pool=pool, rows=[row]))[row.id]]
    newest_active = tokens[-1 - MAX_ACTIVE_DEVICES : -1]
    assert sent_to == newest_active  # the newest active ones, oldest of them first
