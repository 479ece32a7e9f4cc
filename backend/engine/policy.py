"""The decision policy as data: backend/policy/default.toml, merged with the user's file
(TRAINGUARD_POLICY_FILE), validated once at start.

A bad file raises `PolicyError` (a ValueError, so Settings validation reports it as a bad
setting) whose one-line message names the file, the key and, when it can be found, the
line: `policy file /etc/tg.toml: causes.exception (line 12): 'restart' is not an action
(one of: in_process, launcher, exclude_node, stop_job, reset_gpu, ignore)`.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from trainguard.backend.models.control import LADDER, ActionName

DEFAULT_POLICY_FILE = Path(__file__).resolve().parent.parent / "policy" / "default.toml"

RecoveryName = Literal[
    "in_process", "launcher", "exclude_node", "stop_job", "reset_gpu", "ignore", "bucket"
]
XidCode = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,6}$")]
RECOVERY_ACTIONS = {
    0: "NONE",
    1: "GPU_RESET",
    2: "NODE_REBOOT",
    3: "DRAIN_P2P",
    4: "DRAIN_AND_RESET",
}


def rung(action: str) -> int:
    """Position on the ladder; reset_gpu ranks with launcher, ignore below everything."""
    if action == "reset_gpu":
        return LADDER.index("launcher")
    return LADDER.index(action) if action in LADDER else -1


def next_level(level: str, hardware: bool = True) -> str:
    """One rung up. Without evidence about a node's hardware or reachability the ladder
    skips exclude_node: a restart that failed is no reason to cordon a healthy node."""
    i = rung(level)
    up = LADDER[min(i + 1, len(LADDER) - 1)]
    return "stop_job" if up == "exclude_node" and not hardware else up


def rule_of(why: str) -> str:
    """The policy key a verdict's `why` names ("bucket RESTART_BM" -> xid.buckets.RESTART_BM,
    "NVML recovery action GPU_RESET" -> xid.recovery_action.GPU_RESET, "policy causes.hang"
    -> causes.hang)."""
    if why.startswith("bucket "):
        return f"xid.buckets.{why.removeprefix('bucket ')}"
    if why.startswith("NVML recovery action "):
        return f"xid.recovery_action.{why.removeprefix('NVML recovery action ')}"
    return why.removeprefix("policy ")


class PolicyError(ValueError):
    """A policy file that cannot be used; the message is one line naming key and line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class Causes(_Strict):
    exception: ActionName
    hang: ActionName
    rank_exit: ActionName
    heartbeat_lost: ActionName
    gpu_lost: ActionName
    node_down: ActionName

    @field_validator("exception", "hang", "rank_exit", "heartbeat_lost")
    @classmethod
    def _no_harm(cls, v: str) -> str:
        if v in ("exclude_node", "reset_gpu"):
            raise ValueError(
                f"{v!r} needs evidence about a node's hardware; a job's own fault says "
                "nothing about it (use in_process, launcher, stop_job or ignore)"
            )
        return v


class Buckets(_Strict):
    RESTART_APP: ActionName
    RESET_GPU: ActionName
    RESTART_BM: ActionName
    WORKFLOW_NVLINK: ActionName
    WORKFLOW_NVLINK5: ActionName
    CONTACT_SUPPORT: ActionName
    IGNORE: ActionName
    UNKNOWN: ActionName


class RecoveryActions(_Strict):
    NONE: RecoveryName
    GPU_RESET: RecoveryName
    NODE_REBOOT: RecoveryName
    DRAIN_P2P: RecoveryName
    DRAIN_AND_RESET: RecoveryName


class Xid(_Strict):
    repeat_count: int = Field(ge=1, le=1000)
    repeat_window_s: float = Field(gt=0)
    buckets: Buckets
    codes: dict[XidCode, ActionName]
    recovery_action: RecoveryActions


class Escalation(_Strict):
    window_s: float = Field(gt=0)
    in_process: int = Field(ge=1, le=1000)
    launcher: int = Field(ge=1, le=1000)
    exclude_node: int = Field(ge=1, le=1000)
    on_failed: bool
    relaunch_wait_s: float = Field(ge=0, le=3600)
    # exclude_node ends the excluded node's launcher: SIGKILL this long after SIGTERM.
    leave_grace_s: float = Field(default=30, ge=0, le=600)


class Limits(_Strict):
    cooldown_s: float = Field(ge=0)
    budget_per_hour: int = Field(ge=0, le=100000)


class Incidents(_Strict):
    merge_window_s: float = Field(ge=0)
    max_evidence_age_s: float = Field(gt=0)


class Hooks(_Strict):
    cordon: str = Field(max_length=1000)
    uncordon: str = Field(default="", max_length=1000)
    gpu_reset: str = Field(max_length=1000)
    timeout_s: float = Field(gt=0, le=3600)


