"""deploy/k8s: both overlays render, every document validates against the Kubernetes API schemas
(``kubernetes-validate``, strict), and the manifests keep the promises the README makes: probes,
resources and a disruption budget for every Deployment, secrets only by reference, the processes'
commands as compose.yaml runs them, and worker replicas <= topic partitions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from clarion.settings import Settings
from schema.enums import Channel
from tests.deploy.kustomize import Unsupported, render

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ["dev", "prod"]
# The newest Kubernetes the installed schemas know, and the oldest minor still commonly served.
VERSIONS = [kubernetes_validate.latest_version(), "1.33.0"]
SECRET = "clarion-secrets"
SECRET_ENV = {"CLARION_SECRET_KEY", "CLARION_DATABASE_URL", "CLARION_METRICS_TOKEN"}


def rendered(overlay: str) -> list[dict[str, Any]]:
    return render(K8S / "overlays" / overlay)


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["spec"]["template"]["spec"]["containers"])


def config(docs: list[dict[str, Any]]) -> dict[str, str]:
    return dict(of_kind(docs, "ConfigMap")["clarion-config"]["data"])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_document_is_valid_kubernetes(overlay: str, version: str) -> None:
    docs = rendered(overlay)
    assert len(docs) >= 15
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_refuses_a_wrong_manifest() -> None:
    deployment = of_kind(rendered("prod"), "Deployment")["clarion-api"]
    containers(deployment)[0]["livenessProbe"]["httpGet"]["path"] = 404
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_worker_replicas_never_exceed_the_topic_partitions(overlay: str) -> None:
    docs = rendered(overlay)
    partitions = int(config(docs)["CLARION_TOPIC_PARTITIONS"])
    deployments = of_kind(docs, "Deployment")
    for channel in Channel:
        worker = deployments[f"clarion-worker-{channel.value}"]
        assert 1 <= worker["spec"]["replicas"] <= partitions, (overlay, channel)
    for autoscaler in of_kind(docs, "HorizontalPodAutoscaler").values():
        assert not autoscaler["spec"]["scaleTargetRef"]["name"].startswith("clarion-worker")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_deployment_has_probes_resources_and_a_disruption_budget(overlay: str) -> None:
    docs = rendered(overlay)
    budgets = of_kind(docs, "PodDisruptionBudget").values()
    deployments = of_kind(docs, "Deployment")
    assert set(deployments) == {"clarion-api", "clarion-relay", "clarion-webhooks"} | {
        f"clarion-worker-{c.value}" for c in Channel
    }
    for name, deployment in deployments.items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        for container in containers(deployment):
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                assert container[probe]["httpGet"]["port"] in {p["name"] for p in container["ports"]}
            assert {"cpu", "memory"} <= set(container["resources"]["requests"])
            assert {"cpu", "memory"} <= set(container["resources"]["limits"])
        covering = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1, name
    api = containers(deployments["clarion-api"])[0]
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_are_only_referenced_never_written(overlay: str) -> None:
    docs = rendered(overlay)
    assert of_kind(docs, "Secret") == {}
    assert not SECRET_ENV & set(config(docs))
    pods = [*of_kind(docs, "Deployment").values(), *of_kind(docs, "Job").values()]
    for pod in pods:
        for container in containers(pod):
            env = {e["name"]: e for e in container["env"]}
            for name in SECRET_ENV & set(env):
                assert "value" not in env[name]
                assert env[name]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": name}
            assert {"CLARION_SECRET_KEY", "CLARION_DATABASE_URL"} <= set(env), pod["metadata"]["name"]
    api_env = {e["name"] for e in containers(of_kind(docs, "Deployment")["clarion-api"])[0]["env"]}
    assert "CLARION_METRICS_TOKEN" in api_env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_processes_run_as_compose_runs_them_with_real_settings(overlay: str) -> None:
    docs = rendered(overlay)
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    pods = {**of_kind(docs, "Deployment"), **of_kind(docs, "Job")}
    for service in ["api", "relay", "webhooks", "migrate", *(f"worker-{c.value}" for c in Channel)]:
        [container] = containers(pods[f"clarion-{service}"])
        assert container["command"] == compose[service]["command"], service
    names = set(config(docs))
    for pod in pods.values():
        for container in containers(pod):
            names |= {e["name"] for e in container["env"]}
    fields = {name.removeprefix("CLARION_").split("__")[0].lower() for name in names}
    assert fields - set(Settings.model_fields) == set()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_reach_pods_on_named_ports(overlay: str) -> None:
    docs = rendered(overlay)
    pods = [*of_kind(docs, "Deployment").values()]
    for name, service in of_kind(docs, "Service").items():
        selected = [
            p
            for p in pods
            if service["spec"]["selector"].items() <= p["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert selected, name
        for pod in selected:
            ports = {p["name"] for c in containers(pod) for p in c["ports"]}
            assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports, name


def test_overlays_set_namespace_image_replicas_and_patches() -> None:
    dev, prod = rendered("dev"), rendered("prod")
    assert {d["metadata"]["namespace"] for d in dev} == {"clarion-dev"}
    assert {d["metadata"]["namespace"] for d in prod} == {"clarion"}
    api = of_kind(prod, "Deployment")["clarion-api"]
    assert containers(api)[0]["image"] == "registry.example.com/clarion:1.0.0"
    assert containers(of_kind(dev, "Job")["clarion-migrate"])[0]["image"] == "clarion:dev"
    assert api["spec"]["replicas"] == 3
    assert containers(api)[0]["resources"]["limits"]["cpu"] == "2"
    assert containers(api)[0]["env"], "a patch merges containers by name, keeping the rest"
    assert config(prod)["CLARION_TOPIC_PARTITIONS"] == "12"
    assert config(prod)["CLARION_KAFKA_BOOTSTRAP"] == "kafka:9092"


def test_the_renderer_refuses_fields_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": [], "configMapGenerator": [{"name": "x", "literals": ["a=b"]}]})
    )
    with pytest.raises(Unsupported):
        render(tmp_path)
