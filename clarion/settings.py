"""One settings tree for every process (env prefix ``CLARION_``, nesting with ``__``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from clarion.retry_settings import RetrySettings
from clarion.webhook_settings import WebhookSettings, split_commas
from providers.settings import ProvidersSettings

PLACEHOLDER_SECRET = "dev-insecure-secret-change-me"


class Settings(WebhookSettings):
    """Every process's settings; the webhooks' are in ``clarion.webhook_settings``."""

    model_config = SettingsConfigDict(env_prefix="CLARION_", env_nested_delimiter="__", extra="ignore")

    env: Literal["dev", "test", "prod"] = Field(
        default="prod",
        description=(
            "Deployment kind. `prod` (the default for every command but `clarion dev`, which runs as "
            "`dev`) refuses an empty or placeholder secret and keeps the sandbox routes and an "
            "unauthenticated /metrics off; `test` is for the test suite."
        ),
    )
    database_url: str = Field(
        default="postgresql+asyncpg://postgres@127.0.0.1:5432/clarion",
        description="SQLAlchemy URL of the PostgreSQL notification log (asyncpg driver).",
    )
    db_pool_size: int = Field(default=10, ge=1, description="Connections per process in the DB pool.")
    migration_lock_timeout_s: float = Field(
        default=5.0,
        ge=0,
        description=(
            "Longest a migration (`clarion db upgrade`, `clarion dev`) waits for each table lock before it "
            "fails, rolled back, to be run again: waiting behind a long transaction, it would hold every "
            "send queued behind it. 0 waits for ever."
        ),
    )
    kafka_bootstrap: str | None = Field(
        default=None,
        description="Kafka bootstrap servers (host:port,...). Unset in `clarion dev`: the bundled Tansu broker starts.",
    )
    topic_partitions: int = Field(
        default=4,
        ge=1,
        description="Partitions per topic when Clarion creates topics; bounds worker parallelism.",
    )
    redis_url: str | None = Field(
        default=None,
        description="Redis URL for the shared rate limiter and content dedupe; unset uses an in-process limiter "
        "(single process only). `redis+cluster://host:port` (or `rediss+cluster://`, naming any node) runs both "
        "on Redis Cluster; the key prefix must then contain no braces.",
    )
    redis_key_prefix: str = Field(
        default="clarion:",
        min_length=1,
        max_length=64,
        description="Prefix of every Redis key Clarion writes (rate limits, content dedupe): lets "
        "several deployments, or a test run, share one Redis.",
    )
    api_host: str = Field(default="127.0.0.1", description="Interface the API listens on.")
    api_port: int = Field(default=8000, description="Port the API listens on.")
    public_url: str | None = Field(
        default=None,
        description="Public base URL of the API, used in unsubscribe links; defaults to http://api_host:api_port.",
    )
    dev_api_key: SecretStr | None = Field(
        default=None, description="API key `clarion dev` gives the dev tenant (a random one when unset)."
    )
    secret_key: SecretStr = Field(
        default=SecretStr(PLACEHOLDER_SECRET),
        description="HMAC secret for preference/unsubscribe tokens. Must be set outside dev.",
    )
    previous_secret_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Earlier CLARION_SECRET_KEY values (comma-separated) whose preference/unsubscribe tokens are still honoured after a rotation.",
    )
    preference_token_ttl_s: float = Field(
        default=60 * 24 * 3600,
        gt=0,
        description="How long an unsubscribe or preference-page token stays valid, in seconds.",
    )
    engagement_token_ttl_s: float = Field(
        default=30 * 24 * 3600,
        gt=0,
        description="How long the token a push carries (data key `clarion_event_token`) lets the device "
        "report opens and clicks of that push, in seconds.",
    )
    max_body_bytes: int = Field(
        default=65536,
        ge=1024,
        description="Largest accepted request body, in bytes. Whatever its size, a send (a batch item "
        "too) holds at most 32,768 JSON values (`api.models.MAX_VALUES`).",
    )
    max_batch_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        description="Largest accepted body of POST /v1/notifications/batch, in bytes.",
    )
    max_claims: int = Field(
        default=5,
        ge=1,
        le=1000,
        description=(
            "Claims a notification may take without its outcome being recorded (a worker dying on "
            "it each time) before it goes `dead` to the DLQ instead of being retried forever."
        ),
    )
    max_render_deferrals: int = Field(
        default=200,
        ge=1,
        le=1000,
        description=(
            "Times a worker may defer a notification because its tenant's earlier renders still "
            "hold the render turn (`render_deferred`, each at most 5 minutes ahead: 200 is about 16 hours of "
            "deferrals) before it goes `dead` to the DLQ (`render_deferred_too_often`) instead of being claimed and recorded "
            "again for as long as the tenant's renders stay slow."
        ),
    )
    lease_s: float = Field(
        default=30.0,
        gt=0,
        description="How long a worker's claim on a notification lasts before another may take it.",
    )
    relay_interval_s: float = Field(
        default=1.0, gt=0, description="How often the outbox relay scans the log."
    )
    relay_grace_s: float = Field(
        default=3.0,
        gt=0,
        description="Age after which an accepted-but-unpublished notification is republished by the relay.",
    )
    relay_stale_queued_s: float = Field(
        default=60.0,
        gt=0,
        description="Age after which a queued notification is republished (covers a broker that lost its data).",
    )
    retention_days: int = Field(
        default=30,
        ge=1,
        le=3650,
        description="Days of the notification log (notifications, attempts, sandbox messages, event ids) "
        "kept: older days are dropped whole, except a day still holding a send not yet final. An "
        "event id is recognised as a repeat for at least this many days (its week's keys go together: up to 6 "
        "days more).",
    )
    partition_days_ahead: int = Field(
        default=7,
        ge=2,
        le=90,
        description="Days of log partitions created ahead of today by the maintenance loop "
        "(in the relay, and `clarion maintain`).",
    )
    maintenance_interval_s: float = Field(
        default=3600.0,
        gt=0,
        description="How often the relay runs the log's maintenance (partitions ahead, retention).",
    )
    log_step_pause_s: float = Field(
        default=0.5,
        ge=0,
        le=60,
        description="Pause between two of the log maintenance's detaches or drops: a day's removal is "
        "spread out, so that no send is slowed by two of them (each slows the sends in flight beside it "
        "a little); about ten pauses a day.",
    )
    worker_batch_size: int = Field(default=500, ge=1, description="Kafka records a worker takes per batch.")
    worker_concurrency: int = Field(default=64, ge=1, description="Provider calls a worker runs at once.")
    worker_record_every_ms: int = Field(
        default=50,
        ge=10,
        le=10_000,
        description="How often a worker records the outcomes its batch has reached so far, in ms: a worker killed mid-batch makes again (after the lease) only the provider calls of about this long and of the record in progress. A batch done sooner is one record.",
    )
    worker_bulk_chunk: int = Field(
        default=32,
        ge=1,
        description="Bulk-lane notifications a worker delivers between checks for main-lane work: an urgent send shares the worker with at most one such chunk.",
    )
    worker_bulk_yield_max_s: float = Field(
        default=2.0,
        gt=0,
        description="Longest a bulk chunk waits for the main lane to go idle before it runs anyway, in seconds (bulk keeps moving under endless urgent traffic).",
    )
    worker_fetch_wait_ms: int = Field(
        default=20,
        ge=1,
        le=500,
        description="Longest the main lane's consumer waits on an empty fetch or between empty polls, in ms: a floor on an urgent send's pickup time on brokers that hold empty fetches (Tansu). The bulk and retry lanes keep Kafka's default 500 ms.",
    )
    sandbox_routes: bool | None = Field(
        default=None, description="Serve GET /v1/sandbox/messages (default: on in dev and test, off in prod)."
    )
    log_level: str = Field(default="INFO", description="Log level of every process.")
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port on which `clarion worker` and `clarion relay` serve Prometheus /metrics (unset or 0: off; the API serves /metrics on its own port).",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="Bearer token a Prometheus scraper sends for the API's /metrics, whose series name every tenant (unset: /metrics answers 404, except under `clarion dev`, where it is open).",
    )
    max_rules_per_tenant: int = Field(
        default=100,
        ge=1,
        le=100_000,
        description="Rate-limit rules one tenant may hold (every process loads every tenant's rules every 2 s).",
    )
    max_templates_per_tenant: int = Field(
        default=500,
        ge=1,
        le=1_000_000,
        description="Template versions one tenant may hold, all names, channels and locales together.",
    )
    max_categories_per_tenant: int = Field(
        default=1_000,
        ge=1,
        le=100_000,
        description="Notification categories one tenant may declare (a preference page and its API list every one).",
    )
    max_api_keys_per_tenant: int = Field(
        default=100, ge=1, le=10_000, description="API keys one tenant may hold unrevoked."
    )
    api_head_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="Time a client has to send a request's head, from its first byte (or the connection opening); past it the API answers 408 and closes the connection.",
    )
    api_body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="Time a client has to send a request's body once its head arrived; past it the API closes the connection.",
    )
    search_concurrency_per_tenant: int = Field(
        default=2,
        ge=1,
        le=1_000,
        description="Searches of the log (GET /v1/notifications, GET /v1/ops/dlq/{channel}) one tenant may run at once, counted across every API process on the database; more are answered 429 too_many_searches.",
    )
    search_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="PostgreSQL time one search of the log may take before it is stopped and answered 422 search_too_broad.",
    )
    preference_requests_per_tenant: int = Field(
        default=2,
        ge=1,
        le=1_000,
        description="Preference reads and writes by API key (GET/PUT /v1/users/{id}/preferences) one tenant may run at once in one API process (all tenants' together at most half of CLARION_DB_POOL_SIZE); more wait up to 2 s for a turn, then are answered 429 preferences_busy.",
    )
    render_box_at_start: bool = Field(
        default=True,
        description="Start the API's render box (the child process that renders for tenants past their render CPU share) with the API rather than on first use, so its start-up does not land in the middle of a template attack.",
    )
    operator_token: SecretStr | None = Field(
        default=None,
        description="Bearer token of the platform operator: cluster-wide figures (Kafka offsets and lag, every tenant's queues) at /v1/ops/cluster/queues. No tenant key opens them (unset: 404).",
    )
    providers: ProvidersSettings = Field(default_factory=ProvidersSettings, description="Provider accounts.")
    retry: RetrySettings = Field(
        default_factory=RetrySettings,
        description="Provider retries (in-process and via the retry topic), attempt limits, circuit breakers.",
    )

    @field_validator("metrics_token", "operator_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: object) -> object:
        # CLARION_METRICS_TOKEN= (empty) must not become a token that an empty bearer matches.
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return value

    @field_validator("previous_secret_keys", mode="before")
    @classmethod
    def _split_secret_keys(cls, value: object) -> object:
        return split_commas(value)

    @model_validator(mode="after")
    def _refuse_placeholders_in_prod(self) -> Settings:
        if self.env != "prod":
            return self
        if self.secret_key.get_secret_value().strip() in ("", PLACEHOLDER_SECRET):
            raise ValueError(
                "CLARION_SECRET_KEY must be set to a real secret (only `clarion dev` runs without one)"
            )
        if any(k.get_secret_value().strip() in ("", PLACEHOLDER_SECRET) for k in self.previous_secret_keys):
            raise ValueError("CLARION_PREVIOUS_SECRET_KEYS may not hold an empty or placeholder secret")
        return self

    @model_validator(mode="after")
    def _twilio_status_callback_url(self) -> Settings:
        twilio = self.providers.twilio.with_status_callback(self.base_url)
        if twilio is not self.providers.twilio:
            self.providers = self.providers.model_copy(update={"twilio": twilio})
        return self

    @property
    def base_url(self) -> str:
        return self.public_url or f"http://{self.api_host}:{self.api_port}"

    @property
    def sandbox_enabled(self) -> bool:
        return self.sandbox_routes if self.sandbox_routes is not None else self.env != "prod"
