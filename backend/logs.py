"""Structured logs: one JSON object per line, for log pipelines (Loki, Elasticsearch,
Cloud Logging) that index fields instead of parsing text.

`trainguard server --log-format json` hands `uvicorn_log_config("json", level)` to
uvicorn, so the server's own loggers, uvicorn's and the access log all write JSON to
stderr. Each line has `ts` (RFC 3339, UTC, milliseconds), `level`, `logger`, `message`,
the process id and, when there is one, `exc` (the traceback as one string). Access-log
lines add `client`, `method`, `path`, `http_version` and `status` as fields (the
`access_token` query parameter is already redacted by the app's filter). Fields passed
with `log.info(..., extra={...})` become fields of the line.

Standard library only, so any process of the distribution can use it.
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import time
from typing import Any, Literal

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has: anything else on a record came from `extra=`.
_STANDARD = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "color_message", "taskName"}
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status")


class JsonFormatter(logging.Formatter):
    def __init__(self, *args: Any, service: str = "trainguard", **kwargs: Any) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "service": self.service,
            "pid": record.process,
        }
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            out.update(zip(_ACCESS_FIELDS, args, strict=True))
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def _rfc3339(ts: float) -> str:
    t = time.gmtime(ts)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(ts % 1 * 1000):03d}Z"


def _formatter(fmt: LogFormat) -> dict[str, Any]:
    if fmt == "json":
        return {"()": "trainguard.backend.logs.JsonFormatter"}
    return {"format": TEXT_FORMAT}


def uvicorn_log_config(fmt: LogFormat = "text", level: str = "info") -> dict[str, Any]:
    """A logging dictConfig for `uvicorn.run(log_config=...)`: the root logger (the
    app's own), uvicorn's and the access log, in one format, to stderr."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be text or json, got {fmt!r}")
    lvl = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"main": _formatter(fmt)},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "main",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": lvl},
        "loggers": {
            # uvicorn's loggers propagate to the root's one handler (no duplicates).
            "uvicorn": {"handlers": [], "level": lvl, "propagate": True},
            "uvicorn.error": {"handlers": [], "level": lvl, "propagate": True},
            "uvicorn.access": {"handlers": [], "level": lvl, "propagate": True},
            "httpx": {"level": "WARNING"},
        },
    }


def configure(fmt: LogFormat = "text", level: str = "info") -> None:
    """The same configuration for a process that does not run uvicorn."""
    logging.config.dictConfig(uvicorn_log_config(fmt, level))


def format_from_env(default: LogFormat = "text") -> LogFormat:
    raw = os.environ.get("TRAINGUARD_LOG_FORMAT", default).strip().lower() or default
    if raw not in ("text", "json"):
        raise ValueError(f"TRAINGUARD_LOG_FORMAT must be text or json, got {raw!r}")
    return raw  # type: ignore[return-value]  # checked text or json above
