"""The deploy manifests, systemd unit, Dockerfile and configs as shipped."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from support.paths import ROOT

K8S = ROOT / "deploy" / "kubernetes"


K8S_VERSION = "1.30.0"


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def kustomize_resources() -> list[str]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]


@pytest.mark.parametrize("name", ["configmap.yaml", "daemonset.yaml", "service.yaml", "grafana-dashboard.yaml"])
def test_core_manifests_validate_against_kubernetes_schemas(name: str) -> None:
    for doc in documents(name):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_custom_resources_have_required_fields() -> None:
    (monitor,) = documents("servicemonitor.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "ServiceMonitor"
    assert monitor["spec"]["selector"]["matchLabels"] and monitor["spec"]["endpoints"]
    service = documents("service.yaml")[0]
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (rule,) = documents("prometheusrule.yaml")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        assert all(("alert" in r) != ("record" in r) and r["expr"] for r in group["rules"])


def test_daemonset_is_what_a_gpu_node_needs() -> None:
    (ds,) = documents("daemonset.yaml")
    pod = ds["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["hostPID"] is True and "nvidia.com/gpu.present" in pod["nodeSelector"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "DAC_READ_SEARCH"]}
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    assert container["readinessProbe"]["httpGet"]["path"] == "/-/healthy"
    assert {e["name"] for e in container["env"]} >= {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}
    # Containerized servers: pod logs and Docker's directory read-only, other containers' /proc/PID/fd readable
    # (AppArmor), probes from the node's network namespace.
    assert pod["hostNetwork"] is True and security["appArmorProfile"] == {"type": "Unconfined"}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert all(mounts[p]["readOnly"] for p in ("/var/log", "/var/lib/docker/containers"))


def test_generated_resources_match_their_sources() -> None:
    spec = importlib.util.spec_from_file_location("generate", K8S / "generate.py")
    assert spec and spec.loader
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    for name, build in generate.OUTPUTS.items():
        assert (K8S / name).read_text() == build(), f"run: python deploy/kubernetes/generate.py ({name})"
    (rule,) = documents("prometheusrule.yaml")
    assert rule["spec"]["groups"] == yaml.safe_load((ROOT / "rules" / "stallwatch.rules.yml").read_text())["groups"]
    (board,) = documents("grafana-dashboard.yaml")
    dashboard = json.loads((ROOT / "grafana" / "stallwatch.json").read_text())
    assert json.loads(board["data"]["stallwatch.json"]) == dashboard


def test_kustomization_lists_every_manifest() -> None:
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomize_resources()) == manifests


@pytest.mark.process
@pytest.mark.parametrize("path", ["deploy/systemd/stallwatch.yml", "deploy/kubernetes/configmap.yaml"])
def test_shipped_configs_are_valid(path: str, tmp_path: Path) -> None:
    text = (ROOT / path).read_text()
    if path.endswith("configmap.yaml"):
        text = yaml.safe_load(text)["data"]["stallwatch.yml"]
    config = tmp_path / "stallwatch.yml"
    config.write_text(text)
    result = subprocess.run([sys.executable, "-m", "stallwatch", "check-config", str(config)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.process
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    unit = (ROOT / "deploy" / "systemd" / "stallwatch.service").read_text()
    binary = shutil.which("stallwatch") or str(Path(sys.executable).with_name("stallwatch"))
    unit = unit.replace("/usr/local/bin/stallwatch", binary)
    path = tmp_path / "stallwatch.service"
    path.write_text(unit)
    result = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if "stallwatch.service" in line]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr
    for directive in ("DynamicUser=yes", "ProtectSystem=strict", "NoNewPrivileges=yes",
                      "CapabilityBoundingSet=CAP_SYS_PTRACE CAP_DAC_READ_SEARCH CAP_SYSLOG",
                      "SupplementaryGroups=systemd-journal"):
        assert directive in unit


@pytest.mark.process
def test_dockerfile_and_compose() -> None:
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    assert "HEALTHCHECK" in dockerfile and "/-/healthy" in dockerfile
    assert "USER 65534" in dockerfile and 'ENTRYPOINT ["stallwatch"]' in dockerfile
    compose_path = ROOT / "deploy" / "docker" / "docker-compose.yml"
    compose = yaml.safe_load(compose_path.read_text())
    assert set(compose["services"]) == {"stallwatch", "prometheus", "alertmanager", "grafana"}
    exporter = compose["services"]["stallwatch"]
    assert exporter["network_mode"] == "host" and "apparmor:unconfined" in exporter["security_opt"]
    assert "/var/lib/docker/containers:/var/lib/docker/containers:ro" in exporter["volumes"]
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (compose_path.parent / source).exists(), source
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        result = subprocess.run([docker, "compose", "-f", str(compose_path), "config", "--quiet"],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
