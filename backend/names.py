"""The path parameters that name a node or a job: the wire's names
(`trainguard.protocol.wire.Name`), so a name that no agent can send (a space, a leading
dot, over 128 characters) is a 422 naming the parameter, not a 404 for a missing job."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from trainguard.protocol.wire import NAME_PATTERN

NodeName = Annotated[str, Path(min_length=1, max_length=128, pattern=NAME_PATTERN)]
JobName = Annotated[str, Path(min_length=1, max_length=128, pattern=NAME_PATTERN)]
