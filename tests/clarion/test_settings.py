"""Settings an operator sets in the environment."""

from __future__ import annotations

import pytest

from clarion.settings import Settings


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_metrics_token_leaves_api_metrics_closed(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """``CLARION_METRICS_TOKEN=`` must not become a token that an empty bearer would match."""
    monkeypatch.setenv("CLARION_METRICS_TOKEN", value)
    assert Settings().metrics_token is None


def test_a_metrics_token_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLARION_METRICS_TOKEN", "scrape-me")
    token = Settings().metrics_token
    assert token is not None and token.get_secret_value() == "scrape-me"
