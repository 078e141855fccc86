"""The folders are the architecture: imports point down only, and no two modules import each other.

Allowed directions (README, "Architecture"): ``schema`` <- ``core`` <- ``providers`` <- ``clarion``
(plumbing) <- ``api`` and ``workers`` (neither imports the other) <- ``commands``. Every import
counts, also one inside a function or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWED: dict[str, set[str]] = {
    "schema": set(),
    "core": {"schema"},
    "providers": {"schema", "core"},
    "clarion": {"schema", "core", "providers"},
    "api": {"schema", "core", "providers", "clarion"},
    "workers": {"schema", "core", "providers", "clarion"},
    "commands": {"schema", "core", "providers", "clarion", "api", "workers"},
}


def imports(source: str, module: str) -> Iterator[str]:
    """The Clarion modules ``source`` (the text of ``module``) imports, fully qualified."""
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def graph() -> dict[str, set[str]]:
    modules = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for top in ALLOWED
        for path in (ROOT / top).rglob("*.py")
    }
    return {
        name: {target for target in imports(path.read_text(), name) if target in modules and target != name}
        for name, path in modules.items()
    }


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{source} -> {target}"
        for source, targets in edges.items()
        for target in targets
        if (top := target.split(".")[0]) != source.split(".")[0] and top not in ALLOWED[source.split(".")[0]]
    )


def mutual(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} <-> {b}" for a, targets in edges.items() for b in targets if a < b and a in edges.get(b, ())
    )


def test_imports_point_down_only() -> None:
    assert upward(graph()) == []


def test_no_two_modules_import_each_other() -> None:
    assert mutual(graph()) == []


def test_the_checks_catch_what_they_are_for() -> None:
    edges = {
        "core.render": {"workers.pipeline", "schema.enums"},
        "workers.pipeline": {"api.accept", "core.render"},
        "api.accept": {"api.accept_checks"},
        "api.accept_checks": {"api.accept"},
    }
    assert upward(edges) == ["core.render -> workers.pipeline", "workers.pipeline -> api.accept"]
    assert mutual(edges) == ["api.accept <-> api.accept_checks", "core.render <-> workers.pipeline"]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from api import accept\n"
    assert "api.accept" in set(imports(source, "api.accept_checks"))
    assert "workers.claim" in set(imports("from .claim import claim\n", "workers.pipeline"))


def private_library_imports(source: str) -> list[str]:
    """Imports of another package's private module (``starlette._utils``): they change unannounced."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append(node.module)
    return sorted(
        name
        for name in names
        if name.split(".")[0] not in ALLOWED and any(part.startswith("_") for part in name.split(".")[1:])
    )


def test_no_private_modules_of_libraries() -> None:
    found = {
        str(path.relative_to(ROOT)): hits
        for top in ALLOWED
        for path in (ROOT / top).rglob("*.py")
        if (hits := private_library_imports(path.read_text()))
    }
    assert found == {}


def test_the_private_module_check_catches_one() -> None:
    source = "from starlette._utils import is_async_callable\nimport starlette.routing\nfrom core import _x\n"
    assert private_library_imports(source) == ["starlette._utils"]
