"""The Kubernetes manifests under deploy/kubernetes/, checked without a cluster: every
document parses and names its kind; selectors match their pod templates; every Secret,
ConfigMap, volume and named port that a manifest refers to exists; environment variables
are settings trainguard knows; commands are accepted by the real CLI; the alerts file in
the ConfigMap loads. With kubernetes-validate installed (dev extra) every document is
also validated against the Kubernetes OpenAPI schema of its version."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from trainguard.agent.cli import app
from trainguard.agent.config import AgentConfig
from trainguard.agent.metrics import DEFAULT_PORT
from trainguard.backend.alerts.config import parse_webhooks
from trainguard.backend.settings import Settings

K8S = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}
# Settings the deployment files set that `backend/settings.py` gains with this issue's
# CLI/settings lines (docs/deploy.md); until then the server ignores them.
PENDING_SETTINGS = {"alerts_file", "log_format", "public_url"}
PENDING_AGENT = {"metrics_port"}


def docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append((path.name, doc))
    return out


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in docs() if d["kind"] == kind]


def pod_spec(d: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = d["spec"]["template"]["spec"]
    return spec


def containers(d: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(d)
    return [*spec.get("initContainers", []), *spec["containers"]]


def workload(kind: str, name: str) -> dict[str, Any]:
    (d,) = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    return d


def test_every_document_names_its_kind_and_the_kustomization_lists_every_file() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files
    seen = set()
    for name, d in docs():
        assert {"apiVersion", "kind", "metadata"} <= d.keys(), name
        meta = d["metadata"]
        assert meta["name"], name
        if d["kind"] != "Namespace":
            assert meta.get("namespace") == "trainguard", f"{name}: {d['kind']} {meta['name']}"
        key = (d["kind"], meta["name"])
        assert key not in seen, f"{key} defined twice"
        seen.add(key)
    assert {k for k, _ in seen} >= {
        "Namespace",
        "Secret",
        "ConfigMap",
        "Deployment",
        "Service",
        "DaemonSet",
        "StatefulSet",
        "Job",
        "PodDisruptionBudget",
    }
    images = {c["image"] for _, d in docs() if d["kind"] in WORKLOADS for c in containers(d)}
    assert {i for i in images if not i.startswith("postgres:")} == {"trainguard"}
    assert {i["name"] for i in kust["images"]} == {"trainguard"}


def test_selectors_match_their_pod_templates_and_services_find_pods() -> None:
    templates = []
    for _, d in docs():
        if d["kind"] in WORKLOADS:
            labels = d["spec"]["template"]["metadata"]["labels"]
            match = d["spec"].get("selector", {}).get("matchLabels", {})
            assert match.items() <= labels.items(), d["metadata"]["name"]
            templates.append((d, labels))
    for svc in by_kind("Service"):
        sel = svc["spec"]["selector"]
        targets = [d for d, labels in templates if sel.items() <= labels.items()]
        assert targets, f"service {svc['metadata']['name']} selects no pod"
        ports = {p["name"] for d in targets for c in containers(d) for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, f"{svc['metadata']['name']}: {p['targetPort']}"
    for pdb in by_kind("PodDisruptionBudget"):
        sel = pdb["spec"]["selector"]["matchLabels"]
        assert any(sel.items() <= labels.items() for _, labels in templates)


def test_secrets_config_maps_volumes_and_ports_referred_to_exist() -> None:
    secrets = {s["metadata"]["name"]: s.get("stringData", {}) for s in by_kind("Secret")}
    maps = {m["metadata"]["name"]: m["data"] for m in by_kind("ConfigMap")}
    for _, d in docs():
        if d["kind"] not in WORKLOADS:
            continue
        name = d["metadata"]["name"]
        volumes = {v["name"]: v for v in pod_spec(d).get("volumes", [])}
        for claim in d["spec"].get("volumeClaimTemplates", []):
            volumes[claim["metadata"]["name"]] = claim
        for v in volumes.values():
            if "secret" in v:
                assert v["secret"]["secretName"] in secrets, f"{name}: {v['name']}"
            if "configMap" in v:
                assert v["configMap"]["name"] in maps, f"{name}: {v['name']}"
        for c in containers(d):
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, f"{name}: mount {m['name']}"
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    assert ref["key"] in secrets[ref["name"]], f"{name}: {e['name']}"
                elif ref:
                    assert ref["name"] in secrets
            named = {p["name"] for p in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str):
                    assert port in named, f"{name}: {probe} port {port}"
            assert "resources" in c and "requests" in c["resources"], f"{name}: resources"
    sts = workload("StatefulSet", "trainguard-postgres")
    assert sts["spec"]["serviceName"] in {s["metadata"]["name"] for s in by_kind("Service")}


def _env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def test_the_backend_deployment_probes_health_and_uses_known_settings() -> None:
    d = workload("Deployment", "trainguard")
    assert d["spec"]["replicas"] >= 2
    (c,) = pod_spec(d)["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod_spec(d)["securityContext"]["runAsNonRoot"] is True
    fields = set(Settings.model_fields) | PENDING_SETTINGS
    alerts_env = set()
    for var in _env(c):
        field = var.removeprefix("TRAINGUARD_").lower()
        if var.startswith("TRAINGUARD_") and field not in fields:
            alerts_env.add(var)
    # the only other variable is the Slack URL that alerts.toml names with url_env
    alerts = tomllib.loads(
        workload_map("trainguard-alerts")["alerts.toml"],
    )
    assert alerts_env == {h["url_env"] for h in alerts["webhook"] if "url_env" in h}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "alerts")
    assert _env(c)["TRAINGUARD_ALERTS_FILE"] == f"{mount['mountPath']}/alerts.toml"


def workload_map(name: str) -> dict[str, str]:
    (m,) = [m for m in by_kind("ConfigMap") if m["metadata"]["name"] == name]
    data: dict[str, str] = m["data"]
    return data


def test_the_alerts_file_in_the_config_map_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINGUARD_SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/x")
    hooks = parse_webhooks(tomllib.loads(workload_map("trainguard-alerts")["alerts.toml"]))
    assert [h.format for h in hooks] == ["slack"]


def test_the_agent_daemon_set_reaches_gpus_kernel_log_and_training_pods() -> None:
    d = workload("DaemonSet", "trainguard-agent")
    spec = pod_spec(d)
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    (c,) = spec["containers"]
    env = _env(c)
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/dev/kmsg"]]["hostPath"]["path"] == "/dev/kmsg"
    socket_dir = env["TRAINGUARD_AGENT_SOCKET_PATH"].rsplit("/", 1)[0]
    assert volumes[mounts[socket_dir]]["hostPath"]["path"] == socket_dir
    assert env["TRAINGUARD_AGENT_KMSG_PATH"] == "/dev/kmsg"
    assert int(env["TRAINGUARD_AGENT_METRICS_PORT"]) == DEFAULT_PORT
    assert {p["containerPort"] for p in c["ports"]} == {DEFAULT_PORT}
    assert set(c["securityContext"]["capabilities"]["add"]) == {"SYSLOG", "KILL"}
    fields = set(AgentConfig.model_fields) | PENDING_AGENT
    for var in env:
        if var.startswith("TRAINGUARD_AGENT_"):
            assert var.removeprefix("TRAINGUARD_AGENT_").lower() in fields, var
    # the token comes from the node's key of the tokens secret, through the environment
    script = c["command"][-1]
    assert "/etc/trainguard/tokens/${NODE_NAME}" in script and "--token" not in script
    assert mounts["/etc/trainguard/tokens"] == "tokens"


def test_every_trainguard_command_is_accepted_by_the_cli() -> None:
    runner = CliRunner()
    for _, d in docs():
        if d["kind"] not in WORKLOADS:
            continue
        for c in containers(d):
            cmd = c.get("command", [])
            if cmd[:2] == ["sh", "-c"]:
                cmd = cmd[-1].split("exec ", 1)[1].replace('"', "").split()
            if not cmd or cmd[0] != "trainguard":
                continue
            sub = cmd[1:3] if cmd[1] == "db" else cmd[1:2]
            r = runner.invoke(app, [*sub, "--help"])
            assert r.exit_code == 0, cmd
            for opt in (a for a in cmd if a.startswith("--")):
                assert opt in r.output, f"{d['metadata']['name']}: {opt}"


def test_every_document_against_the_kubernetes_schema() -> None:
    kv = pytest.importorskip(
        "kubernetes_validate.utils",
        reason="kubernetes-validate is not installed (dev extra): structural checks only",
    )
    version = str(kv.latest_version())
    for name, d in docs():
        try:
            kv.validate(d, version, strict=True)
        except Exception as exc:  # its errors name the bad field's path
            raise AssertionError(f"{name}: {d['kind']} {d['metadata']['name']}: {exc}") from exc
