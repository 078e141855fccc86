"""The hash a repeat is judged by does not change under stored keys (``api/submission.py``).

A repeat of an ``event_id`` answers 200 when its hash equals the one stored at first use and 409
``event_id_conflict`` when it does not, for as long as the key is kept. An upgrade that changed
the canonical form would turn every repeat of a send accepted before it into a 409.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel

from api import submission
from api.models import NotificationIn
from api.submission import UNHASHED_WHEN_UNSET, request_hash

# Every field in the canonical form, by dotted path (``[]``: inside each item of a list). A field
# added to NotificationIn or a model inside it goes into UNHASHED_WHEN_UNSET as well as here.
HASHED_FIELDS = frozenset(
    {
        "event_id", "user", "user_id", "channel", "category", "priority", "template",
        "template_version", "content", "data", "send_at", "expires_at",
        "user.id", "user.email", "user.phone", "user.devices", "user.locale", "user.timezone",
        "user.devices[].platform", "user.devices[].token",
        "content.subject", "content.title", "content.body", "content.html",
    }
)  # fmt: skip
# Printed by the request_hash of 2026-11-28 (before UNHASHED_WHEN_UNSET existed) for these bodies.
FULL = {
    "event_id": "order-123-shipped",
    "user": {
        "id": "u-1",
        "email": "ada@example.com",
        "phone": "+14155550100",
        "locale": "en",
        "devices": [{"platform": "fcm", "token": "f" * 40}],
    },
    "channel": "email",
    "category": "orders",
    "priority": "high",
    "template": "order_shipped",
    "data": {"order_id": "123", "items": [1, 2.5, None, True]},
    "send_at": "2026-11-28T10:00:00Z",
}
FULL_HASH = "4020f66753b14a49979c3a5f6a0a66c67ef79736913c74d72074d5d137dee28e"
SHORT = {"event_id": "e", "user_id": "u", "channel": "sms", "content": {"body": "hi"}}
SHORT_HASH = "764bdc1b89ad8c3cc531964db4adb322c84f2b1d7ec58bbe0b38cc00a67e381f"


def models_in(annotation: Any, listed: bool = False) -> Iterator[tuple[type[BaseModel], bool]]:
    """The models an annotation holds (``X | None``, ``list[X]``...), each with whether it sits
    inside a list."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, listed
    for arg in get_args(annotation):
        yield from models_in(arg, listed or get_origin(annotation) is list)


def field_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    """The dotted paths of ``model``'s fields and of the models' inside them."""
    paths: set[str] = set()
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.add(path)
        for inner, listed in models_in(info.annotation):
            paths |= field_paths(inner, f"{path}{'[]' if listed else ''}.")
    return paths


def test_the_fields_hashed_are_the_pinned_ones() -> None:
    new = field_paths(NotificationIn) - HASHED_FIELDS
    assert not new - UNHASHED_WHEN_UNSET, (
        f"{sorted(new)} would change every stored request hash: add them to "
        "api.submission.UNHASHED_WHEN_UNSET (and to HASHED_FIELDS here)"
    )
    assert HASHED_FIELDS <= field_paths(NotificationIn), "a hashed field went away: old repeats get 409"


@pytest.mark.parametrize(("body", "expected"), [(FULL, FULL_HASH), (SHORT, SHORT_HASH)])
def test_the_hash_of_a_request_stays_the_same(body: dict[str, Any], expected: str) -> None:
    assert request_hash(NotificationIn.model_validate(body)) == expected


def canonical_hash(form: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(form, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_a_later_field_is_hashed_only_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Today's ``expires_at`` (top level) and ``user.timezone`` (inside the user) stand in for fields
    added later: left unset they are not in the form at all, as if the model had never had them;
    set, they are hashed."""
    monkeypatch.setattr(submission, "UNHASHED_WHEN_UNSET", frozenset({"expires_at", "user.timezone"}))
    form = NotificationIn.model_validate(FULL).model_dump(mode="json")
    assert form["expires_at"] is None and form["user"]["timezone"] is None
    del form["expires_at"], form["user"]["timezone"]
    assert request_hash(NotificationIn.model_validate(FULL)) == canonical_hash(form)

    later = {**FULL, "expires_at": "2026-12-01T00:00:00Z"}
    form = NotificationIn.model_validate(later).model_dump(mode="json")
    del form["user"]["timezone"]
    assert request_hash(NotificationIn.model_validate(later)) == canonical_hash(form)
    assert "expires_at" in form
