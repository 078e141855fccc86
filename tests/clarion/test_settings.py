"""Settings an operator sets in the environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clarion.settings import Settings


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_metrics_token_leaves_api_metrics_closed(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """``CLARION_METRICS_TOKEN=`` must not become a token that an empty bearer would match."""
    monkeypatch.setenv("CLARION_METRICS_TOKEN", value)
    assert Settings(env="test").metrics_token is None


def test_a_metrics_token_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLARION_METRICS_TOKEN", "scrape-me")
    token = Settings(env="test").metrics_token
    assert token is not None and token.get_secret_value() == "scrape-me"


def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CLARION_ENV", "CLARION_SECRET_KEY", "CLARION_PREVIOUS_SECRET_KEYS"):
        monkeypatch.delenv(name, raising=False)


def test_without_clarion_env_the_settings_are_production_and_need_a_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clean(monkeypatch)
    with pytest.raises(ValueError, match="CLARION_SECRET_KEY"):
        Settings()
    monkeypatch.setenv("CLARION_SECRET_KEY", "a-real-secret-" + "x" * 32)
    settings = Settings()
    assert settings.env == "prod"
    assert not settings.sandbox_enabled and settings.metrics_token is None


@pytest.mark.parametrize(
    ("secret", "previous"),
    [
        ("", None),
        ("   ", None),
        ("a-real-secret-xxxxxxxx", "dev-insecure-secret-change-me"),
        ("a-real-secret", " , "),
    ],
)
def test_prod_refuses_an_empty_secret_or_a_placeholder_among_the_previous_ones(
    monkeypatch: pytest.MonkeyPatch, secret: str, previous: str | None
) -> None:
    _clean(monkeypatch)
    monkeypatch.setenv("CLARION_ENV", "prod")
    monkeypatch.setenv("CLARION_SECRET_KEY", secret)
    if previous is not None:
        monkeypatch.setenv("CLARION_PREVIOUS_SECRET_KEYS", previous)
    if previous == " , ":  # splits to nothing: no previous key, so only the secret counts
        Settings()
        return
    with pytest.raises(ValueError):
        Settings()


def test_a_production_command_without_a_secret_ends_with_one_line_and_no_traceback() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli", "api"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "CLARION_SECRET_KEY" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_webhook_lease_that_a_call_could_outlive_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lease ending while its call still runs would make another claim send a live call again:
    the call's limit plus the host's lookup (2 s) plus a 5 s margin, at least."""
    monkeypatch.setenv("CLARION_WEBHOOK_TIMEOUT_S", "90")
    with pytest.raises(ValueError, match=r"CLARION_WEBHOOK_LEASE_S \(60\) must be at least .*\(97\)"):
        Settings(env="test")  # the default lease, 60 s
    monkeypatch.setenv("CLARION_WEBHOOK_LEASE_S", "97")
    assert Settings(env="test").webhook_lease_s == 97
    monkeypatch.setenv("CLARION_WEBHOOK_TIMEOUT_S", "10")
    monkeypatch.setenv("CLARION_WEBHOOK_LEASE_S", "16.5")
    with pytest.raises(ValueError, match="CLARION_WEBHOOK_TIMEOUT_S"):
        Settings(env="test")
