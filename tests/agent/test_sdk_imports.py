"""The SDK stays cheap to import into a training script: the standard library only,
before and after attach (whose hooks and detection import nothing either)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
before = set(sys.modules)
from trainguard import sdk
tg = sdk.attach(job="imports", socket_path="/nonexistent/agent.sock", install_signal_handler=False)
with tg.step(0):
    pass
tg.close()
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_the_sdk_imports_only_the_standard_library() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    new = json.loads(out.stdout.splitlines()[-1])
    ours = {"trainguard", "trainguard.sdk"}
    foreign = [m for m in new if m not in ours and m.split(".")[0] not in sys.stdlib_module_names]
    assert foreign == []
    assert "trainguard.sdk" in new
