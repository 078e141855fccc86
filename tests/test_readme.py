"""The README stays true: it starts with the two commands, and documents every setting."""

from __future__ import annotations

from pathlib import Path

from scripts.settings_table import variables

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_readme_starts_with_the_run_and_test_commands() -> None:
    first_block = README.split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert commands == ["make dev", "make test"]
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    assert "make test" in ci


def test_every_setting_is_in_the_configuration_table() -> None:
    missing = [name for name, _, _ in variables() if f"`{name}`" not in README]
    assert missing == []
