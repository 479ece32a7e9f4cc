"""What the README promises a first-time user and the code agrees on: where the agent's
spool lives by default, how a browser signs in, and that the `train` extra's torch is
better installed first."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from trainguard.agent.config import AgentConfig

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_says_where_the_agents_spool_is_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRAINGUARD_AGENT_SPOOL_DIR", raising=False)
    spool = AgentConfig(node="gpu-node-017", server="http://backend:8000").spool_dir
    said = "~/.local/state/trainguard/spool/<node>"
    assert spool == Path.home() / said.removeprefix("~/").replace("<node>", "gpu-node-017")
    assert f"`{said}`" in README
    assert "TRAINGUARD_AGENT_SPOOL_DIR" in README


def test_the_readme_says_how_a_browser_signs_in() -> None:
    login = (ROOT / "frontend" / "views" / "login.js").read_text()
    assert "Access token" in login and "sessionStorage" in login
    assert "sign-in form" in README and "sessionStorage" in README


def test_the_readme_says_to_install_torch_before_the_train_extra() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(r.startswith("torch") for r in extras["optional-dependencies"]["train"])
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in README
