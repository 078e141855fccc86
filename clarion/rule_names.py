"""What a rate-limit rule may be called, and what every process calls a stored rule.

A rule's name is chosen by whoever writes the rule (a tenant through ``/v1/rate-limits``, the
operator through ``clarion limits set``), and it travels: into the 429 or 422 a send or a redrive
gets (``api/ingress.py``, ``api/routes/dlq.py``), into the reason the history of a held, dropped or
throttled notification gives (``workers/throttle.py``, ``api/relay.py``), which
``GET /v1/notifications/{id}``, ``/ops`` and ``clarion dlq list`` show, and, for an operator's rule,
into the ``rule`` label of ``clarion_ratelimit_decisions_total`` (a tenant's rules are labelled by
their scope, `clarion.rules.RuleSpec.metric_label`, so a tenant's names never reach a label).

Until 2026-11-28 the API took any 128 characters: an escape sequence, a bidi override, a newline
went into all of those as they came. A name is now ``NAME_PATTERN``: 1 to 64 letters, digits,
``_``, ``.`` and ``-``, starting with a letter or a digit; or empty, and the rule is then called by
its id. Limiter keys are built from rule ids, never from names, so a ``:`` in a name could not
collide with a key; it is left out all the same, as it separates a key's parts.

A rule stored before that under a name outside the pattern is kept and enforced as it was: it is
only called by its id (`rule_label`) wherever a name would be shown. ``GET /v1/rate-limits`` answers
the name as stored; replacing the rule takes a name that passes.
"""

from __future__ import annotations

import re

MAX_NAME_CHARS = 64
NAME_PATTERN = r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,63})?$"
"""The names the API and ``clarion limits set`` take (pydantic's Rust regex: ``$`` is the end)."""
NAME_RULE = (
    "up to 64 letters, digits, '_', '.' and '-', starting with a letter or a digit; "
    "empty: the rule is called by its id"
)

_NAME = re.compile(NAME_PATTERN)


def is_safe_name(name: str) -> bool:
    """Whether ``name`` matches ``NAME_PATTERN`` (a trailing newline does not)."""
    return _NAME.fullmatch(name) is not None


def rule_label(*, name: str, rule_id: object) -> str:
    """What a rule is called wherever it is shown: its name when it has a safe one, else its id."""
    return name if name and is_safe_name(name) else str(rule_id)
