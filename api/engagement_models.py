"""Request and response bodies of engagement: what a tenant's backend or a device reports, and the
rows ``GET /v1/notifications/{id}`` shows."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from clarion.engagement_tokens import MAX_TOKEN_CHARS
from core.engagement import MAX_LINK_BYTES
from schema.enums import EngagementType

# An absolute URI (any scheme: an app's deep link too) in printable ASCII, as RFC 3986 writes it:
# an international address is percent-encoded first. ASCII keeps a link's bytes = its characters.
LINK = r"^[A-Za-z][A-Za-z0-9+.\-]*:[\x21-\x7E]+$"


class ReportedType(StrEnum):
    """What a tenant's backend or a device may report (the rest come from the providers)."""

    opened = "opened"
    clicked = "clicked"


class EngagementIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: ReportedType
    link: str | None = Field(
        default=None,
        min_length=3,
        max_length=MAX_LINK_BYTES,
        pattern=LINK,
        description="the URL clicked (only with `clicked`): an absolute URI in printable ASCII",
    )
    occurred_at: AwareDatetime | None = Field(
        default=None,
        strict=True,  # a date-time text, as documented: not a number of seconds
        description="when it happened (default: now); kept between the send's creation and now. "
        "The same type, link and occurred_at again is the same event: counted once",
    )

    @field_validator("occurred_at")
    @classmethod
    def _a_utc_time(cls, value: datetime | None) -> datetime | None:
        try:  # 0001-01-01T00:00:00+05:00 is a valid text, but before the first UTC time there is
            return None if value is None else value.astimezone(UTC)
        except OverflowError:
            raise ValueError("'occurred_at' lies outside the years 1 to 9999 in UTC") from None

    @model_validator(mode="after")
    def _link_only_with_clicked(self) -> EngagementIn:
        if self.link is not None and self.type is not ReportedType.clicked:
            raise ValueError("'link' goes only with type 'clicked'")
        return self


class DeviceEngagementIn(EngagementIn):
    token: str = Field(
        min_length=1,
        max_length=MAX_TOKEN_CHARS,
        description="the push's `clarion_event_token` data value",
    )


class EngagementOut(BaseModel):
    type: EngagementType
    link: str | None = Field(description="the URL, for `clicked`")
    first_at: datetime
    last_at: datetime
    count: int = Field(description="events counted (a provider's replay is not)")
    source: str = Field(description="who reported it first: twilio, sendgrid, api or device")


class EngagementRecorded(EngagementOut):
    notification_id: UUID
    duplicate: bool = Field(description="true when this report was already counted (nothing changed)")
