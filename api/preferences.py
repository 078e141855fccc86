"""Preferences: opt in/out per channel, category, or channel within a category.

The tenant's categories are `api.categories`; the signed links that let a person manage their own
preferences, `api.preference_links`.

What is guaranteed:
- an opt-out of a ``required`` category is refused (``422 category_required``): such messages
  (security alerts, OTPs) are always delivered;
- one-click unsubscribe is idempotent: repeating it leaves the same single opt-out, and a repeat
  is one read, with no lock and no write (2026-11-29: a link replayed by 64 loops took the user's
  lock, rewrote the row and read back the whole preference set each time, a dozen statements);
- a change that grows a user's choices past ``MAX_PREFERENCES_PER_USER`` is refused (``409
  limit_reached``; a one-click unsubscribe never is, nor a STOP reply's opt-out): merges were
  unbounded, so anyone holding one of the user's 60-day preference links grew the set 500 at a
  time, and every answer carries the whole set. A helper's probe (2026-11-28): 50,000 rows,
  3.55 MB and 0.55 s per answer, and four loops reading it took another tenant's accept p50 from
  8 to 1,658 ms.
"""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.caps import one_at_a_time
from api.categories import CategoryOut, categories_of
from api.errors import ApiError
from api.models import NAME
from api.preference_links import invalid_token
from api.users import user_id_for
from core.preferences import ANY, CategoryRule, wanted
from schema.enums import Channel
from schema.models import Category, Preference, User

_prefs = Preference.__table__  # type: ignore[attr-defined]
_categories = Category.__table__  # type: ignore[attr-defined]
_users = User.__table__  # type: ignore[attr-defined]

CHANNELS = tuple(c.value for c in Channel)
MAX_PREFERENCES_PER_USER = 1_000
CATEGORY_PATTERN = rf"({NAME[:-1]}$)|(^\*$)"


class PreferenceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    channel: Literal["email", "sms", "push", "*"] = Field(description="a channel, or '*' for every channel")
    category: str = Field(
        max_length=64, pattern=CATEGORY_PATTERN, description="a category, or '*' for every category"
    )
    opted_in: bool = Field(strict=True)  # JSON true/false only (lax mode took 0, 1, "yes")


class PreferencesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    preferences: list[PreferenceIn] = Field(max_length=500)

    @model_validator(mode="after")
    def _unique(self) -> PreferencesIn:
        keys = [(p.channel, p.category) for p in self.preferences]
        if len(keys) != len(set(keys)):
            raise ValueError("each (channel, category) may appear once")
        return self


class PreferencesOut(BaseModel):
    preferences: list[PreferenceIn] = Field(description="the user's explicit choices")
    categories: list[CategoryOut] = Field(description="the tenant's declared categories")
    effective: dict[str, dict[str, bool]] = Field(
        description="category (or '*' for any other) -> channel -> whether it is delivered"
    )


# --- preferences ----------------------------------------------------------------------------------


async def _preferences_out(conn: AsyncConnection, *, tenant_id: str, user_id: UUID) -> PreferencesOut:
    categories = await categories_of(conn, tenant_id)
    rows = (
        await conn.execute(
            sa.select(_prefs.c.channel, _prefs.c.category, _prefs.c.opted_in)
            .where(_prefs.c.user_id == user_id)
            .order_by(_prefs.c.category, _prefs.c.channel)
        )
    ).all()
    explicit = {(r.channel, r.category): r.opted_in for r in rows}
    rules = {c.name: CategoryRule(c.default_opted_in, c.required, c.email_quiet_hours) for c in categories}
    names = [*rules, *sorted({cat for _, cat in explicit if cat != ANY and cat not in rules}), ANY]
    effective = {
        name: {
            channel: wanted(prefs=explicit, channel=channel, category=name, rule=rules.get(name))
            for channel in CHANNELS
        }
        for name in names
    }
    return PreferencesOut(
        preferences=[PreferenceIn(channel=r.channel, category=r.category, opted_in=r.opted_in) for r in rows],
        categories=categories,
        effective=effective,
    )


async def _refuse_required_opt_outs(
    conn: AsyncConnection, tenant_id: str, entries: list[PreferenceIn]
) -> None:
    named = {p.category for p in entries if not p.opted_in and p.category != ANY}
    if not named:
        return
    required = (
        (
            await conn.execute(
                sa.select(_categories.c.name).where(
                    _categories.c.tenant_id == tenant_id,
                    _categories.c.name == sa.any_(sa.bindparam("named", sorted(named), type_=ARRAY(sa.Text))),
                    _categories.c.required.is_(True),
                )
            )
        )
        .scalars()
        .all()
    )
    if required:
        raise _category_required(sorted(required))


def _category_required(required: list[str]) -> ApiError:
    return ApiError(
        422,
        "category_required",
        f"Category '{required[0]}' is required and cannot be opted out of.",
        {"categories": required},
    )


# One statement of three arrays, whatever the number of entries: a multi-row VALUES of 500 entries
# was 2,000 bound parameters that SQLAlchemy built and compiled again for every request, about 40
# ms of the event loop each (py-spy, 2026-11-29), and the one statement compiles once.
UPSERT = sa.text("""
INSERT INTO preferences (user_id, channel, category, opted_in)
SELECT :user_id, e.channel, e.category, e.opted_in
  FROM unnest(CAST(:channels AS text[]), CAST(:categories AS text[]), CAST(:opted_in AS boolean[]))
       AS e(channel, category, opted_in)
ON CONFLICT (user_id, channel, category) DO UPDATE SET opted_in = excluded.opted_in, updated_at = now()
""").bindparams(sa.bindparam("user_id", type_=sa.Uuid))


