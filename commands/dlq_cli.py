"""``clarion dlq list|redrive <channel>``: the dead-letter queue from a terminal.

Works on the log directly (``CLARION_DATABASE_URL``), across every tenant unless ``--tenant`` is
given. A redrive publishes to Kafka when ``CLARION_KAFKA_BOOTSTRAP`` is set; otherwise (or for
what the broker refuses) the relay publishes the re-queued notifications. Large redrives show a
progress bar on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime
from typing import TextIO

from api.dlq import RedriveFilter, list_dead, redrive
from clarion.inert import inert
from clarion.kafka import Publisher
from clarion.settings import Settings
from commands.terminal import json_line
from schema.db import create_engine
from schema.enums import Channel

BAR_WIDTH = 30


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``dlq`` on the ``clarion`` command."""
    p = sub.add_parser("dlq", help="dead-letter queue: list or redrive dead notifications")
    p.add_argument("action", choices=["list", "redrive"])
    p.add_argument("channel", choices=[c.value for c in Channel])
    p.add_argument("--tenant", help="only this tenant (default: every tenant)")
    p.add_argument("--error-code", help="only those whose last error has this code")
    p.add_argument("--provider", help="only those whose last attempt went to this provider")
    p.add_argument("--since", type=datetime.fromisoformat, help="died at or after (ISO 8601)")
    p.add_argument("--until", type=datetime.fromisoformat, help="died before (ISO 8601)")
    p.add_argument("--limit", type=int, default=50, help="list: how many (default 50)")
    p.add_argument("--json", action="store_true", help="list: one JSON object per line")


class ProgressBar:
    """``redrive [#####-----] 500/1000`` on one stderr line, redrawn in place."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream

    def __call__(self, done: int, total: int) -> None:
        filled = BAR_WIDTH if total == 0 else BAR_WIDTH * done // total
        self.stream.write(f"\rredrive [{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {done}/{total}")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def run(args: argparse.Namespace, settings: Settings) -> None:
    """Run ``clarion dlq ...``; prints the listing or the redrive summary on stdout."""
    match = RedriveFilter(
        error_code=args.error_code, provider=args.provider, since=args.since, until=args.until
    )
    channel = Channel(args.channel)

    async def work() -> None:
        engine = create_engine(settings.database_url, pool_size=1)
        publisher = Publisher(settings.kafka_bootstrap) if settings.kafka_bootstrap else None
        try:
            if args.action == "list":
                page = await list_dead(
                    engine=engine, tenant_id=args.tenant, channel=channel, match=match, limit=args.limit
                )
                for item in page.items:
                    # Tenants' ids and providers' answers: nothing in them may drive the terminal.
                    if args.json:
                        print(json_line(item.model_dump(mode="json")))
                    else:
                        print(
                            f"{item.id}  {item.dead_at:%Y-%m-%d %H:%M:%S}  attempts={item.attempts}"
                            f"  {inert(item.provider or '-')}  {inert(item.error.code or '-')}:"
                            f" {inert(item.error.message or '')}"
                        )
                if page.next_cursor is not None and not args.json:
                    print(f"... more (showing {len(page.items)}; use --limit)", file=sys.stderr)
                return
            bar = ProgressBar()
            try:
                result = await redrive(
                    engine=engine,
                    publisher=publisher,
                    tenant_id=args.tenant,
                    channel=channel,
                    match=match,
                    on_progress=bar,
                )
            finally:
                bar.close()
            print(json.dumps(result.model_dump()))
        finally:
            if publisher is not None:
                await publisher.close()
            await engine.dispose()

    asyncio.run(work())
