"""The timeouts a rank can read about itself, for the timeout hierarchy (docs/restarts.md):
its torch.distributed default process group's, its launcher's (from the launcher's
command line and the environment), its NVRx Wrapper's. Standard library only; nothing is
imported: torch is read only when the script loaded it, the Wrapper only when it runs.

Every function answers a dict keyed by the field names of `wire.Timeouts` (seconds), with
what it could read; an unreadable or absent value is left out.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from trainguard.protocol.launchers import parse_launcher

# NVRx FaultToleranceConfig's defaults (0.4.1 to 0.7.0, fault_tolerance/config.py): what
# ft_launcher uses for a value its arguments and --ft-cfg-path leave out.
FT_DEFAULTS = {
    "launcher_heartbeat_s": 2700.0,  # rank_heartbeat_timeout
    "launcher_initial_heartbeat_s": 3600.0,  # initial_rank_heartbeat_timeout
    "launcher_check_interval_s": 5.0,  # workload_check_interval
}
# Both launchers' --monitor-interval default (torch 2.13 run.py, NVRx launcher.py).
MONITOR_INTERVAL_DEFAULT = 0.1

# The launchers' options, every spelling (torch/distributed/run.py; NVRx 0.4.1
# fault_tolerance/launcher.py with its deprecated --ft-param-*; 0.6 and 0.7 cli_args.py).
_FT_CONFIG = {
    "workload_check_interval": "launcher_check_interval_s",
    "initial_rank_heartbeat_timeout": "launcher_initial_heartbeat_s",
    "rank_heartbeat_timeout": "launcher_heartbeat_s",
}
_OPTIONS: dict[str, str] = {"--monitor-interval": "monitor_interval_s"}
for _name, _key in _FT_CONFIG.items():
    _OPTIONS[f"--ft-{_name.replace('_', '-')}"] = _key
    _OPTIONS[f"--ft-{_name}"] = _key
    _OPTIONS[f"--ft-param-{_name}"] = _key
_OPTIONS["--monitor_interval"] = "monitor_interval_s"
_CFG_OPTIONS = ("--ft-cfg-path", "--ft-cfg_path", "--fault-tol-cfg-path")
_NO_VALUE = ("none", "null", "")  # NVRx 0.6+: "no timeout"


def launcher_cmdline(pid: int) -> list[str]:
    """The command line of process `pid` (empty when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def launcher_timeouts(argv: Sequence[str], env: Mapping[str, str]) -> dict[str, float]:
    """The launcher's worker monitor interval and, for ft_launcher, its rank heartbeat
    timeouts and check interval, from its command line `argv` (as /proc/<pid>/cmdline
    has it: the interpreter, the launcher, its options, the script) and the environment
    (torchrun's `PET_<OPTION>` variables, which its options default to). A value given as
    "none" (no timeout) is left out. Empty when `argv` is no torchrun or ft_launcher."""
    which, options = _launcher_options(argv)
    if which is None:
        return {}
    out: dict[str, float] = {}
    with contextlib.suppress(ValueError):
        out["monitor_interval_s"] = float(env.get("PET_MONITOR_INTERVAL", ""))
    if which == "ft_launcher":
        out.update(FT_DEFAULTS)
        cfg = options.pop("cfg", None) or env.get("PET_FT_CFG_PATH")
        if cfg:
            out.update(_ft_config_file(cfg))
    else:
        options.pop("cfg", None)
    out.setdefault("monitor_interval_s", MONITOR_INTERVAL_DEFAULT)
    for key, text in options.items():
        if which == "torchrun" and key != "monitor_interval_s":
            continue  # torchrun has no heartbeat timeouts
        if text.strip().lower() in _NO_VALUE:
            out.pop(key, None)
            continue
        with contextlib.suppress(ValueError):
            out[key] = float(text)
    return out


def _launcher_options(argv: Sequence[str]) -> tuple[str | None, dict[str, str]]:
    """Which launcher `argv` runs and its options that set timeouts ({key: text}, and
    "cfg": the --ft-cfg-path file), up to the training script (the protocol's parser,
    which the agent reads launchers with too)."""
    line = parse_launcher(argv)
    found: dict[str, str] = {}
    for name, value in line.options.items():
        if name in _OPTIONS:
            found[_OPTIONS[name]] = value
        elif name in _CFG_OPTIONS:
            found["cfg"] = value
    return line.launcher, found


_CFG_LINE = re.compile(r"^\s+([a-z_]+)\s*:\s*([^#\s]*)\s*(#.*)?$")


def _ft_config_file(path: str) -> dict[str, float]:
    """The heartbeat timeouts and check interval of an ft_launcher `--ft-cfg-path` YAML
    file (its `fault_tolerance:` section, read line by line: the SDK has no YAML parser;
    a file it cannot read gives nothing, and the defaults stand)."""
    out: dict[str, float] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return out
    inside = False
    for line in lines:
        if line and not line[0].isspace():
            inside = line.split("#", 1)[0].strip() == "fault_tolerance:"
            continue
        m = _CFG_LINE.match(line) if inside else None
        if m and m.group(1) in _FT_CONFIG:
            key = _FT_CONFIG[m.group(1)]
            if m.group(2).lower() in ("null", "none", "~", ""):
                out[key] = -1.0  # no timeout: removed below
            else:
                with contextlib.suppress(ValueError):
                    out[key] = float(m.group(2))
    return {k: v for k, v in out.items() if v >= 0}


def wrapper_timeouts(wrapper: object) -> dict[str, float]:
    """The timeouts of NVRx's `inprocess.Wrapper` (datetime.timedelta attributes, the
    same names from 0.4.1 to 0.7.0)."""
    out: dict[str, float] = {}
    for attr, key in (
        ("soft_timeout", "wrapper_soft_s"),
        ("hard_timeout", "wrapper_hard_s"),
        ("heartbeat_timeout", "wrapper_heartbeat_s"),
        ("barrier_timeout", "wrapper_barrier_s"),
        ("completion_timeout", "wrapper_completion_s"),
    ):
        seconds = getattr(getattr(wrapper, attr, None), "total_seconds", None)
        if callable(seconds):
            with contextlib.suppress(Exception):
                out[key] = float(seconds())
    return out


def collective_timeout() -> dict[str, Any]:
    """The timeout of torch.distributed's default process group, as its backend holds it
    (`_get_default_group()._get_backend(device).options._timeout`, what
    `init_process_group(timeout=...)` set, torch 2.x), and the backend's name. Empty when
    the script did not load torch.distributed or has no default group now. Safe from
    another thread: the training thread may destroy the group meanwhile."""
    dist: Any = sys.modules.get("torch.distributed")
    torch: Any = sys.modules.get("torch")
    if dist is None or torch is None:
        return {}
    try:
        if not dist.is_available() or not dist.is_initialized():
            return {}
        pg = dist.distributed_c10d._get_default_group()
        name = str(dist.get_backend(pg))
        for device in ("cuda", "cpu"):
            with contextlib.suppress(Exception):
                backend = pg._get_backend(torch.device(device))
                seconds = float(backend.options._timeout.total_seconds())
                return {"collective_s": seconds, "collective_backend": name}
    except Exception:  # any state of a group being torn down: unknown this time
        return {}
    return {}


FT_HEARTBEAT_KEYS = (
    "launcher_heartbeat_s",
    "launcher_initial_heartbeat_s",
    "launcher_check_interval_s",
)
RANK_MONITOR_ENV = "FT_RANK_MONITOR_IPC_SOCKET"  # ft_launcher's rank monitor, per worker


def sends_ft_heartbeats(path: str | None) -> bool:
    """Whether this process is connected to ft_launcher's rank monitor at `path` (NVRx's
    RankMonitorClient connects a Unix stream socket there): only then do the launcher's
    heartbeat timeouts apply to it (the monitor checks them once a rank connected)."""
    if not path:
        return False
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for name in fds:
        with contextlib.suppress(OSError, ValueError):
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            dup = os.dup(fd)
            try:
                sock = socket.socket(fileno=dup)
            except OSError:
                os.close(dup)
                continue
            try:
                if sock.family == socket.AF_UNIX and sock.getpeername() == path:
                    return True
            finally:
                sock.close()
    return False


class RankTimeouts:
    """What a session reports as its rank's timeouts: the launcher's (read once, from the
    launcher process `launcher_pid`; its heartbeat timeouts only once the rank is seen
    connected to its rank monitor), the Wrapper's (once the session finds it running),
    the longest checkpoint save so far, and the process group's (read at every report:
    a Wrapper's restart makes a new group; the last one read stands while there is none,
    between two groups and after the last one is destroyed)."""

    def __init__(self, launcher_pid: int, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.launcher = launcher_timeouts(launcher_cmdline(launcher_pid), env)
        self.rank_monitor = env.get(RANK_MONITOR_ENV)
        self.ft_heartbeats = False
        self.wrapper: dict[str, float] | None = None  # None: no Wrapper found yet
        self.checkpoint_save_s: float | None = None
        self.collective: dict[str, Any] = {}

    def look_for_ft_heartbeats(self) -> None:
        """From the heartbeat thread, now and then, until found."""
        if not self.ft_heartbeats and self.rank_monitor:
            self.ft_heartbeats = sends_ft_heartbeats(self.rank_monitor)

    def saved(self, phase: str, seconds: float) -> None:
        """A checkpoint phase ended after `seconds` of blocking time; saves count."""
        if phase == "save" and seconds > (self.checkpoint_save_s or 0.0):
            self.checkpoint_save_s = seconds

    def current(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.launcher)
        if not self.ft_heartbeats:
            for key in FT_HEARTBEAT_KEYS:
                out.pop(key, None)
        out.update(self.wrapper or {})
        self.collective = collective_timeout() or self.collective
        out.update(self.collective)
        if self.checkpoint_save_s is not None:
            out["checkpoint_save_s"] = round(self.checkpoint_save_s, 6)
        return out