async def _upsert(conn: AsyncConnection, user_id: UUID, entries: list[PreferenceIn]) -> None:
    if not entries:
        return
    await conn.execute(
        UPSERT,
        {
            "user_id": user_id,
            "channels": [p.channel for p in entries],
            "categories": [p.category for p in entries],
            "opted_in": [p.opted_in for p in entries],
        },
    )


async def _merge(conn: AsyncConnection, user_id: UUID, entries: list[PreferenceIn], *, capped: bool) -> None:
    held = sa.select(sa.func.count()).select_from(_prefs).where(_prefs.c.user_id == user_id)
    before = (await conn.execute(held)).scalar_one()
    await _upsert(conn, user_id, entries)
    after = (await conn.execute(held)).scalar_one()
    # Refused only when this request grew the set past the cap: a set already past it (a STOP
    # reply's opt-outs are not capped) can still be changed, and an unsubscribe never waits on it.
    if capped and after > MAX_PREFERENCES_PER_USER and after > before:
        raise ApiError(
            409, "limit_reached",
            f"A user may hold {MAX_PREFERENCES_PER_USER} preferences; replace the set, or set '*' instead.",
            {"limit": MAX_PREFERENCES_PER_USER},
        )  # fmt: skip


async def get_preferences(*, engine: AsyncEngine, tenant_id: str, user_id: UUID) -> PreferencesOut:
    """The user's explicit choices, the tenant's categories and what is delivered as a result."""
    async with engine.connect() as conn:
        return await _preferences_out(conn, tenant_id=tenant_id, user_id=user_id)


async def set_preferences(
    *,
    engine: AsyncEngine,
    tenant_id: str,
    user_id: UUID,
    entries: list[PreferenceIn],
    replace: bool,
    capped: bool = True,
) -> PreferencesOut:
    """Store choices: with ``replace`` they become the user's whole set, otherwise they are merged.

    Nothing is written when an entry opts out of a required category (``422 category_required``).
    """
    async with engine.begin() as conn:
        return await _store(conn, tenant_id, user_id, entries, replace=replace, capped=capped)


async def _store(
    conn: AsyncConnection,
    tenant_id: str,
    user_id: UUID,
    entries: list[PreferenceIn],
    *,
    replace: bool,
    capped: bool,
) -> PreferencesOut:
    """:func:`set_preferences` in ``conn``'s transaction."""
    await _refuse_required_opt_outs(conn, tenant_id, entries)
    await one_at_a_time(conn, kind="preferences", key=str(user_id))  # one writer: the counts are exact
    if replace:  # the set becomes the entries, at most 500: under the cap, nothing to count
        await conn.execute(_prefs.delete().where(_prefs.c.user_id == user_id))
        await _upsert(conn, user_id, entries)
    else:
        await _merge(conn, user_id, entries, capped=capped)
    return await _preferences_out(conn, tenant_id=tenant_id, user_id=user_id)


async def unsubscribe(*, engine: AsyncEngine, tenant_id: str, user_id: UUID, category: str) -> bool:
    """Opt the user out of email in ``category`` now; True when that changed something.

    Idempotent, and a repeat is one read: no lock, no write (a replayed link in a loop took a
    transaction of five statements and a user's lock each time). ``403 invalid_token`` when the
    user no longer exists; ``422 category_required`` for a required category.
    """
    entry = PreferenceIn(channel="email", category=category, opted_in=False)
    async with engine.connect() as conn:
        found = (await conn.execute(_unsubscribed(tenant_id, user_id, category))).one()
    if not found.user:
        raise invalid_token()
    if found.required:
        raise _category_required([category])
    if found.opted_in is False:
        return False
    async with engine.begin() as conn:  # capped=False: one row, and one-click must always work (RFC 8058)
        await _refuse_required_opt_outs(conn, tenant_id, [entry])
        await one_at_a_time(conn, kind="preferences", key=str(user_id))  # as set_preferences' writes
        await _upsert(conn, user_id, [entry])
    return True


def _unsubscribed(tenant_id: str, user_id: UUID, category: str) -> sa.Select[Any]:
    """Whether the user exists, whether the category is required, and the user's email choice in it."""
    return sa.select(
        sa.exists().where(_users.c.id == user_id, _users.c.tenant_id == tenant_id).label("user"),
        sa.exists()
        .where(
            _categories.c.tenant_id == tenant_id,
            _categories.c.name == category,
            _categories.c.required.is_(True),
        )
        .label("required"),
        sa.select(_prefs.c.opted_in)
        .where(_prefs.c.user_id == user_id, _prefs.c.channel == "email", _prefs.c.category == category)
        .scalar_subquery()
        .label("opted_in"),
    )


# --- by external id (service side) -----------------------------------------------------------------


# One checkout for the user's lookup and the work: two queued for the pool twice, each while the
# request held its tenant's turn (``api.preference_gate``).


async def user_preferences(*, engine: AsyncEngine, tenant_id: str, external_id: str) -> PreferencesOut:
    """:func:`get_preferences` for a user named by external id (404 ``unknown_user``)."""
    async with engine.connect() as conn:
        user_id = await user_id_for(conn, tenant_id=tenant_id, external_id=external_id)
        return await _preferences_out(conn, tenant_id=tenant_id, user_id=user_id)


async def replace_user_preferences(
    *, engine: AsyncEngine, tenant_id: str, external_id: str, entries: list[PreferenceIn]
) -> PreferencesOut:
    """Make ``entries`` the user's whole set of choices (see :func:`set_preferences`)."""
    async with engine.begin() as conn:
        user_id = await user_id_for(conn, tenant_id=tenant_id, external_id=external_id)
        return await _store(conn, tenant_id, user_id, entries, replace=True, capped=True)
