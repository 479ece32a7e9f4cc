"""Finding the node's agent with no configuration: one well-known socket per host.

TRAINGUARD_AGENT_SOCKET when set, else the first of the well-known places an agent
listens on (`socket_candidates()`: /run/trainguard/agent.sock,
$XDG_RUNTIME_DIR/trainguard/agent.sock, /tmp/trainguard-<uid>/agent.sock). The agent
binds the first of the same list it can create (trainguard.agent.ranks.server)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

SOCKET_ENV = "TRAINGUARD_AGENT_SOCKET"  # the socket, on both sides (overrides discovery)
SOCKET_DIRS_ENV = "TRAINGUARD_SOCKET_DIRS"  # the well-known folders, ":"-separated (tests)
SOCKET_NAME = "agent.sock"


def socket_candidates(env: Mapping[str, str] | None = None) -> list[str]:
    """The well-known places of a node's agent socket, in the order both sides try them:
    /run/trainguard (an agent run as root), $XDG_RUNTIME_DIR/trainguard (default
    /run/user/<uid>/trainguard), /tmp/trainguard-<uid>. TRAINGUARD_SOCKET_DIRS (folders
    separated by ":") replaces the list, for tests and unusual hosts."""
    env = os.environ if env is None else env
    override = [d for d in env.get(SOCKET_DIRS_ENV, "").split(os.pathsep) if d.strip()]
    if override:
        dirs = override
    else:
        uid = os.getuid()
        runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
        dirs = ["/run/trainguard", os.path.join(runtime, "trainguard"), f"/tmp/trainguard-{uid}"]
    return [os.path.join(d, SOCKET_NAME) for d in dirs]


def probe_socket(path: str) -> str:
    """'' when an agent listens on `path`, else why not, in a few words."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)  # a datagram connect sends nothing: it only finds the receiver
        return ""
    except FileNotFoundError:
        return "no such file"
    except ConnectionRefusedError:
        return "nobody listens there"
    except PermissionError:
        return "permission denied"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    finally:
        probe.close()


def find_socket(env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """The agent's socket and, when no agent listens there, why (else '').
    TRAINGUARD_AGENT_SOCKET is taken as it is (reports go there, and reach an agent that
    starts later); otherwise the first well-known socket an agent listens on, or None."""
    env = os.environ if env is None else env
    explicit = env.get(SOCKET_ENV, "").strip()
    if explicit:
        why = probe_socket(explicit)
        return explicit, f"{explicit} ({SOCKET_ENV}): {why}" if why else ""
    return listening_candidate(env)


def listening_candidate(env: Mapping[str, str]) -> tuple[str | None, str]:
    """The first well-known socket an agent listens on (None, and why not at each)."""
    tried = []
    for path in socket_candidates(env):
        why = probe_socket(path)
        if not why and not _owned_by_us_or_root(os.path.dirname(path)):
            why = "its folder belongs to another user"  # /tmp is everyone's: not theirs
        if not why:
            return path, ""
        tried.append(f"{path}: {why}")
    return None, "; ".join(tried)


def _owned_by_us_or_root(folder: str) -> bool:
    try:
        return os.stat(folder).st_uid in (os.getuid(), 0)
    except OSError:
        return False


def default_socket_path() -> str:
    """TRAINGUARD_AGENT_SOCKET, else the well-known socket an agent listens on, else the
    first well-known place."""
    path, _ = find_socket()
    return path or socket_candidates()[0]
