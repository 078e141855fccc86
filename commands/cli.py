"""The ``clarion`` command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from pydantic import ValidationError

from clarion import tracing
from clarion.logs import setup_logging
from clarion.settings import Settings
from commands import dlq_cli, limits_cli
from schema.enums import Channel


def _settings(*, dev: bool = False, **overrides: object) -> Settings:
    """The settings from the environment; ``dev`` (``clarion dev``) runs as ``CLARION_ENV=dev``
    unless the environment says otherwise. Bad settings end the command with one line each."""
    try:
        settings = Settings(env="dev") if dev and "CLARION_ENV" not in os.environ else Settings()
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            where = ".".join(str(part) for part in error["loc"])
            message = str(error["msg"]).removeprefix("Value error, ")
            print(f"clarion: {where + ': ' if where else ''}{message}", file=sys.stderr)
        raise SystemExit(2) from None
    return settings.model_copy(update={k: v for k, v in overrides.items() if v is not None})


def _need_bootstrap(settings: Settings) -> None:
    if not settings.kafka_bootstrap:
        print("clarion: set CLARION_KAFKA_BOOTSTRAP (host:port of a Kafka broker)", file=sys.stderr)
        raise SystemExit(2)


def _run(main: Callable[[], Awaitable[object]]) -> None:
    """Run ``main`` on uvloop where it is installed: its transports and loop are C, and every
    Clarion process spends much of its CPU on socket I/O (HTTP, PostgreSQL, Kafka)."""
    try:
        import uvloop

        run: Callable[[Any], object] = uvloop.run
    except ImportError:  # not on Windows: the standard loop serves
        run = asyncio.run
    # Every send allocates short-lived containers (a render's Jinja contexts, pydantic models,
    # asyncpg records) that live as long as its batch: at Python's default threshold of 700 the
    # young generation was collected every few sends. Counted with gc.callbacks in a 20 s bench.e2e
    # run (2026-11-28): the worker made 3,905 young, 354 middle and 31 full collections, 1.5 s in
    # all, the longest full one 161 ms (a stall for both lanes, and most of a render's 200 ms CPU
    # budget); the API 3,394 / 308 / 27, 0.7 s. At 20,000: the worker 8 young collections, 40 ms
    # in all, the longest 6.8 ms; the API one. Two A/B/B/A sets of bench.e2e: worker CPU per
    # notification -12%, API -3%, whole machine -4%. Start-up's objects stay frozen (gc.freeze in
    # commands/runner.py and workers/app.py); only the young generation's threshold changes.
    gc.set_threshold(20_000, 10, 10)
    try:
        run(main())
    except KeyboardInterrupt:
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="clarion", description="Clarion notification delivery platform.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_dev = sub.add_parser(
        "dev", help="run everything in one process: broker, migrations, API, workers, relay"
    )
    p_dev.add_argument("--port", type=int, help="API port (default 8000)")
    p_dev.add_argument("--host", help="API interface (default 127.0.0.1)")
    p_api = sub.add_parser("api", help="serve the HTTP API")
    p_api.add_argument("--port", type=int)
    p_api.add_argument("--host")
    p_api.add_argument(
        "--workers", type=int, default=1, help="API processes sharing the port (SO_REUSEPORT); default 1"
    )
    p_api.add_argument(
        "--reuse-port",
        action="store_true",
        help="bind with SO_REUSEPORT, as one of several processes on the port (what --workers starts)",
    )
    p_worker = sub.add_parser("worker", help="run one channel's worker")
    p_worker.add_argument("channel", choices=[c.value for c in Channel])
    sub.add_parser("relay", help="run the outbox relay")
    sub.add_parser("webhooks", help="send tenants' outbound webhooks (needs only the database)")
    p_db = sub.add_parser("db", help="database schema")
    p_db.add_argument("action", choices=["upgrade"])
    sub.add_parser(
        "maintain",
        help="the notification log's upkeep once, for cron: partitions ahead, expired days dropped "
        "(the relay also runs it hourly)",
    )
    p_topics = sub.add_parser("topics", help="Kafka topics")
    p_topics.add_argument("action", choices=["create"])
    p_keys = sub.add_parser("keys", help="API keys")
    p_keys.add_argument("action", choices=["create", "revoke"])
    p_keys.add_argument("--tenant", help="tenant id (created if missing)")
    p_keys.add_argument("--scopes", default="send,read", help="comma-separated: send,read,admin,preferences")
    p_keys.add_argument("--key-id", help="key id to revoke")
    p_keys.add_argument(
        "--no-templates",
        action="store_true",
        help="create: do not install the shipped templates (templates/) for the tenant",
    )
    dlq_cli.add_parser(sub)
    limits_cli.add_parser(sub)
    p_status = sub.add_parser("status", help="queue depth, lag and statuses of a running Clarion, as tables")
    p_status.add_argument("--url", help="API base URL (default: CLARION_PUBLIC_URL, or api_host:api_port)")
    p_status.add_argument("--api-key", help="an API key with the admin scope (default: $CLARION_API_KEY)")
    args = parser.parse_args(argv)

    if args.command == "status":
        from clarion import status

        raise SystemExit(status.main(url=args.url or _settings(dev=True).base_url, api_key=args.api_key))

    if args.command == "api" and args.workers != 1:
        _api_workers(args)

    from commands import runner

    if args.command == "dev":
        settings = _settings(dev=True, api_port=args.port, api_host=args.host)
        _check_dev_key(settings)
        setup_logging(settings.log_level)
        with traced("clarion"):
            _run(lambda: runner.dev(settings))
        return
    settings = _settings(api_port=getattr(args, "port", None), api_host=getattr(args, "host", None))
    setup_logging(settings.log_level)
    if args.command == "db":
        from schema.db import MigrationLockTimeout

        try:
            _run(lambda: runner.prepare_database(settings))
        except MigrationLockTimeout as exc:  # exit 1, one line: the orchestrator runs it again
            raise SystemExit(f"clarion db upgrade: {exc}") from None
        print("database is at the newest schema")
    elif args.command == "maintain":
        _run(lambda: _maintain(settings))
    elif args.command == "topics":
        _need_bootstrap(settings)
        from clarion.kafka import create_topics

        _run(lambda: create_topics(settings.kafka_bootstrap or "", partitions=settings.topic_partitions))
        print("topics ready")
    elif args.command == "keys":
        _keys(args, settings)
    elif args.command == "dlq":
        dlq_cli.run(args, settings)
    elif args.command == "limits":
        limits_cli.run(args, settings)
    elif args.command == "webhooks":
        _run(lambda: runner.until_signal(lambda stop: runner.run_webhooks(settings, stop)))
    else:
        _need_bootstrap(settings)
        if args.command == "api":
            reuse = args.reuse_port
            with traced("clarion-api"):
                _run(
                    lambda: runner.until_signal(
                        lambda stop: runner.serve_api(settings, stop, reuse_port=reuse)
                    )
                )
        elif args.command == "worker":
            channels = [Channel(args.channel)]
            with traced(f"clarion-worker-{args.channel}"):
                _run(lambda: runner.until_signal(lambda stop: runner.run_workers(settings, channels, stop)))
        else:
            _run(lambda: runner.until_signal(lambda stop: runner.run_relay(settings, stop)))


def _api_workers(args: argparse.Namespace) -> None:
    """Supervise ``--workers`` API processes (``commands.api_workers``); never returns."""
    from commands import api_workers

    if args.workers < 1 or args.reuse_port:
        print("clarion: --workers takes a count of at least 1, without --reuse-port", file=sys.stderr)
        raise SystemExit(2)
    settings = _settings(api_port=args.port, api_host=args.host)
    setup_logging(settings.log_level)
    _need_bootstrap(settings)
    raise SystemExit(api_workers.run(host=settings.api_host, port=settings.api_port, workers=args.workers))


@contextlib.contextmanager
def traced(service: str) -> Iterator[None]:
    """Traces for the block when the ``OTEL_*`` environment asks for them (``clarion.tracing``);
    what is still buffered is exported when the process stops."""
    if not tracing.configure(service=service):
        yield
        return
    logging.getLogger(__name__).info("exporting traces as %s", service)
    try:
        yield
    finally:
        tracing.shutdown()


async def _maintain(settings: Settings) -> None:
    from commands import runner

    report = await runner.maintain_once(settings)
    print(
        f"created {len(report.created)} partition(s), dropped {len(report.dropped)}; days ahead: "
        + ", ".join(f"{t} {n}" for t, n in report.days_ahead.items())
    )
    if any(report.default_rows.values()):
        print("rows in default partitions: " + ", ".join(f"{t} {n}" for t, n in report.default_rows.items()))


def _check_dev_key(settings: Settings) -> None:
    """A ``CLARION_DEV_API_KEY`` that is not ``clk_<id>_<secret>`` ends ``clarion dev`` with one line."""
    from clarion.tenants import split_key

    key = settings.dev_api_key.get_secret_value() if settings.dev_api_key else None
    if key is not None and (split_key(key) is None or not key.isascii() or any(c.isspace() for c in key)):
        print(
            "clarion: CLARION_DEV_API_KEY must read clk_<id>_<secret> (like clk_dev_s3cret; at most"
            " 200 characters, no spaces), or be unset to get a fresh key",
            file=sys.stderr,
        )
        raise SystemExit(2)


def _keys(args: argparse.Namespace, settings: Settings) -> None:
    from clarion.printable_ids import unprintable
    from clarion.tenants import create_api_key, ensure_tenant, revoke_api_key
    from core.templates import install_default_templates
    from schema.db import create_engine

    async def work() -> None:
        engine = create_engine(settings.database_url, pool_size=1)
        try:
            async with engine.begin() as conn:
                if args.action == "create":
                    if not args.tenant:
                        raise SystemExit("clarion: keys create needs --tenant")
                    created = await ensure_tenant(conn, tenant_id=args.tenant)
                    # Rolled back: a tenant stored before ids were checked still gets keys.
                    problem = unprintable(args.tenant)
                    if created and problem is not None:
                        raise SystemExit(f"clarion: --tenant {problem}")
                    # The shipped templates (order_shipped, welcome...), so the README's first send
                    # works for this tenant as it does under clarion dev. Idempotent; a template the
                    # tenant changed stays the active one.
                    installed = 0
                    if not args.no_templates:
                        installed = await install_default_templates(conn=conn, tenant_id=args.tenant)
                    scopes = tuple(s.strip() for s in args.scopes.split(",") if s.strip())
                    try:
                        print(await create_api_key(conn, tenant_id=args.tenant, scopes=scopes))
                    except ValueError as exc:
                        raise SystemExit(f"clarion: {exc}") from None
                    if installed:  # stderr: stdout stays the key alone, for KEY=$(clarion keys create ...)
                        print(f"installed {installed} shipped templates for {args.tenant}", file=sys.stderr)
                else:
                    if not args.key_id:
                        raise SystemExit("clarion: keys revoke needs --key-id")
                    if not await revoke_api_key(conn, key_id=args.key_id):
                        raise SystemExit(f"clarion: no active key {args.key_id}")
                    print(f"revoked {args.key_id}")
        finally:
            await engine.dispose()

    asyncio.run(work())


if __name__ == "__main__":
    main()
