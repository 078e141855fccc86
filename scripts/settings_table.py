"""Print the configuration table of the README from the settings model (every CLARION_ variable).

.venv/bin/python scripts/settings_table.py
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr

from clarion.settings import Settings


def _model_of(annotation: Any) -> type[BaseModel] | None:
    candidates = [annotation]
    if get_origin(annotation) in (Union, types.UnionType):
        candidates = list(get_args(annotation))
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def variables(model: type[BaseModel] = Settings, prefix: str = "CLARION_") -> Iterator[tuple[str, str, str]]:
    """(name, default, description) for every setting, nested models flattened with ``__``."""
    for name, field in model.model_fields.items():
        nested = _model_of(field.annotation)
        if nested is not None:
            yield from variables(nested, f"{prefix}{name.upper()}__")
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, SecretStr):
            shown = "(placeholder; set it)"
        elif default is None or default == "" or default == [] or default == ():
            shown = ""
        else:
            shown = str(default)
        yield f"{prefix}{name.upper()}", shown, (field.description or "").replace("|", "\\|")


if __name__ == "__main__":
    print("| variable | default | meaning |\n|---|---|---|")
    for name, default, description in variables():
        print(f"| `{name}` | {f'`{default}`' if default else ''} | {description} |")
