"""Users and their push devices: profile upsert, lookup, device registration and removal.

A user is known to callers by their external id, unique per tenant. Quiet hours are wall-clock
``HH:MM`` times in the user's IANA timezone (UTC when none is set).
"""

from __future__ import annotations

import re
from datetime import datetime
from uuid import UUID

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.errors import ApiError, unprintable_id
from api.models import check_device_token, check_email, check_phone, check_timezone
from api.refusal_text import shown
from core.devices import MAX_ACTIVE_DEVICES, MAX_TOKEN_CHARS, RETIRE_EXTRA
from schema.enums import Platform
from schema.ids import uuid7
from schema.models import Device, User

_users = User.__table__  # type: ignore[attr-defined]
_devices = Device.__table__  # type: ignore[attr-defined]
_RETIRE_EXTRA = sa.text(RETIRE_EXTRA.format(users="CAST(:users AS uuid[])"))  # core/devices.py

DEVICES_SHOWN = 2 * MAX_ACTIVE_DEVICES  # by GET /v1/users/{external_id}
HHMM = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")


class QuietHours(BaseModel):
    model_config = ConfigDict(extra="forbid")
    start: str = Field(description="local HH:MM when quiet hours begin, like 22:00")
    end: str = Field(description="local HH:MM when they end, like 07:00 (may be on the next day)")

    @field_validator("start", "end")
    @classmethod
    def _hhmm(cls, value: str) -> str:
        if not HHMM.match(value):
            raise ValueError(f"{shown(value)} is not a 24-hour HH:MM time")
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> QuietHours:
        if self.start == self.end:
            raise ValueError("quiet hours need different start and end times")
        return self


