"""compose.yaml and the Dockerfile, checked without a Docker engine: structure, health checks,
settings that exist, no committed secrets, and an image built from pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from clarion.settings import Settings
from schema.enums import Channel

ROOT = Path(__file__).resolve().parents[1]
CLARION_SERVICES = ["migrate", "api", "relay", "webhooks", *(f"worker-{c.value}" for c in Channel)]
SECRET_WORDS = ("PASSWORD", "SECRET", "API_KEY", "TOKEN", "PRIVATE_KEY", "AUTH")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "compose.yaml").read_text()))


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _setting_exists(name: str) -> bool:
    """CLARION_A__B_C -> Settings.a.b_c (nested with __), walking the pydantic models."""
    model: type[BaseModel] | None = Settings
    for part in name.removeprefix("CLARION_").lower().split("__"):
        if model is None or part not in model.model_fields:
            return False
        annotation = model.model_fields[part].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return True


def test_services_are_kafka_postgres_redis_migration_api_relay_and_a_worker_per_channel(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    assert set(services) == {"kafka", "postgres", "redis", *CLARION_SERVICES}
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert _env(kafka)["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft: no ZooKeeper service
    assert "zookeeper" not in " ".join(services)
    for channel in Channel:
        assert services[f"worker-{channel.value}"]["command"] == ["clarion", "worker", channel.value]
    assert "clarion db upgrade" in " ".join(services["migrate"]["command"])
    assert "clarion topics create" in " ".join(services["migrate"]["command"])


def test_long_running_services_have_health_checks_and_wait_for_healthy_dependencies(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    for name, service in services.items():
        if name != "migrate":
            assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
        for dependency, rule in (service.get("depends_on") or {}).items():
            expected = "service_completed_successfully" if dependency == "migrate" else "service_healthy"
            assert rule == {"condition": expected}, f"{name} -> {dependency}: {rule}"
    for name in CLARION_SERVICES[1:]:
        assert "migrate" in services[name]["depends_on"], name
    assert set(services["migrate"]["depends_on"]) == {"kafka", "postgres"}
    assert services["migrate"]["restart"] == "no"


def test_workers_can_be_scaled(compose: dict[str, Any]) -> None:
    for channel in Channel:
        worker = compose["services"][f"worker-{channel.value}"]
        # A fixed container name or a published host port would make `--scale` fail.
        assert "container_name" not in worker and "ports" not in worker


def test_every_clarion_variable_is_a_real_setting(compose: dict[str, Any]) -> None:
    names = [
        name
        for service in compose["services"].values()
        for name in _env(service)
        if name.startswith("CLARION_")
    ]
    text = (ROOT / "compose.yaml").read_text()
    names += re.findall(r"\b(CLARION_[A-Z0-9_]+)", text)
    assert names
    unknown = sorted({n for n in names if not _setting_exists(n)} - {"CLARION_API_PORT"})
    assert unknown == [], f"compose.yaml sets variables Settings does not read: {unknown}"
    assert _env(compose["services"]["api"])["CLARION_ENV"] == "prod"


def test_setting_check_catches_a_misspelt_variable() -> None:
    assert _setting_exists("CLARION_PROVIDERS__SENDGRID__API_KEY")
    assert not _setting_exists("CLARION_DATABASE_URI")
    assert not _setting_exists("CLARION_PROVIDERS__SENDGRID__KEY")


def test_no_secret_is_committed(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for key, value in _env(service).items():
            if any(word in key for word in SECRET_WORDS):
                assert re.fullmatch(r"\$\{[A-Z0-9_]+:\?[^}]*\}", value), (
                    f"{name}.{key} must come from the environment"
                )
        url = _env(service).get("CLARION_DATABASE_URL", "")
        if url:
            password = url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
            assert password.startswith("${"), f"{name} commits a database password"


def test_dockerfile_builds_from_pyproject() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY pyproject.toml" in dockerfile
    assert re.search(r"pip install .*-e \.", dockerfile)
    for package in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"][
        "find"
    ]["include"]:
        assert f"COPY {package.rstrip('*')} " in dockerfile, f"the image misses the {package} package"
    ignored = [
        line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if not line.startswith("#")
    ]
    assert ".venv" in ignored and ".git" in ignored and "pyproject.toml" not in ignored
