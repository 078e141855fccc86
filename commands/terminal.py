"""Tenant values and provider answers printed on an operator's terminal as JSON lines, made inert.

A text listing shows each value through `clarion.inert.inert`. A JSON line must give a reader the
values themselves, and JSON writes C1 controls and bidi overrides raw: they are written as JSON's
own ``\\uXXXX`` escapes instead.
"""

from __future__ import annotations

import json
from typing import Any


def json_line(value: Any) -> str:
    """``value`` as one JSON line of ASCII only: controls, C1 and bidi characters as ``\\uXXXX``
    escapes (the value a JSON reader gets back is unchanged)."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))
