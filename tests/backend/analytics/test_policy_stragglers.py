"""The policy file's [stragglers] table overrides the straggler settings; a bad value is
refused at start, naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from trainguard.backend.settings import Settings


def test_policy_stragglers_table_overrides_the_settings(make_client: Any, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[stragglers]\nthreshold = 0.6\nflag_windows = 5\n")
    client = make_client(policy_file=policy, straggler_window_steps=30)
    cfg = client.app.state.straggler_config
    assert (cfg.threshold, cfg.flag_windows, cfg.window_steps) == (0.6, 5, 30)
    assert cfg.unflag_threshold == 0.85  # unset in the file: the setting's default
    engine = client.get("/api/v1/engine").json()
    assert engine["policy"]["stragglers"] == {"threshold": 0.6, "flag_windows": 5}


def test_a_bad_stragglers_value_is_refused_naming_the_key(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("mode = 'auto'\n\n[stragglers]\nthreshold = 2.0\n")
    with pytest.raises(ValidationError, match=r"stragglers\.threshold \(line 4\)"):
        Settings(admin_token="x" * 20, policy_file=policy)
