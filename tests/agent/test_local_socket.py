"""Where the agent binds its SDK socket: the well-known places in the SDK's order (moved
into the test's folder with TRAINGUARD_SOCKET_DIRS), a stale socket replaced, a live
agent's socket never taken."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainguard import sdk
from trainguard.agent.config import AgentConfig
from trainguard.agent.daemon import build_agent
from trainguard.agent.ranks.server import LocalServer


@pytest.fixture
def make_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for var in ("TRAINGUARD_AGENT_SOCKET", "TRAINGUARD_AGENT_SOCKET_PATH"):
        monkeypatch.delenv(var, raising=False)
    started: list[LocalServer] = []

    def make(name: str = "n1", start: bool = True, **kw: Any) -> LocalServer:
        cfg = AgentConfig(
            node=name, simulate=1, spool_dir=tmp_path / f"spool-{name}", kmsg_path=None, **kw
        )
        local = LocalServer(build_agent(cfg))
        if start:
            local.start()
            started.append(local)
        return local

    yield make
    for local in started:
        local.stop()


def test_the_first_usable_well_known_place_is_taken(
    tmp_path: Path, monkeypatch: Any, make_local: Any
) -> None:
    (tmp_path / "file").write_text("not a folder")
    dirs = [tmp_path / "file" / "trainguard", tmp_path / "user" / "trainguard"]
    monkeypatch.setenv("TRAINGUARD_SOCKET_DIRS", os.pathsep.join(map(str, dirs)))
    local = make_local("gpu-7")
    assert local.socket_path == str(dirs[1] / "agent.sock")  # not named after the node
    assert stat.S_IMODE(os.stat(dirs[1]).st_mode) == 0o700  # a user's own folder
    assert sdk.find_socket() == (local.socket_path, "")  # the SDK looks in the same order


def test_the_shared_place_is_open_to_every_user(
    tmp_path: Path, monkeypatch: Any, make_local: Any
) -> None:
    monkeypatch.setenv("TRAINGUARD_SOCKET_DIRS", str(tmp_path / "run"))
    local = make_local()
    assert local.shared_socket
    assert stat.S_IMODE(os.stat(local.socket_path).st_mode) == 0o666


def test_a_stale_socket_is_replaced_and_a_live_one_is_not(tmp_path: Path, make_local: Any) -> None:
    path = tmp_path / "agent.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: an agent that crashed
    first = make_local(socket_path=path)
    assert sdk.probe_socket(str(path)) == ""
    second = make_local("n2", start=False, socket_path=path)
    with pytest.raises(OSError, match="another agent listens on"):
        second.start()
    assert sdk.probe_socket(first.socket_path) == ""  # still the first agent's


def test_a_configured_socket_gets_its_folder(tmp_path: Path, make_local: Any) -> None:
    path = tmp_path / "deep" / "er" / "a.sock"
    local = make_local(socket_path=path)
    assert local.socket_path == str(path) and path.exists() and not local.shared_socket
