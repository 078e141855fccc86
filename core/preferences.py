"""Opt-out: a notification the user does not want is ``suppressed`` before it is rendered.

Resolution, most specific first (see :func:`decide`): the user's preference for this channel in
this category, then for the category on every channel, then for the channel in every category,
then for everything; failing all, the tenant's default for the category (opted in when the
category was never declared). A ``required`` category (security alerts, OTPs) is never suppressed
by an opt-out, whatever the priority: ``critical`` alone does not override an opt-out.

Preferences are read when the notification is claimed, so a change applies to every notification
not yet sent, also one waiting in ``delayed`` or ``retrying``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from uuid import UUID

import asyncpg

ANY = "*"


@dataclass(frozen=True, slots=True)
class CategoryRule:
    """A tenant's declared category (an undeclared one behaves as the defaults here)."""

    default_opted_in: bool = True
    required: bool = False
    email_quiet_hours: bool = False


@dataclass(frozen=True, slots=True)
class PreferenceDecision:
    opted_in: bool
    source: str  # which preference (or default) decided, for people reading the log


def decide(
    *, prefs: Mapping[tuple[str, str], bool], channel: str, category: str, rule: CategoryRule | None
) -> PreferenceDecision:
    """Whether the user wants ``channel`` messages in ``category``, and what decided it.

    ``prefs`` maps (channel or ``*``, category or ``*``) to opted in. Required categories are
    always opted in.
    """
    rule = rule or DEFAULT_RULE
    if rule.required:
        return PreferenceDecision(True, f"category '{category}' is required")
    for key, source in zip(_most_specific_first(channel, category), _SOURCES, strict=True):
        if key in prefs:
            return PreferenceDecision(
                prefs[key], "preference " + source.format(channel=channel, category=category)
            )
    state = "in" if rule.default_opted_in else "out"
    return PreferenceDecision(rule.default_opted_in, f"category '{category}' default (opted {state})")


def wanted(
    *, prefs: Mapping[tuple[str, str], bool], channel: str, category: str, rule: CategoryRule | None
) -> bool:
    """``decide(...).opted_in`` without saying what decided it: a preference page asks it of every
    category and channel at once (1,500 times for 500 categories)."""
    rule = rule or DEFAULT_RULE
    if rule.required:
        return True
    for key in _most_specific_first(channel, category):
        if key in prefs:
            return prefs[key]
    return rule.default_opted_in


DEFAULT_RULE = CategoryRule()
_SOURCES = (
    "channel={channel} category={category}",
    "category={category}",
    "channel={channel}",
    "all channels and categories",
)


def _most_specific_first(channel: str, category: str) -> tuple[tuple[str, str], ...]:
    return ((channel, category), (ANY, category), (channel, ANY), (ANY, ANY))


# An opt-out of a whole channel reported by the provider (a STOP reply, a hard bounce, a spam
# report) also closes that channel in every category the user had opted into: preferences resolve
# most specific first, so an earlier "orders by SMS" (or "orders on every channel") would otherwise
# outrank the STOP, and every such send would go to a number or address that refuses it.
OPT_OUT_SQL = """
INSERT INTO preferences (user_id, channel, category, opted_in)
SELECT $1, $2, c.category, false
  FROM (SELECT $3::text AS category
        UNION
        SELECT p.category FROM preferences p WHERE $3 = '*' AND p.user_id = $1 AND p.opted_in
           AND p.channel IN ($2, '*')) AS c
ON CONFLICT (user_id, channel, category) DO UPDATE SET opted_in = false, updated_at = now()
"""


async def record_opt_outs(*, conn: asyncpg.Connection, opt_outs: Sequence[tuple[UUID, str, str]]) -> None:
    """Record opt-outs a provider reported, each (user id, channel, category or ``*``), so that
    :func:`decide` finds them first (see ``OPT_OUT_SQL``)."""
    if opt_outs:
        await conn.executemany(OPT_OUT_SQL, list(opt_outs))
