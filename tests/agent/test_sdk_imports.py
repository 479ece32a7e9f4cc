"""The SDK stays cheap to import into a training script: the standard library, the
protocol (trainguard.protocol) and msgspec, which the protocol is written in; nothing
else, before or after attach (whose hooks and detection import nothing either)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
# What msgspec imports of its own accord (typing_extensions, when it is installed).
MSGSPEC_PROBE = """
import json, sys
before = set(sys.modules)
import msgspec, msgspec.json
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def new_modules(probe: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return list(json.loads(out.stdout.splitlines()[-1]))


def foreign(modules: list[str], msgspec_own: frozenset[str] = frozenset()) -> list[str]:
    """The modules that are neither the standard library's nor allowed to the SDK:
    trainguard, trainguard.sdk.*, trainguard.protocol.*, msgspec (and what it imports)."""

    def allowed(name: str) -> bool:
        return (
            name in ("trainguard", "trainguard.sdk", "trainguard.protocol", "msgspec")
            or name.startswith(("trainguard.sdk.", "trainguard.protocol.", "msgspec."))
            or name in msgspec_own
            or name.split(".")[0] in sys.stdlib_module_names
        )

    return [m for m in modules if not allowed(m)]


@pytest.mark.parametrize(
    "name",
    ["trainguard.agent", "trainguard.agent.ranks.server", "trainguard.backend", "httpx", "torch"],
)
def test_the_rule_refuses_what_the_sdk_must_not_import(name: str) -> None:
    assert foreign(["trainguard.sdk.session", "msgspec.json", "json", name]) == [name]


def test_the_sdk_imports_only_the_standard_library_and_the_protocol() -> None:
    new = new_modules(PROBE)
    assert foreign(new, frozenset(new_modules(MSGSPEC_PROBE))) == []
    assert {"trainguard.sdk", "trainguard.protocol.messages", "msgspec"} <= set(new)
