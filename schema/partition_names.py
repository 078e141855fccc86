"""What a partition is called, and which tables Alembic leaves out because they are partitions.

A child of ``<parent>`` is ``<parent>_pYYYYMMDD`` after its first day, or ``<parent>_default``.
Errors: ``ValueError`` for a name that is not a plain SQL identifier (identifiers are never tenant
input, and are checked before they are put into SQL).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


def ident(name: str) -> str:
    if not _IDENT.match(name):
        raise ValueError(f"not a plain identifier: {name!r}")
    return name


_CHILD = re.compile(r"^[a-z_][a-z0-9_]{0,40}_(default|p\d{8})$")


def include_name(name: str | None, type_: str, _parent: object = None) -> bool:
    """Alembic's ``include_name``: a day or default partition is operational state, not schema
    (the models describe the parent), so migrations and their tests leave it out."""
    return not (type_ == "table" and name is not None and _CHILD.match(name))


def include_object(obj: Any, _name: str | None, type_: str, reflected: bool, _compare_to: object) -> bool:
    """Alembic's ``include_object``: PostgreSQL adds, for a foreign key to a partitioned table, one
    per partition of it (``engagement`` -> ``notifications_p20261125``...); the models name the
    parent's only."""
    if type_ == "foreign_key_constraint" and reflected:
        return not _CHILD.match(str(obj.referred_table.name))
    return True


def partition_name(parent: str, day: dt.date) -> str:
    return f"{ident(parent)}_p{day:%Y%m%d}"