class UserProfileIn(BaseModel):
    """The whole profile: a field left out is cleared (PUT replaces)."""

    model_config = ConfigDict(extra="forbid")
    email: str | None = Field(default=None, max_length=320)
    phone: str | None = Field(default=None, description="E.164, like +14155550100")
    locale: str | None = Field(default=None, max_length=35, pattern=r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*$")
    timezone: str | None = Field(default=None, max_length=64, description="IANA name, like America/New_York")
    quiet_hours: QuietHours | None = None

    _email = field_validator("email")(check_email)
    _phone = field_validator("phone")(check_phone)
    _tz = field_validator("timezone")(check_timezone)


class DeviceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    platform: Platform
    token: str = Field(min_length=1, max_length=MAX_TOKEN_CHARS)

    @model_validator(mode="after")
    def _token_format(self) -> DeviceIn:
        check_device_token(self.platform, self.token)
        return self


class DeviceOut(BaseModel):
    platform: str
    token: str
    active: bool
    last_error: str | None
    created_at: datetime = Field(
        description="when it was registered: the first time, or when a retired or dead token was registered again"
    )


class UserOut(BaseModel):
    id: str = Field(description="the external id")
    email: str | None
    phone: str | None
    locale: str | None
    timezone: str | None
    quiet_hours: QuietHours | None
    devices: list[DeviceOut]
    created_at: datetime
    updated_at: datetime


async def user_id_for(conn: AsyncConnection, *, tenant_id: str, external_id: str) -> UUID:
    """The internal id of a tenant's user; ``ApiError`` 404 ``unknown_user`` when there is none."""
    found = await _internal_id(conn, tenant_id, external_id)
    if found is None:
        raise ApiError(404, "unknown_user", f"No user '{external_id}'.")
    return found


async def _internal_id(conn: AsyncConnection, tenant_id: str, external_id: str) -> UUID | None:
    found = (
        await conn.execute(
            sa.select(_users.c.id).where(_users.c.tenant_id == tenant_id, _users.c.external_id == external_id)
        )
    ).scalar_one_or_none()
    return None if found is None else UUID(str(found))


async def _user_out(conn: AsyncConnection, *, tenant_id: str, external_id: str) -> UserOut:
    row = (
        await conn.execute(
            sa.select(_users).where(_users.c.tenant_id == tenant_id, _users.c.external_id == external_id)
        )
    ).first()
    if row is None:
        raise ApiError(404, "unknown_user", f"No user '{external_id}'.")
    # The newest, oldest of them first: retired devices stay in the table, and one user may have had
    # any number (core/devices.py).
    newest = (
        sa.select(_devices)
        .where(_devices.c.user_id == row.id)
        .order_by(_devices.c.created_at.desc(), _devices.c.id.desc())
        .limit(DEVICES_SHOWN)
        .subquery()
    )
    devices = (await conn.execute(sa.select(newest).order_by(newest.c.created_at, newest.c.id))).all()
    quiet = (
        QuietHours(start=row.quiet_hours_start, end=row.quiet_hours_end)
        if row.quiet_hours_start and row.quiet_hours_end
        else None
    )
    return UserOut(
        id=row.external_id,
        email=row.email,
        phone=row.phone,
        locale=row.locale,
        timezone=row.timezone,
        quiet_hours=quiet,
        devices=[DeviceOut.model_validate(d, from_attributes=True) for d in devices],
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


async def put_user(
    *, engine: AsyncEngine, tenant_id: str, external_id: str, profile: UserProfileIn
) -> tuple[UserOut, bool]:
    """Create or replace a user's profile (devices are kept); returns it and whether it was created."""
    values = {
        "email": profile.email,
        "phone": profile.phone,
        "locale": profile.locale,
        "timezone": profile.timezone,
        "quiet_hours_start": profile.quiet_hours.start if profile.quiet_hours else None,
        "quiet_hours_end": profile.quiet_hours.end if profile.quiet_hours else None,
    }
    base = insert(_users).values(id=uuid7(), tenant_id=tenant_id, external_id=external_id, **values)
    stmt = base.on_conflict_do_update(
        constraint="uq_users_tenant_external", set_={**values, "updated_at": sa.func.now()}
    ).returning(sa.literal_column("xmax = 0", sa.Boolean).label("inserted"))
    refusal = unprintable_id("external_id", external_id)
    async with engine.begin() as conn:
        # A user stored before ids were checked is still updated (clarion/printable_ids.py); no
        # new one is created under such an id. No route deletes users, so the check holds.
        if refusal is not None and await _internal_id(conn, tenant_id, external_id) is None:
            raise refusal
        created = bool((await conn.execute(stmt)).scalar_one())
        return await _user_out(conn, tenant_id=tenant_id, external_id=external_id), created


async def get_user(*, engine: AsyncEngine, tenant_id: str, external_id: str) -> UserOut:
    """The user's profile and devices; ``ApiError`` 404 when unknown."""
    async with engine.connect() as conn:
        return await _user_out(conn, tenant_id=tenant_id, external_id=external_id)


async def register_device(
    *, engine: AsyncEngine, tenant_id: str, external_id: str, device: DeviceIn
) -> tuple[DeviceOut, bool]:
    """Register (or re-activate) a device; idempotent. Returns it and whether it is new."""
    async with engine.begin() as conn:
        user_id = await user_id_for(conn, tenant_id=tenant_id, external_id=external_id)
        base = insert(_devices).values(
            id=uuid7(), user_id=user_id, platform=device.platform.value, token=device.token
        )
        # Explicit registration revives a token a provider once reported dead (or the device cap
        # retired): the app says it is valid again. A revived device counts as registered now, so
        # it is among the newest that a push reaches and the cap retires another one.
        stmt = base.on_conflict_do_update(
            constraint="uq_devices_user_token",
            set_={
                "active": True,
                "last_error": None,
                "deactivated_at": None,
                "created_at": sa.case((_devices.c.active, _devices.c.created_at), else_=sa.func.now()),
            },
        ).returning(_devices, sa.literal_column("xmax = 0", sa.Boolean).label("inserted"))
        row = (await conn.execute(stmt)).one()
        await conn.execute(_RETIRE_EXTRA, {"users": [user_id]})  # within MAX_ACTIVE_DEVICES
    return DeviceOut.model_validate(row, from_attributes=True), bool(row.inserted)


async def remove_device(*, engine: AsyncEngine, tenant_id: str, external_id: str, token: str) -> None:
    """Stop sending to the device (deactivated, kept among the user's retired rows, core/devices.py); 404 when unknown."""
    async with engine.begin() as conn:
        user_id = await user_id_for(conn, tenant_id=tenant_id, external_id=external_id)
        result = await conn.execute(
            _devices.update()
            .where(_devices.c.user_id == user_id, _devices.c.token == token)
            .values(active=False, last_error="removed through the API", deactivated_at=sa.func.now())
        )
        if not result.rowcount:
            raise ApiError(404, "unknown_device", f"User '{external_id}' has no device with that token.")
