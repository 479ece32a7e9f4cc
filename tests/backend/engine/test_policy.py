"""The policy file: the default loads, a user's file overrides only what it names, and a
bad file is refused at start with the key and line named, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.support import TOKEN
from trainguard.backend.engine.policy import DEFAULT_POLICY_FILE, PolicyError, load_policy
from trainguard.backend.settings import Settings

ROOT = Path(__file__).resolve().parents[3]


def test_the_default_policy_loads_with_the_documented_mapping() -> None:
    p = load_policy()
    assert p.source == "default" and not p.dry_run
    assert p.model.causes.model_dump() == {
        "exception": "in_process",
        "hang": "in_process",
        "rank_exit": "launcher",
        "heartbeat_lost": "launcher",
        "gpu_lost": "exclude_node",
        "node_down": "exclude_node",
    }
    assert p.xid_action(79, "RESTART_BM", None) == ("exclude_node", "bucket RESTART_BM")
    assert p.xid_action(12345, "UNKNOWN", None)[0] == "ignore"
    assert DEFAULT_POLICY_FILE.is_file()


def test_a_user_file_overrides_only_what_it_names(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text('mode = "dry_run"\n[xid.codes]\n"13" = "launcher"\n[limits]\ncooldown_s = 3\n')
    p = load_policy(f)
    assert p.dry_run and p.source == str(f)
    assert p.xid_action(13, "RESTART_APP", None) == ("launcher", "policy xid.codes.13")
    assert p.model.limits.cooldown_s == 3 and p.model.limits.budget_per_hour == 12


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[causes]\nexception = "restart"\n',
            "causes.exception (line 2): 'restart' is not allowed",
        ),
        ("[limits]\ncooldown_s = 5\nbudgett = 3\n", "limits.budgett (line 3): unknown key"),
        ("[escalation]\nwindow_s = -1\n", "escalation.window_s (line 2): Input should be greater"),
        ('[xid.codes]\n"48" = "exclude_node"\nabc = "ignore"\n', "xid.codes.abc (line 3)"),
        ('mode = "yolo"\n', "mode (line 1): 'yolo' is not allowed ('auto' or 'dry_run')"),
        ('[hooks]\ntimeout_s = "long"\n', "hooks.timeout_s (line 2)"),
        ("[limits\ncooldown_s = 1\n", "not valid TOML: "),
        ("colour = 1\n", "colour (line 1): unknown key"),
    ],
)
def test_a_bad_policy_file_is_refused_naming_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(PolicyError) as err:
        load_policy(f)
    assert str(err.value).startswith(f"policy file {f}: ")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_settings_refuse_a_bad_or_missing_policy_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text('[causes]\nhang = "reboot"\n')
    with pytest.raises(ValidationError) as err:
        Settings(admin_token=TOKEN, policy_file=f)
    assert err.value.errors()[0]["loc"] == ("policy_file",)
    assert "causes.hang (line 2)" in str(err.value)
    with pytest.raises(ValidationError, match="cannot read"):
        Settings(admin_token=TOKEN, policy_file=tmp_path / "missing.toml")
    assert Settings(admin_token=TOKEN, policy_file="").policy.source == "default"


def test_trainguard_server_refuses_a_bad_policy_in_one_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text("[escalation]\nwindow_s = 600\nin_process = 0\n")
    env = {
        **os.environ,
        "TRAINGUARD_ADMIN_TOKEN": TOKEN,
        "TRAINGUARD_POLICY_FILE": str(f),
        "TRAINGUARD_DATA_DIR": str(tmp_path / "data"),
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard.agent.cli", "server", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "escalation.in_process (line 3)" in lines[0] and str(f) in lines[0]
    assert not (tmp_path / "data").exists()  # refused before anything started