class Breaker(_Strict):
    """The blast-radius guard: automatic cordons in a rolling window are capped at
    max(1, max_fraction x the cluster's nodes); beyond it an exclusion waits for an
    operator."""

    max_fraction: float = Field(ge=0, le=1)
    window_s: float = Field(gt=0, le=7 * 86400)


class Readmission(_Strict):
    """How a node cordoned by trainguard comes back."""

    auto: bool
    readmit_after_s: float = Field(ge=0, le=30 * 86400)
    health_check: str = Field(max_length=1000)
    repair_after: int = Field(ge=1, le=1000)
    repair_window_s: float = Field(gt=0, le=365 * 86400)


class Stragglers(_Strict):
    """Straggler detection (backend/analytics); an unset key keeps the server setting
    (TRAINGUARD_STRAGGLER_*)."""

    threshold: float | None = Field(default=None, gt=0, le=1)
    unflag_threshold: float | None = Field(default=None, gt=0, le=1)
    window_steps: int | None = Field(default=None, ge=2, le=100000)
    flag_windows: int | None = Field(default=None, ge=1, le=1000)
    unflag_windows: int | None = Field(default=None, ge=1, le=1000)
    reference_quantile: float | None = Field(default=None, ge=0, le=0.5)


class _PolicyModel(_Strict):
    mode: Literal["auto", "dry_run"]
    causes: Causes
    xid: Xid
    escalation: Escalation
    limits: Limits
    incidents: Incidents
    hooks: Hooks
    breaker: Breaker
    readmission: Readmission
    stragglers: Stragglers = Stragglers()


@dataclass(frozen=True)
class Policy:
    """The validated policy; `source` says where it came from. `shadow`: the policy with
    the file's shadow rules in force (None: it has none); `shadow_rules` names them with
    the action each would take ({"causes.hang": "launcher"})."""

    model: _PolicyModel
    source: str
    shadow: Policy | None = None
    shadow_rules: dict[str, str] = field(default_factory=dict)

    @property
    def dry_run(self) -> bool:
        return self.model.mode == "dry_run"

    def cause(self, name: str) -> str:
        return str(getattr(self.model.causes, name))

    def xid_action(self, code: int, bucket: str, recovery: int | None) -> tuple[str, str]:
        """(action, why) for one XID: NVML's recovery action first (unless it says
        'bucket'), then a per-code override, then the bucket of NVIDIA's catalog."""
        x = self.model.xid
        if recovery is not None and recovery in RECOVERY_ACTIONS:
            name = RECOVERY_ACTIONS[recovery]
            mapped = str(getattr(x.recovery_action, name))
            if mapped != "bucket":
                return mapped, f"NVML recovery action {name}"
        if str(code) in x.codes:
            return x.codes[str(code)], f"policy xid.codes.{code}"
        if not hasattr(x.buckets, bucket):
            bucket = "UNKNOWN"
        return str(getattr(x.buckets, bucket)), f"bucket {bucket}"

    def straggler_overrides(self) -> dict[str, Any]:
        """The [stragglers] keys the policy sets (the rest keep the server settings)."""
        return self.model.stragglers.model_dump(exclude_none=True)

    def escalate_after(self, level: str) -> int | None:
        return getattr(self.model.escalation, level, None)

    def summary(self) -> dict[str, Any]:
        m = self.model
        return {
            "source": self.source,
            "mode": m.mode,
            "causes": m.causes.model_dump(),
            "xid_buckets": m.xid.buckets.model_dump(),
            "xid_codes": dict(m.xid.codes),
            "escalation": m.escalation.model_dump(),
            "cooldown_s": m.limits.cooldown_s,
            "budget_per_hour": m.limits.budget_per_hour,
            "merge_window_s": m.incidents.merge_window_s,
            "max_evidence_age_s": m.incidents.max_evidence_age_s,
            "stragglers": self.straggler_overrides(),
            "hooks": {
                "cordon": bool(m.hooks.cordon),
                "uncordon": bool(m.hooks.uncordon),
                "gpu_reset": bool(m.hooks.gpu_reset),
                "timeout_s": m.hooks.timeout_s,
            },
            "breaker": m.breaker.model_dump(),
            "shadow_rules": dict(self.shadow_rules),
            "readmission": {
                **m.readmission.model_dump(exclude={"health_check"}),
                "health_check": bool(m.readmission.health_check),
            },
        }


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


