"""``clarion limits list|set|delete``: the operator's rate-limit rules, which apply to every tenant.

``clarion limits set per-tenant --scope tenant --limit 500 --period-s 1 --burst 100`` gives every
tenant its own budget of 500 sends a second at the API (429 past it), so one tenant's flood cannot
build a backlog that another's notifications wait behind. The same checks as a tenant's rules
(``api/rate_limits.py``); a bad rule ends the command with one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from pydantic import ValidationError

from api.global_rules import delete_global_rule, list_global_rules, set_global_rule
from api.rate_limits import RateLimitIn, RateLimitOut
from clarion.inert import inert
from clarion.settings import Settings
from commands.terminal import json_line
from schema.db import create_engine
from schema.enums import Channel


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``limits`` on the ``clarion`` command."""
    p = sub.add_parser("limits", help="the operator's rate-limit rules, for every tenant")
    actions = p.add_subparsers(dest="action", required=True)
    p_list = actions.add_parser("list", help="every global rule")
    p_list.add_argument("--json", action="store_true", help="one JSON object per line")
    p_set = actions.add_parser("set", help="create or replace the global rule NAME")
    p_set.add_argument("name")
    p_set.add_argument("--scope", required=True, choices=["tenant", "api_key", "recipient", "provider"])
    p_set.add_argument("--limit", required=True, type=int, help="events per period")
    p_set.add_argument("--period-s", required=True, type=float, help="the period, in seconds")
    p_set.add_argument("--burst", type=int, default=0, help="extra events allowed at once")
    p_set.add_argument("--channel", choices=[c.value for c in Channel])
    p_set.add_argument("--category")
    p_set.add_argument("--provider")
    p_set.add_argument("--mode", choices=["hard", "soft"], default="hard")
    p_set.add_argument("--overshoot-pct", type=float, default=0.0, help="soft mode: tolerated excess, %%")
    p_set.add_argument("--action", dest="rule_action", choices=["reject", "delay", "drop"])
    p_set.add_argument("--disabled", action="store_true", help="store it without enforcing it")
    p_delete = actions.add_parser("delete", help="delete the global rule NAME")
    p_delete.add_argument("name")


def _rule(args: argparse.Namespace) -> RateLimitIn:
    return RateLimitIn(
        name=args.name, scope=args.scope, limit=args.limit, period_s=args.period_s, burst=args.burst,
        channel=args.channel, category=args.category, provider=args.provider, mode=args.mode,
        overshoot_pct=args.overshoot_pct, action=args.rule_action, enabled=not args.disabled,
    )  # fmt: skip


def _line(r: RateLimitOut) -> str:
    """One rule as ``list`` prints it: name, scope, rate, what it applies to. A name stored before
    names were checked (`clarion.rule_names`) may hold any characters: shown inert."""
    where = " ".join(f"{k}={v}" for k in ("channel", "category", "provider") if (v := getattr(r, k)))
    rate = f"{r.limit}/{r.period_s:g}s burst={r.burst}"
    state = "" if r.enabled else "  (disabled)"
    return inert(f"{r.name}  {r.scope}  {rate} {r.mode} {r.action} {where}{state}".rstrip())


def run(args: argparse.Namespace, settings: Settings) -> None:
    """Run ``clarion limits ...``; what it did goes to stdout, a refusal to stderr (exit 1)."""
    try:
        rule = _rule(args) if args.action == "set" else None
    except ValidationError as exc:
        reasons = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        sys.exit(f"clarion limits set: {reasons}")

    async def work() -> None:
        engine = create_engine(settings.database_url, pool_size=1)
        try:
            if args.action == "list":
                for r in await list_global_rules(engine=engine):
                    print(json_line(r.model_dump(mode="json")) if args.json else _line(r))
            elif args.action == "set":
                assert rule is not None
                try:
                    stored, created = await set_global_rule(engine=engine, rule=rule)
                except ValueError as exc:
                    sys.exit(f"clarion limits set: {exc}")
                done = "created" if created else "replaced"
                print(f"{done} {stored.name}: {json.dumps(stored.model_dump(mode='json'))}")
            elif not await delete_global_rule(engine=engine, name=args.name):
                sys.exit(f"clarion limits delete: no global rule named '{args.name}'")
            else:
                print(f"deleted {args.name}")
        finally:
            await engine.dispose()

    asyncio.run(work())
