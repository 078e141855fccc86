"""Managing a tenant's rate-limit rules (its delivery settings: `api.tenant_settings`).

A tenant sees and changes only its own rules; global rules (``tenant_id`` NULL, e.g. provider
pacing shared by every tenant) are managed in the database by operators. Every change bumps
``updated_at``; running processes pick it up within `clarion.rules.REFRESH_TTL_S` seconds.

A rule's name is empty or 1-64 letters, digits, ``_``, ``.`` and ``-``, starting with a letter or
a digit: it is quoted in refusals and in notification histories (`clarion.rule_names`).

Which combinations are valid (anything else is a ``422 validation_error``):

| scope       | enforced                                  | action        | may set             |
|-------------|-------------------------------------------|---------------|---------------------|
| `tenant`    | at the API, per tenant                    | `reject`      | -                   |
| `api_key`   | at the API, per API key                   | `reject`      | -                   |
| `recipient` | in the worker, per user+channel[+category]| `delay`/`drop`| channel, category   |
| `provider`  | in the worker, per provider account       | `delay`/`drop`| channel, provider   |

A ``recipient`` rule is a frequency cap (at most ``limit`` per ``period_s``) and takes no
``burst``. A tenant holds at most ``MAX_RECIPIENT_RULES`` (10) of them (``409 limit_reached``):
each keeps a limiter entry per recipient in the shared Redis for its whole period.

Modes: ``hard`` (the default: never above the limit), ``soft`` (admits ``overshoot_pct`` more)
and ``elastic``. An elastic rule is a ``recipient`` cap that lets a user receive more than its
limit while the provider sending the notification has spare capacity. Its pool is the provider
pacing of the rule's channel (``provider`` rules, the tenant's own or global): for each
notification, the pacing of the provider account that sends it, the one with the least room
when several rules apply (see `workers.throttle`). So:

- only ``recipient`` rules may be elastic, and they must name a ``channel`` (the pool is that
  channel's pacing) and set no ``overshoot_pct`` (``422 validation_error``). Ingress rules cannot
  be elastic: at the API a send has no provider yet, and nothing paces it there; a provider
  rule is the pool itself.
- an enabled elastic rule needs an enabled provider rule that can pace its channel, or it is
  refused with ``422 elastic_without_pacing`` (create the pacing rule first). If that pacing rule
  is later deleted or disabled, or a notification goes through a provider no rule paces, the
  cap has nothing to borrow from and holds at its limit, as a hard rule.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.caps import hold_under_cap
from api.errors import ApiError
from api.json_types import JsonInt
from api.refusal_text import shown
from clarion.rule_names import MAX_NAME_CHARS, NAME_PATTERN, NAME_RULE
from core.ratelimit import MIN_INTERVAL_US, MIN_PERIOD_S
from providers.registry import REAL_PROVIDERS
from schema.enums import Channel
from schema.models import RateLimitRule

_rules = RateLimitRule.__table__  # type: ignore[attr-defined]

KNOWN_PROVIDERS = frozenset({field_name for field_name, _ in REAL_PROVIDERS.values()} | {"smtp", "sandbox"})
PROVIDER_CHANNELS: dict[str, frozenset[str]] = {
    name: frozenset(channel.value for (channel, _), (n, _) in REAL_PROVIDERS.items() if n == name)
    for name in KNOWN_PROVIDERS
} | {"smtp": frozenset({Channel.email.value}), "sandbox": frozenset(c.value for c in Channel)}
"""The channels each provider account sends on (the sandbox stands in for every channel)."""
INGRESS_SCOPES = frozenset({"tenant", "api_key"})
MAX_PERIOD_S = 31 * 24 * 3600.0


class RateLimitIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        default="", max_length=MAX_NAME_CHARS, pattern=NAME_PATTERN,
        description=f"shown in refusals and in why a send waited: {NAME_RULE}",
    )  # fmt: skip
    scope: Literal["tenant", "api_key", "recipient", "provider"]
    channel: Channel | None = Field(default=None, description="recipient/provider: only this channel")
    category: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
    )
    provider: str | None = Field(
        default=None, description=f"provider scope: one of {sorted(KNOWN_PROVIDERS)}"
    )
    limit: JsonInt = Field(ge=1, le=10_000_000, description="events allowed per period")
    period_s: float = Field(
        ge=MIN_PERIOD_S, le=MAX_PERIOD_S, allow_inf_nan=False, strict=True,
        description="seconds the limit applies to; at most one event per microsecond (period_s / limit >= 1e-6)",
    )  # fmt: skip
    burst: JsonInt = Field(default=0, ge=0, le=10_000_000, description="extra events allowed at once")
    mode: Literal["hard", "soft", "elastic"] = Field(
        default="hard",
        description="hard: never above the limit; soft: overshoot_pct more; elastic (recipient rules "
        "with a channel): above the limit while that channel's provider pacing has spare capacity",
    )
    overshoot_pct: float = Field(
        default=0.0,
        ge=0,
        le=1000,
        allow_inf_nan=False,
        strict=True,
        description="soft mode: tolerated excess, %",
    )
    action: Literal["reject", "delay", "drop"] | None = Field(
        default=None, description="default: reject for tenant/api_key scopes, delay otherwise"
    )
    enabled: bool = Field(default=True, strict=True)

    @model_validator(mode="after")
    def _consistent(self) -> RateLimitIn:
        if self.period_s * 1e6 / self.limit < MIN_INTERVAL_US:
            raise ValueError("a rule may allow at most one event per microsecond (period_s / limit >= 1e-6)")
        ingress = self.scope in INGRESS_SCOPES
        if self.action is None:
            self.action = "reject" if ingress else "delay"
        if ingress and self.action != "reject":
            raise ValueError(f"a {self.scope} rule is enforced at the API: its action must be 'reject'")
        if not ingress and self.action == "reject":
            raise ValueError(f"a {self.scope} rule is enforced by workers: its action is 'delay' or 'drop'")
        allowed = {"tenant": (), "api_key": (), "recipient": ("channel", "category")}.get(
            self.scope, ("channel", "provider")
        )
        for name in ("channel", "category", "provider"):
            if getattr(self, name) is not None and name not in allowed:
                raise ValueError(f"'{name}' does not apply to a {self.scope} rule")
        if self.provider is not None and self.provider not in KNOWN_PROVIDERS:
            raise ValueError(
                f"unknown provider {shown(self.provider)}; known: {', '.join(sorted(KNOWN_PROVIDERS))}"
            )
        if self.scope == "recipient" and self.burst:
            raise ValueError("a recipient rule is a frequency cap: at most 'limit' per 'period_s', no burst")
        if self.mode == "soft" and self.overshoot_pct == 0:
            raise ValueError("a soft rule needs overshoot_pct > 0")
        if self.mode == "elastic":
            self._check_elastic()
        return self

    def _check_elastic(self) -> None:
        if self.scope in INGRESS_SCOPES:
            raise ValueError(
                f"a {self.scope} rule cannot be elastic: it is enforced at the API, before a send has a "
                "provider whose spare capacity it could borrow; use mode 'soft' for a tolerated excess"
            )
        if self.scope == "provider":
            raise ValueError(
                "a provider rule cannot be elastic: it is the pacing that elastic recipient rules borrow from"
            )
        if self.channel is None:
            raise ValueError("an elastic rule borrows from the provider pacing of one channel: set 'channel'")
        if self.overshoot_pct:
            raise ValueError(
                "overshoot_pct is for soft rules; an elastic rule's excess is what its provider can spare"
            )


class RateLimitOut(BaseModel):
    id: UUID
    name: str
    scope: str
    channel: str | None
    category: str | None
    provider: str | None
    limit: int
    period_s: float
    burst: int
    mode: str
    overshoot_pct: float
    action: str
    enabled: bool
    created_at: datetime
    updated_at: datetime


def _values(rule: RateLimitIn) -> dict[str, Any]:
    values = rule.model_dump()
    values["channel"] = rule.channel.value if rule.channel is not None else None
    return values


def _not_found(rule_id: UUID) -> ApiError:
    return ApiError(404, "not_found", f"No rate-limit rule {rule_id}.")


def _serves(provider: str | None, channel: str) -> bool:
    """Whether a pacing rule for ``provider`` (None: any) can pace sends on ``channel``."""
    return provider is None or channel in PROVIDER_CHANNELS.get(provider, ())


async def _require_pacing(conn: AsyncConnection, *, tenant_id: str, rule: RateLimitIn) -> None:
    """Refuse an enabled elastic rule with no enabled provider rule to borrow from (see module
    docstring); checked in the transaction that stores the rule."""
    if rule.mode != "elastic" or not rule.enabled or rule.channel is None:
        return
    channel = rule.channel.value
    rows = await conn.execute(
        sa.select(_rules.c.provider).where(
            _rules.c.scope == "provider",
            _rules.c.enabled,
            sa.or_(_rules.c.tenant_id.is_(None), _rules.c.tenant_id == tenant_id),
            sa.or_(_rules.c.channel.is_(None), _rules.c.channel == channel),
        )
    )
    if not any(_serves(provider, channel) for (provider,) in rows):
        raise ApiError(
            422,
            "elastic_without_pacing",
            f"An elastic rule borrows the spare capacity of the provider pacing for its channel, and no "
            f"enabled provider rule paces '{channel}'. Create one first (scope 'provider', channel "
            f"'{channel}'), or use mode 'hard' or 'soft'.",
            {"field": "mode", "channel": channel},
        )


# A recipient rule keeps a limiter entry in the shared Redis per recipient it has seen, for its
# whole period (up to 31 days): each is one more key per send. A helper's probe (2026-11-28): 100
# such rules made 202,000 keys (53 MB) out of 2,000 sends, ~20 KB a send, kept for a month.
MAX_RECIPIENT_RULES = 10


async def _hold_recipient_rules(
    conn: AsyncConnection, *, tenant_id: str, rule: RateLimitIn, stored: bool
) -> None:
    """``409 limit_reached`` when ``rule`` (``stored`` already: counted) makes more than
    ``MAX_RECIPIENT_RULES`` recipient rules for the tenant."""
    if rule.scope != "recipient":
        return
    await hold_under_cap(
        conn, tenant_id=tenant_id, kind="recipient_rules", limit=MAX_RECIPIENT_RULES + int(stored),
        held=sa.select(sa.func.count()).select_from(_rules).where(
            _rules.c.tenant_id == tenant_id, _rules.c.scope == "recipient"
        ),
        message=f"A tenant may hold {MAX_RECIPIENT_RULES} recipient rules: each keeps a limiter entry per "
        "recipient for its period.",
    )  # fmt: skip


async def create_rule(
    *, engine: AsyncEngine, tenant_id: str, rule: RateLimitIn, max_rules: int = 100
) -> RateLimitOut:
    """Store a new rule for the tenant; enforced everywhere within a few seconds. ``422
    elastic_without_pacing`` for an elastic rule with no provider pacing to borrow from; ``409
    limit_reached`` when the tenant already holds ``max_rules``."""
    async with engine.begin() as conn:
        await hold_under_cap(
            conn, tenant_id=tenant_id, kind="rules", limit=max_rules,
            held=sa.select(sa.func.count()).select_from(_rules).where(_rules.c.tenant_id == tenant_id),
            message=f"A tenant may hold {max_rules} rate-limit rules; delete one first.",
        )  # fmt: skip
        await _hold_recipient_rules(conn, tenant_id=tenant_id, rule=rule, stored=False)
        await _require_pacing(conn, tenant_id=tenant_id, rule=rule)
        row = (
            await conn.execute(_rules.insert().values(tenant_id=tenant_id, **_values(rule)).returning(_rules))
        ).one()
    return RateLimitOut.model_validate(row, from_attributes=True)


async def list_rules(*, engine: AsyncEngine, tenant_id: str) -> list[RateLimitOut]:
    """The tenant's own rules, oldest first (enabled or not)."""
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                sa.select(_rules).where(_rules.c.tenant_id == tenant_id).order_by(_rules.c.created_at)
            )
        ).all()
    return [RateLimitOut.model_validate(r, from_attributes=True) for r in rows]


