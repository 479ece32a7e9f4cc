"""The README's first commands on a fresh machine: `db upgrade`, `token create`, `server`,
in that order, as real processes, against a TRAINGUARD_DATA_DIR that does not exist yet
(each command that opens the SQLite database creates its folder, not only the server)."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

from tests.packaging.support import outside_env, run, serve

CLI = (sys.executable, "-m", "trainguard.agent.cli")


def test_the_readme_commands_work_in_order_on_a_fresh_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "nested" / "data"  # neither folder exists
    env = {"TRAINGUARD_DATA_DIR": str(data)}

    up = run([*CLI, "db", "upgrade"], cwd=tmp_path, timeout=120, **env)
    assert up.stdout.strip() == "database at head", up.stderr
    assert (data / "trainguard.db").is_file()

    made = run([*CLI, "token", "create", "--role", "operator"], cwd=tmp_path, timeout=120, **env)
    token = made.stdout.strip()
    assert token and "shown once" in made.stderr

    with serve([*CLI, "server"], tmp_path, outside_env(**env), tmp_path / "server.log") as url:
        assert httpx.get(f"{url}/readyz", timeout=5).json() == {"status": "ready"}
        jobs = httpx.get(
            f"{url}/api/v1/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=5
        )
        assert jobs.status_code == 200, jobs.text


def test_token_create_alone_creates_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "fresh"
    made = run(
        [*CLI, "token", "create", "--role", "viewer"],
        cwd=tmp_path,
        timeout=120,
        TRAINGUARD_DATA_DIR=str(data),
    )
    assert made.stdout.strip() and (data / "trainguard.db").is_file()
