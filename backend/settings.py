"""One Settings class for the backend, env prefix TRAINGUARD_ (fails fast on unsafe values)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from trainguard.backend.engine.policy import Policy


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAINGUARD_", extra="ignore")

    data_dir: Path = Field(default=Path("data"), description="SQLite file and other state")
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default sqlite:///<data_dir>/trainguard.db. "
        "PostgreSQL: postgresql+psycopg://user@host/db",
    )
    admin_token: str | None = Field(
        default=None, description="bootstrap token accepted for every role"
    )
    demo: bool = False
    # Health: a node is down after this many seconds without a batch, degraded after half.
    node_down_after_s: float = 15.0
    # Ingest limits.
    max_body_bytes: int = 8 * 1024 * 1024
    # Agents send one batch per this many seconds (told in every ingest answer); their
    # samples keep their own interval (1 s). 0: each agent sends at its sampling interval.
    # Per-request cost bounds one backend process: at 2,048 nodes x 8 GPUs it stores every
    # sample with batches every 4-8 s, not every 1 s (docs/benchmarks.md). At most a third
    # of node_down_after_s, so a healthy node never looks degraded (after half of it).
    agent_batch_interval_s: float = 0.0
    # How long a GPU's raw samples are kept (the benchmarks issue adds rollups beyond it).
    raw_retention_s: float = 6 * 3600
    # Then 60 s rollups for a week, 900 s rollups for 90 days (backend/retention.py).
    rollup_60_retention_s: float = 7 * 86400
    rollup_900_retention_s: float = 90 * 86400
    retention_interval_s: float = 60.0
    # Writer: group commit of concurrent ingest batches. A group waits up to max_delay_s
    # for company while it holds fewer than min_group_batches batches (evidence never
    # waits).
    writer_max_delay_s: float = 0.05
    writer_min_group_batches: int = Field(default=4, ge=1)
    # `trainguard server` freezes its startup heap and collects young objects less often
    # (backend/app.py: tune_gc); false keeps CPython's defaults (for comparison).
    gc_tuning: bool = True
    # Long-poll cap for agents' command requests.
    command_wait_max_s: float = 30.0
    # Analytics (docs/goodput.md). Stragglers: a rank is flagged when its relative score
    # (cohort reference step time / its median) stays below the threshold for K windows of
    # `straggler_window_steps` steps, unflagged after K' windows at or above the unflag one.
    straggler_threshold: float = 0.75
    straggler_unflag_threshold: float = 0.85
    straggler_window_steps: int = 20
    straggler_flag_windows: int = 3
    straggler_unflag_windows: int = 3
    # The cohort reference: this quantile of the ranks' medians (0 = the fastest rank).
    straggler_reference_quantile: float = 0.1
    # Period of the straggler evaluation (and the gauges' clock); 0 turns it off.
    analytics_interval_s: float = 5.0
    # How often the goodput gauges on /metrics are recomputed.
    goodput_refresh_s: float = 60.0
    # A job silent this long is over: its goodput clock stops at its last step.
    goodput_idle_after_s: float = 300.0
    # MTBF of one GPU assumed by the advice while a job has seen no failure
    # (Llama 3: 54 days x 16,384 GPUs / 419 unexpected interruptions).
    advice_mtbf_per_gpu_h: float = 50677.0
    # Decision engine (docs/engine.md): runs where this is on, while the replica leads
    # (SQLite: always; PostgreSQL: the holder of the advisory lock).
    engine_enabled: bool = True
    # Period of the engine's sweep (timeouts, silent nodes, cooldowns), at most 1 s.
    engine_sweep_s: float = Field(default=0.5, gt=0, le=1.0)
    # A policy replay (docs/replay.md) refuses a period holding more than these (its
    # scratch database and its two runs are in the server's process).
    replay_max_events: int = Field(default=200_000, ge=1)
    replay_max_incidents: int = Field(default=10_000, ge=1)
    policy_file: Path | None = Field(
        default=None,
        description="decision policy (TOML), merged over backend/policy/default.toml",
    )
    # Operator actions (restart, approve, cordon...) per principal: a token bucket.
    operator_rate_burst: int = Field(default=30, ge=1)
    operator_rate_per_min: float = Field(default=30.0, gt=0)
    alerts_file: Path | None = Field(default=None, description="alert webhooks (TOML)")
    # Where operators reach the dashboard; alert messages link to incidents under it.
    public_url: str | None = None
    frontend_dir: Path = Field(
        default=Path(__file__).resolve().parent.parent / "frontend",
        description="static UI folder served at /",
    )

    @field_validator("alerts_file", mode="before")
    @classmethod
    def _alerts_load(cls, v: object) -> object:
        from trainguard.backend.alerts.config import load_webhooks

        if v is None or v == "":
            return None
        load_webhooks(str(v))  # AlertsConfigError (a ValueError) names the webhook and key
        return v

    @field_validator("admin_token")
    @classmethod
    def _token_strength(cls, v: str | None) -> str | None:
        if v == "":
            return None  # an empty variable means "not set"
        if v is not None and len(v) < 16:
            raise ValueError("TRAINGUARD_ADMIN_TOKEN must be at least 16 characters")
        return v

    @field_validator(
        "straggler_threshold",
        "straggler_unflag_threshold",
        "straggler_window_steps",
        "straggler_flag_windows",
        "straggler_unflag_windows",
        "goodput_refresh_s",
        "goodput_idle_after_s",
        "advice_mtbf_per_gpu_h",
    )
    @classmethod
    def _analytics_positive(cls, v: float) -> float:
        # Cross-field rules (threshold <= unflag threshold, window >= 2) are checked by
        # StragglerConfig when the app is created.
        if v <= 0:
            raise ValueError("must be > 0")
        return v

    @field_validator(
        "node_down_after_s",
        "writer_max_delay_s",
        "raw_retention_s",
        "rollup_60_retention_s",
        "rollup_900_retention_s",
        "retention_interval_s",
    )
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be > 0")
        return v

    @model_validator(mode="after")
    def _batches_beat_health(self) -> Settings:
        v, limit = self.agent_batch_interval_s, self.node_down_after_s / 3
        if v < 0 or v > limit:
            raise ValueError(
                f"agent_batch_interval_s must be between 0 and a third of node_down_after_s "
                f"({limit:g} s), or healthy nodes would show as degraded; got {v:g}"
            )
        return self

    @field_validator("policy_file", mode="before")
    @classmethod
    def _policy_loads(cls, v: object) -> object:
        from trainguard.backend.engine.policy import load_policy

        if v is None or v == "":
            return None  # an empty variable means "the default policy"
        load_policy(str(v))  # a PolicyError names the key and line
        return v

    @property
    def policy(self) -> Policy:
        from trainguard.backend.engine.policy import load_policy

        return load_policy(self.policy_file)

    @property
    def url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'trainguard.db').resolve()}"

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("sqlite")


@lru_cache
def get_settings() -> Settings:
    return Settings()
