"""Typed rows: a frozen dataclass built from a database record whose columns carry its field names.

A statement's ``RETURNING`` (or ``SELECT``) list names the columns after the dataclass's fields, so
the fields are copied by name; only the fields that are not a column as it stands (an enum to
convert, a renamed or derived value) are spelled out, as ``computed``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    D = TypeVar("D", bound=DataclassInstance)
else:
    D = TypeVar("D")


@functools.cache
def _copied(cls: type[Any], computed: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init and f.name not in computed)


def from_row(cls: type[D], row: Mapping[str, Any], **computed: Any) -> D:
    """``cls`` with each field from the column of its name in ``row``, except those in ``computed``."""
    return cls(**{name: row[name] for name in _copied(cls, tuple(computed))}, **computed)
