"""docker-compose.yml cannot be run here (no Docker engine); check what `docker compose
config` would, and that its commands match the real CLI."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from agent.cli import app

ROOT = Path(__file__).resolve().parent.parent


def test_compose_file_wires_postgres_backend_and_a_simulated_agent() -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = doc["services"]
    assert set(services) == {"postgres", "backend", "agent"}
    assert "healthcheck" in services["postgres"] and "healthcheck" in services["backend"]
    assert services["backend"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["agent"]["depends_on"]["backend"]["condition"] == "service_healthy"
    env = services["backend"]["environment"]
    assert env["TRAINGUARD_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "trainguard db upgrade" in services["backend"]["command"][-1]
    assert set(doc["volumes"]) >= {"pgdata", "spool"}


def test_compose_commands_are_accepted_by_the_cli() -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    runner = CliRunner()
    agent_cmd = doc["services"]["agent"]["command"]
    assert agent_cmd[:2] == ["trainguard", "agent"]
    help_text = runner.invoke(app, ["agent", "--help"]).output
    for opt in (a for a in agent_cmd if a.startswith("--")):
        assert opt in help_text, opt
    server_cmd = doc["services"]["backend"]["command"][-1].split("exec ", 1)[1].split()
    help_text = runner.invoke(app, ["server", "--help"]).output
    for opt in (a for a in server_cmd if a.startswith("--")):
        assert opt in help_text, opt


def test_cli_user_mistakes_print_one_line_and_exit_nonzero(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(
        app, ["db", "upgrade", "--database-url", "postgresql+psycopg://x@127.0.0.1:1/x"]
    )
    assert r.exit_code == 2
    assert "cannot reach the database" in r.output and "Traceback" not in r.output
    r = runner.invoke(
        app, ["server", "--data-dir", str(tmp_path)], env={"TRAINGUARD_ADMIN_TOKEN": ""}
    )
    assert r.exit_code == 2 and "no token configured" in r.output
    r = runner.invoke(app, ["server"], env={"TRAINGUARD_ADMIN_TOKEN": "short"})
    assert r.exit_code == 2 and "at least 16 characters" in r.output
