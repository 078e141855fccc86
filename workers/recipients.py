"""Where a claimed notification goes: its email, phone or active devices; dead devices retired."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from core.devices import REACHED
from schema.enums import Channel
from schema.ids import created_window
from workers.claim import ClaimedNotification


@dataclass(frozen=True, slots=True)
class Address:
    to: str
    platform: str | None = None


async def addresses_for(*, pool: asyncpg.Pool, rows: list[ClaimedNotification]) -> dict[UUID, list[Address]]:
    """Addresses per notification: push gets every active device not yet sent to by an earlier
    attempt of the same notification (so a retry never re-sends to a device that succeeded)."""
    result: dict[UUID, list[Address]] = {}
    push = [r for r in rows if r.channel == Channel.push.value]
    devices: dict[UUID, list[Address]] = defaultdict(list)
    done: dict[UUID, set[str]] = defaultdict(set)
    if push:
        for d in await pool.fetch(REACHED, list({r.user_id for r in push})):
            devices[d["user_id"]].append(Address(d["token"], d["platform"]))
        retried = [r.id for r in push if r.attempts > 0]
        if retried:
            for a in await pool.fetch(
                "SELECT notification_id, recipient FROM delivery_attempts"
                " WHERE notification_id = ANY($1::uuid[]) AND outcome = 'sent' AND started_at >= $2",
                retried,
                created_window(retried)[0],
            ):
                done[a["notification_id"]].add(a["recipient"])
    for r in rows:
        channel = r.channel
        if channel == Channel.email.value:
            result[r.id] = [Address(r.email)] if r.email else []
        elif channel == Channel.sms.value:
            result[r.id] = [Address(r.phone)] if r.phone else []
        else:
            result[r.id] = [a for a in devices.get(r.user_id, []) if a.to not in done[r.id]]
    return result


async def deactivate_device(*, pool: asyncpg.Pool, user_id: UUID, token: str, reason: str) -> None:
    """Stop using a device token the provider reported invalid, keeping why and when."""
    await pool.execute(
        "UPDATE devices SET active = false, last_error = $3, deactivated_at = now()"
        " WHERE user_id = $1 AND token = $2 AND active",
        user_id,
        token,
        reason[:500],
    )
