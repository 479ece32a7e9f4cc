"""Prometheus and Grafana files under deploy/ against what trainguard really exports: the
metric names and labels are taken from a real agent exporter (simulated GPUs, a rank
through the real SDK, an injected XID) and a real backend on PostgreSQL (live fan-out
on), and every name and grouping label in the dashboard and the alerting rules must be
among them."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support import AUTH, TOKEN, wait_for
from trainguard import sdk
from trainguard.agent.config import AgentConfig
from trainguard.agent.daemon import build_agent
from trainguard.agent.metrics import DEFAULT_PORT, AgentExporter
from trainguard.agent.ranks.server import LocalServer
from trainguard.backend.alerts.dispatcher import AlertDispatcher

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAME = re.compile(r"\b(?:trainguard|DCGM_FI)_[A-Za-z0-9_]+")
BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def _families(text: str) -> dict[str, set[str]]:
    """metric name (and, for counters, name_total) -> label names seen."""
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        names = {fam.name, f"{fam.name}_total"} if fam.type == "counter" else {fam.name}
        labels = {k for s in fam.samples for k in s.labels}
        for n in names:
            out.setdefault(n, set()).update(labels)
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, pg_database: str) -> dict[str, set[str]]:
    tmp = tmp_path_factory.mktemp("obs")
    # the agent: simulated GPUs, its SDK server, one rank (this process), one XID
    cfg = AgentConfig(
        node="node-1",
        server="http://backend",
        spool_dir=tmp / "spool",
        socket_path=tmp / "a.sock",
        simulate=2,
        interval=0.02,
    )
    agent = build_agent(cfg, transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    local = LocalServer(agent)
    exporter = AgentExporter(agent, port=0, host="127.0.0.1")
    agent.add_component(local)
    agent.add_component(exporter)
    t = threading.Thread(target=agent.run)
    t.start()
    tg = None
    try:
        wait_for(lambda: exporter._server is not None)
        tg = sdk.attach(
            job="j", rank=0, socket_path=local.socket_path, install_signal_handler=False
        )
        with tg.step(0):
            pass
        assert agent.simulated is not None
        agent.simulated.inject_xid(0, 79)
        url = f"http://127.0.0.1:{exporter.port}/metrics"

        def scraped() -> str | None:
            x = httpx.get(url).text
            ready = "trainguard_agent_xid_errors_total{" in x and "heartbeat_age_seconds{" in x
            return x if ready else None

        text = wait_for(scraped)
    finally:
        if tg is not None:
            tg.close()
        agent.stop()
        t.join(10)
    names = _families(text)
    # the backend on PostgreSQL (live fan-out on), with the alert dispatcher wired
    from fastapi.testclient import TestClient

    from trainguard.backend.app import create_app
    from trainguard.backend.settings import Settings

    app = create_app(Settings(database_url=pg_database, admin_token=TOKEN, data_dir=tmp))
    with TestClient(app, headers=AUTH) as client:
        app.state.alerts = AlertDispatcher([])
        app.state.alerts.stats[("hook", "incident_opened", "sent")] += 1
        text = client.get("/metrics").text
    for name, labels in _families(text).items():
        names.setdefault(name, set()).update(labels)
    # analytics gauges carry `job` (and badput `bucket`) once a job has steps
    for name in ("trainguard_job_goodput_ratio", "trainguard_job_stragglers"):
        names[name] |= {"job"}
    names["trainguard_job_badput_seconds"] |= {"job", "bucket"}
    names["trainguard_restarts_total"] |= {"level", "cause", "trigger"}
    return names


def _dashboard_exprs() -> list[str]:
    dash = json.loads((DEPLOY / "grafana" / "trainguard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    return exprs


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "trainguard-rules.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def _check(exprs: list[str], exported: dict[str, set[str]]) -> None:
    all_labels = set().union(*exported.values())
    for expr in exprs:
        used = set(NAME.findall(expr))
        assert used, f"no trainguard metric in {expr!r}"
        missing = used - set(exported)
        assert not missing, f"{expr!r}: not exported: {sorted(missing)}"
        for group in BY.findall(expr):
            labels = {x.strip() for x in group.split(",") if x.strip()}
            assert labels <= all_labels, f"{expr!r}: unknown labels {labels - all_labels}"
        for metric, selector in re.findall(r"\b([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}", expr):
            if metric in exported:
                for label in re.findall(r"([A-Za-z_]+)\s*=~?", selector):
                    assert label in exported[metric], f"{expr!r}: {metric} has no {label}"


def test_the_dashboard_uses_only_exported_metrics_and_labels(
    exported: dict[str, set[str]],
) -> None:
    _check(_dashboard_exprs(), exported)
    for dcgm in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"):
        assert {"gpu", "UUID", "Hostname"} <= exported[dcgm]


def test_the_dashboard_is_importable_grafana_json() -> None:
    dash = json.loads((DEPLOY / "grafana" / "trainguard.json").read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "training_job", "node"}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            for t in p["targets"]:
                for var in re.findall(r"\$(\w+)", t["expr"]):
                    assert var in variables | {"__range", "__interval"}, (p["title"], var)


def test_the_alerting_rules_use_exported_metrics_and_say_what_happened(
    exported: dict[str, set[str]],
) -> None:
    rules = _rules()
    assert len({r["alert"] for r in rules}) == len(rules)
    for r in rules:
        assert r["labels"]["severity"] in {"critical", "warning"}, r["alert"]
        assert r["annotations"]["summary"], r["alert"]
        if "for" in r:
            assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]
    _check([r["expr"] for r in rules], exported)


def test_the_scrape_config_matches_the_exporters() -> None:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert doc["rule_files"] == ["trainguard-rules.yml"]
    assert (DEPLOY / "prometheus" / doc["rule_files"][0]).exists()
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert set(jobs) == {
        "trainguard-backend",
        "trainguard-agents",
        "trainguard-backend-k8s",
        "trainguard-agents-k8s",
    }
    for name, j in jobs.items():
        assert j["honor_labels"] is True, name  # `job` is the training job's label
        assert j["metrics_path"] == "/metrics"
        if "backend" in name:  # the backend's /metrics needs a viewer token
            assert j["authorization"]["type"] == "Bearer"
            assert j["authorization"]["credentials_file"]
    for target in jobs["trainguard-agents"]["static_configs"][0]["targets"]:
        assert target.endswith(f":{DEFAULT_PORT}")
    # the Kubernetes jobs keep the pods by the labels and port names deploy/kubernetes uses
    k8s = "\n".join(p.read_text() for p in (DEPLOY / "kubernetes").glob("*.yaml"))
    for name in ("trainguard-backend-k8s", "trainguard-agents-k8s"):
        keep = {r["regex"] for r in jobs[name]["relabel_configs"] if r.get("action") == "keep"}
        for value in keep:
            assert re.search(rf"(component|name): {value}\b", k8s), (name, value)
