"""trainguard's operator client: restarts, incidents, approvals and cordons over the REST
API, typed (`trainguard.client.Client`), and the `trainguard` commands built on it.

    from trainguard.client import Client

    with Client("http://backend:8000", token) as tg:
        incident = tg.restart("llama-405b", "launcher", "NCCL hang on rank 17")

`Client` needs httpx (the `agent` or the `server` extra); the types and `ClientError`
import without it, and so does the CLI module, which says which extra is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainguard.client.models import (
    Ack,
    ClientError,
    Command,
    Decision,
    Evidence,
    Incident,
    NodeCordon,
    Timeline,
)

if TYPE_CHECKING:
    from trainguard.client.api import Client

__all__ = [
    "Ack",
    "Client",
    "ClientError",
    "Command",
    "Decision",
    "Evidence",
    "Incident",
    "NodeCordon",
    "Timeline",
]


def __getattr__(name: str) -> Any:
    if name == "Client":  # imported on first use, so that httpx is needed only then
        from trainguard.client.api import Client

        return Client
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