_HEADER = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_.-]+)\s*=""")


def _line_of(text: str, path: tuple[str, ...]) -> int | None:
    """The line that sets `path` in a TOML text ([table] headers and plain or dotted
    keys), or the line of the deepest table on the path that the text has."""
    table: tuple[str, ...] = ()
    best: int | None = None
    for n, line in enumerate(text.splitlines(), 1):
        h = _HEADER.match(line)
        if h:
            table = tuple(p.strip().strip("\"'") for p in h.group(1).split("."))
            if table and path[: len(table)] == table:
                best = n
            continue
        k = _KEY.match(line)
        if k:
            key = tuple(p.strip("\"'") for p in k.group(1).split("."))
            if table + key == path[: len(table + key)]:
                if table + key == path:
                    return n
                best = n
    return best


def _fail(source: str, text: str, path: tuple[str, ...], msg: str) -> PolicyError:
    where = ".".join(path) or "(top level)"
    line = _line_of(text, path) if path else None
    at = f" (line {line})" if line else ""
    return PolicyError(f"policy file {source}: {where}{at}: {msg}")


def _describe(err: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    # Drop pydantic's union/literal branch tags from the location.
    loc = tuple(str(p) for p in err["loc"] if not str(p).startswith(("literal[", "function-")))
    typ, msg, value = err["type"], str(err["msg"]), err.get("input")
    if loc and loc[-1] == "[key]":
        return loc[:-1], f"{value!r} is not an XID code (a number)"
    if typ == "extra_forbidden":
        return loc, "unknown key"
    if typ == "missing":
        return loc, "required key is missing"
    if typ == "literal_error":
        return loc, f"{value!r} is not allowed ({msg.removeprefix('Input should be ')})"
    return loc, f"{msg.removeprefix('Value error, ')} (got {value!r})"


# The tables whose entries are rules (evidence -> action): any of them may be written as
# a table `{action = "...", shadow = true}`, evaluated live and recorded, never acted on.
RULE_TABLES = (("causes",), ("xid", "buckets"), ("xid", "codes"), ("xid", "recovery_action"))


def _split_shadow(
    user: dict[str, Any], source: str, text: str
) -> tuple[dict[str, Any], dict[tuple[str, ...], Any]]:
    """The user's file without its shadow rules, and those rules ({path: action}). A rule
    written as a table with `shadow = false` is an ordinary rule."""
    live = _merge({}, user)
    shadow: dict[tuple[str, ...], Any] = {}
    for table in RULE_TABLES:
        node: Any = live
        for part in table:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        for key, value in list(node.items()):
            if not isinstance(value, dict):
                continue
            path = (*table, key)
            extra = sorted(set(value) - {"action", "shadow"})
            if extra or "action" not in value:
                what = f"unknown key {extra[0]!r}" if extra else "no action"
                raise _fail(source, text, path, f"a rule table takes action and shadow ({what})")
            flag = value.get("shadow", False)
            if not isinstance(flag, bool):
                raise _fail(source, text, (*path, "shadow"), f"true or false (got {flag!r})")
            if flag:
                shadow[path] = value["action"]
                del node[key]
            else:
                node[key] = value["action"]
    return live, shadow


def _validate(data: dict[str, Any], source: str, text: str) -> _PolicyModel:
    try:
        return _PolicyModel.model_validate(data)
    except ValidationError as exc:
        errs = exc.errors()
        # Unions report one error per branch: name the key once, with the clearest message.
        errs.sort(key=lambda e: e["type"] != "extra_forbidden")
        loc, msg = _describe(dict(errs[0]))
        raise _fail(source, text, loc, msg) from None


def load_policy(path: str | Path | None = None) -> Policy:
    """The default policy, with the file at `path` (if any) merged over it."""
    if path is None or str(path) == "":
        return load_policy_text(None, "default")
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise PolicyError(f"policy file {p}: cannot read: {exc.strerror or exc}") from None
    return load_policy_text(text, str(p))


def load_policy_text(text: str | None, source: str) -> Policy:
    """The default policy with `text` (TOML; None: nothing) merged over it; `source`
    names it in errors (a file's path, or what sent it: a replay request's body). Its
    shadow rules are left out of the policy in force and make `Policy.shadow`."""
    default_text = DEFAULT_POLICY_FILE.read_text()
    data = tomllib.loads(default_text)
    rules: dict[tuple[str, ...], Any] = {}
    if text is None:
        text = default_text
    else:
        try:
            user = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"policy file {source}: not valid TOML: {exc}") from None
        user, rules = _split_shadow(user, source, text)
        data = _merge(data, user)
    model = _validate(data, source, text)
    if not rules:
        return Policy(model=model, source=source)
    over: dict[str, Any] = {}
    for rule, action in rules.items():
        node = over
        for part in rule[:-1]:
            node = node.setdefault(part, {})
        node[rule[-1]] = action
    shadow = Policy(model=_validate(_merge(data, over), source, text), source=f"{source} (shadow)")
    named = {".".join(rule): str(action) for rule, action in rules.items()}
    return Policy(model=model, source=source, shadow=shadow, shadow_rules=named)
