"""The systemd units and the agent's configuration files under deploy/systemd/: the
units parse and restart for ever, their directories are the ones the settings use, the
env file and the TOML example hold only settings the agent knows, with valid values, and
the required CLI options are satisfied from the environment."""

from __future__ import annotations

import configparser
import shlex
import tomllib
from pathlib import Path

import typer

from trainguard.agent.cli import app
from trainguard.agent.config import AgentConfig

SYSTEMD = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
PENDING_AGENT = {"metrics_port"}  # read once `trainguard agent` has the exporter option


def unit(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    cp.read_string((SYSTEMD / name).read_text())
    return cp


def env_file(name: str) -> dict[str, str]:
    out = {}
    for line in (SYSTEMD / name).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def agent_fields() -> set[str]:
    return set(AgentConfig.model_fields) | PENDING_AGENT


def test_the_agent_unit_restarts_for_ever_and_uses_the_settings_directories() -> None:
    u = unit("trainguard-agent.service")
    svc = u["Service"]
    assert svc["Restart"] == "always" and u["Unit"]["StartLimitIntervalSec"] == "0"
    assert int(svc["TimeoutStopSec"]) >= 15  # room to flush the outbox to the spool
    argv = shlex.split(svc["ExecStart"])
    assert argv[0].endswith("/bin/trainguard") and argv[1:] == ["agent"]
    assert set(svc["CapabilityBoundingSet"].split()) == {"CAP_SYSLOG", "CAP_KILL"}
    env = env_file("agent.env")
    assert svc["EnvironmentFile"] == "/etc/trainguard/agent.env"
    assert env["TRAINGUARD_AGENT_SOCKET_PATH"].startswith(f"/run/{svc['RuntimeDirectory']}/")
    assert env["TRAINGUARD_AGENT_SPOOL_DIR"].startswith(f"/var/lib/{svc['StateDirectory']}/")
    assert u["Install"]["WantedBy"] == "multi-user.target"


def test_the_server_unit_runs_the_server_command() -> None:
    u = unit("trainguard-server.service")
    argv = shlex.split(u["Service"]["ExecStart"])
    assert argv[1] == "server" and "--host" in argv and "--port" in argv
    assert u["Service"]["Restart"] == "always" and u["Service"]["User"] == "trainguard"


def test_the_env_file_holds_valid_agent_settings_and_satisfies_the_cli() -> None:
    env = env_file("agent.env")
    settings = {}
    for var, value in env.items():
        assert var.startswith("TRAINGUARD_AGENT_"), var
        field = var.removeprefix("TRAINGUARD_AGENT_").lower()
        assert field in agent_fields(), var
        if field not in PENDING_AGENT:
            settings[field] = value
    cfg = AgentConfig(**settings)  # every value passes the agent's validators
    assert cfg.server.startswith("https://") and cfg.interval == 1.0
    # `trainguard agent` requires --server and --token: both come from the environment
    command = typer.main.get_command(app).commands["agent"]  # type: ignore[attr-defined]  # a typer app is a click Group
    for param in command.params:
        if param.required:
            assert param.envvar in env, f"--{param.name} is required and not in agent.env"


def test_the_toml_example_holds_valid_agent_settings() -> None:
    doc = tomllib.loads((SYSTEMD / "agent.toml").read_text())
    assert set(doc) <= agent_fields(), set(doc) - agent_fields()
    cfg = AgentConfig(**{k: v for k, v in doc.items() if k not in PENDING_AGENT})
    assert str(cfg.socket_path) == "/run/trainguard/agent.sock"
    # the two files describe the same node setup
    env = env_file("agent.env")
    for key, value in doc.items():
        var = f"TRAINGUARD_AGENT_{key.upper()}"
        if var in env:
            assert str(value) == env[var], key
