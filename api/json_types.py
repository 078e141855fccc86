"""Field types that accept what their JSON Schema says and nothing more.

Pydantic's lax mode takes ``true`` and ``"5"`` for an integer and a Unix timestamp (``0.5``) for a
date-time; the OpenAPI document says ``integer`` and ``date-time``, so such values are refused
(schemathesis's negative checks found both accepted). Pydantic's strict mode goes too far the other
way: it refuses ``5.0``, which JSON Schema counts as an integer, and any string for a date-time in
a query parameter.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from pydantic import AwareDatetime, BeforeValidator

_NUMBER = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*")


def _json_number(value: Any) -> Any:
    if isinstance(value, (bool, str, bytes)):
        raise ValueError("must be a JSON number, not a string or a boolean")
    return value


def _iso_text(value: Any) -> Any:
    if isinstance(value, (bool, int, float)) or (isinstance(value, str) and _NUMBER.fullmatch(value)):
        raise ValueError("must be an ISO 8601 date-time like 2030-01-01T00:00:00Z, not a number")
    return value


JSON_NUMBER = BeforeValidator(_json_number)
# Constraints go before JSON_NUMBER inside an Optional (``Annotated[int, Field(ge=1), JSON_NUMBER] |
# None``): after it, pydantic writes them into the document as unknown keywords ("ge") instead of
# "minimum".
JsonInt = Annotated[int, JSON_NUMBER]
IsoDatetime = Annotated[datetime, BeforeValidator(_iso_text)]
IsoAwareDatetime = Annotated[AwareDatetime, BeforeValidator(_iso_text)]