async def get_rule(*, engine: AsyncEngine, tenant_id: str, rule_id: UUID) -> RateLimitOut:
    """The rule; ``404 not_found`` when it does not exist or belongs to another tenant."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                sa.select(_rules).where(_rules.c.id == rule_id, _rules.c.tenant_id == tenant_id)
            )
        ).first()
    if row is None:
        raise _not_found(rule_id)
    return RateLimitOut.model_validate(row, from_attributes=True)


async def replace_rule(
    *, engine: AsyncEngine, tenant_id: str, rule_id: UUID, rule: RateLimitIn
) -> RateLimitOut:
    """Replace every field of the rule (its limiter state carries over); ``404`` if not the
    tenant's, ``422 elastic_without_pacing`` as for `create_rule`."""
    async with engine.begin() as conn:
        row = (
            await conn.execute(
                _rules.update()
                .where(_rules.c.id == rule_id, _rules.c.tenant_id == tenant_id)
                .values(**_values(rule), updated_at=sa.func.now())
                .returning(_rules)
            )
        ).first()
        if row is None:
            raise _not_found(rule_id)
        await _hold_recipient_rules(conn, tenant_id=tenant_id, rule=rule, stored=True)
        # after the update: a provider rule replaced by this one no longer paces anything
        await _require_pacing(conn, tenant_id=tenant_id, rule=rule)
    return RateLimitOut.model_validate(row, from_attributes=True)


async def delete_rule(*, engine: AsyncEngine, tenant_id: str, rule_id: UUID) -> None:
    """Delete the rule; ``404`` if it is not the tenant's."""
    async with engine.begin() as conn:
        result = await conn.execute(
            _rules.delete().where(_rules.c.id == rule_id, _rules.c.tenant_id == tenant_id)
        )
    if not result.rowcount:
        raise _not_found(rule_id)
