"""Remediation hooks: configured commands the backend runs (cordon a node, reset a GPU).

A hook is a command template from the policy, e.g. `kubectl cordon {node}`. It is split
like a shell line (shlex) and run without a shell, so a substituted value can never
become a second command; it gets a timeout, and its exit status and the head of its
output are recorded on the incident.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

OUTPUT_LIMIT = 4096


@dataclass(frozen=True)
class HookResult:
    hook: str
    command: list[str]
    ok: bool
    rc: int | None  # None: it did not finish (timeout) or could not start
    output: str
    started_at: float
    duration_s: float

    def record(self) -> dict[str, Any]:
        return asdict(self)


class _Missing(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return ""


def render(template: str, values: dict[str, Any]) -> list[str]:
    """Split the template, then substitute each word (unknown names become empty)."""
    return [word.format_map(_Missing(values)) for word in shlex.split(template)]


def run_hook(name: str, template: str, values: dict[str, Any], timeout_s: float) -> HookResult:
    started, t0 = time.time(), time.monotonic()
    try:
        argv = render(template, values)
    except (ValueError, IndexError, KeyError) as exc:
        return HookResult(name, [template], False, None, f"bad hook template: {exc}", started, 0.0)
    try:
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode("utf-8", "replace")
        return HookResult(
            name,
            argv,
            False,
            None,
            (out + f"\n[timed out after {timeout_s:g} s]")[-OUTPUT_LIMIT:],
            started,
            time.monotonic() - t0,
        )
    except OSError as exc:
        return HookResult(
            name, argv, False, None, f"cannot run: {exc}", started, time.monotonic() - t0
        )
    out = proc.stdout.decode("utf-8", "replace")[:OUTPUT_LIMIT]
    return HookResult(
        name, argv, proc.returncode == 0, proc.returncode, out, started, time.monotonic() - t0
    )
