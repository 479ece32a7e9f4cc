"""Node agent settings: one pydantic-settings class, env prefix `TRAINGUARD_AGENT_`.

Validators fail fast on values that would make the agent misbehave quietly (a zero
interval spins a core, a node name the wire refuses gets every batch rejected).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from trainguard.protocol.wire import MAX_GPUS

MIB = 1024 * 1024
# The wire's `Name` pattern (agent/wire.py); a node outside it is refused by the backend.
_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")


def _default_node() -> str:
    return socket.gethostname()


def _default_spool_dir(data: dict[str, Any]) -> Path:
    node = str(data.get("node") or _default_node())
    return Path.home() / ".local" / "state" / "trainguard" / "spool" / node.replace("/", "_")


class AgentConfig(BaseSettings):
    """Everything one node agent needs; each field can come from `TRAINGUARD_AGENT_<NAME>`."""

    # populate_by_name: `socket_path` in arguments and the config file, next to its aliases
    model_config = SettingsConfigDict(
        env_prefix="TRAINGUARD_AGENT_", extra="ignore", populate_by_name=True
    )

    # node first: the spool's default folder is derived from it.
    node: str = Field(default_factory=_default_node)
    spool_dir: Path = Field(default_factory=_default_spool_dir)
    # The SDK socket. None: the well-known one, not named after the node, which the SDK
    # finds with no setting (trainguard.sdk.socket_candidates: /run/trainguard/agent.sock as
    # root, else $XDG_RUNTIME_DIR/trainguard/ or /tmp/trainguard-<uid>/). The variable
    # TRAINGUARD_AGENT_SOCKET, which the SDK reads too, sets it on both sides;
    # TRAINGUARD_AGENT_SOCKET_PATH (this agent's alone) wins when both are set.
    socket_path: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("TRAINGUARD_AGENT_SOCKET_PATH", "TRAINGUARD_AGENT_SOCKET"),
    )
    server: str = "http://127.0.0.1:8000"
    token: str = Field(default="", repr=False)
    simulate: int | None = None
    seed: int = 0  # simulated readings and faults are repeatable from (seed, node)
    interval: float = 1.0
    spool_max_bytes: int = 256 * MIB
    kmsg_path: Path | None = Path("/dev/kmsg")
    inventory_every_s: float = 60.0
    # Host the NVRx Wrapper's TCPStore on this port (the job's first node), so the store
    # outlives every rank and a rank 0 fault is survivable (docs/restarts.md).
    store_port: int | None = Field(default=None, gt=0, lt=32768)
    store_host: str = "0.0.0.0"
    # Prometheus exporter (agent/metrics.py): dcgm-exporter-compatible GPU metrics.
    metrics_port: int | None = Field(default=None, ge=0, lt=65536)
    metrics_host: str = "0.0.0.0"
    # The warm worker pool (agent/worker/, docs/restarts.md "The warm pool"): this many
    # interpreters with torch, DCP and NVRx imported, for the workers that the shim
    # (`trainguard-worker`) starts; 0 is off. `preload`: more modules the pool imports.
    # `pool_python`: the workers' interpreter (default: the agent's own).
    pool: int = Field(default=0, ge=0, le=256)
    preload: list[str] = Field(default_factory=list)
    pool_python: str | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then TRAINGUARD_AGENT_* variables, then the config file
        (TRAINGUARD_AGENT_CONFIG, default /etc/trainguard/agent.toml; absent is fine)."""
        path = os.environ.get("TRAINGUARD_AGENT_CONFIG", "/etc/trainguard/agent.toml")
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, path))

    @field_validator("server")
    @classmethod
    def _server_is_http(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"server must be an http:// or https:// URL, got {v!r}")
        return v

    @field_validator("node")
    @classmethod
    def _node_is_wire_name(cls, v: str) -> str:
        if not (1 <= len(v) <= 128 and _NODE_RE.match(v)):
            raise ValueError(
                f"node {v!r} is not a valid name (1-128 chars: letters, digits, ._:@/-; "
                "starting with a letter or digit)"
            )
        return v

    @field_validator("simulate")
    @classmethod
    def _simulate_in_range(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= MAX_GPUS:
            raise ValueError(f"simulate must be between 1 and {MAX_GPUS} GPUs, got {v}")
        return v

    @field_validator("interval")
    @classmethod
    def _interval_sane(cls, v: float) -> float:
        if not 0.01 <= v <= 3600:
            raise ValueError(f"interval must be between 0.01 and 3600 seconds, got {v}")
        return v

    @field_validator("inventory_every_s")
    @classmethod
    def _inventory_sane(cls, v: float) -> float:
        if not 1.0 <= v <= 86400:
            raise ValueError(f"inventory_every_s must be between 1 and 86400, got {v}")
        return v

    @field_validator("spool_max_bytes")
    @classmethod
    def _spool_cap_sane(cls, v: int) -> int:
        if v < MIB:
            raise ValueError(f"spool_max_bytes must be at least 1 MiB ({MIB}), got {v}")
        return v

    @field_validator("preload", mode="before")
    @classmethod
    def _preload_list(cls, v: Any) -> Any:
        """A comma-separated string (the CLI, TRAINGUARD_AGENT_PRELOAD) or a list."""
        if isinstance(v, str):
            v = v.split(",")
        if isinstance(v, list | tuple):
            names = [str(m).strip() for m in v if str(m).strip()]
            for m in names:
                if not re.match(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$", m):
                    raise ValueError(f"preload {m!r} is not a module name")
            return names
        return v

    @field_validator("socket_path", mode="before")
    @classmethod
    def _empty_socket_is_default(cls, v: Any) -> Any:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("spool_dir", "socket_path")
    @classmethod
    def _expand(cls, v: Path | None) -> Path | None:
        return v.expanduser() if v is not None else None

    @property
    def ingest_url(self) -> str:
        return f"{self.server}/api/v1/ingest"
