"""Which screens and gates a channel worker runs, in order (see ``workers.steps``).

Each rule module contributes its step here; the pipeline itself never changes for a new rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg

from clarion.settings import Settings
from schema.enums import Channel
from workers.steps import Gate, Row, Screen


@dataclass
class Steps:
    screens: list[Screen] = field(default_factory=list)
    gates: list[Gate] = field(default_factory=list)
    unsubscribe_url: Callable[[Row], str | None] | None = None


def build_steps(*, settings: Settings, channel: Channel, pool: asyncpg.Pool) -> Steps:
    """The steps for ``channel``: screens run on the claimed batch, gates per notification."""
    return Steps()
