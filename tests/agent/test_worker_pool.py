"""The warm worker pool and its shim (agent/worker/), with real processes.

Most tests run a torch-free pool (`--only json`: the same fork server, imports left out)
so they take milliseconds per worker; one (slow) checks the real preload. A worker run
through the shim must be indistinguishable from `python SCRIPT ARGS` for what a launcher
and a script can see: argv, environment, working directory, standard streams, exit
code, death by signal and signals relayed; and it must really have run warm (its parent
is the pool, the pool counted it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.support import wait_for
from trainguard.protocol import pool as messages
from trainguard.worker import pool_path_for, shim
from trainguard.worker.supervisor import PoolProcess, query

PY = sys.executable
SHIM = [PY, "-m", "trainguard.worker"]

PROBE = textwrap.dedent(
    """
    import json, os, random, sys
    out = {
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "env": {k: v for k, v in os.environ.items() if k.startswith("PROBE_")},
        "path0": sys.path[0],
        "name": __name__,
        "file": __file__,
        "ppid": os.getppid(),
        "pid": os.getpid(),
        "stdin": sys.stdin.read() if os.environ.get("PROBE_STDIN") else "",
        "random": random.random(),
    }
    from trainguard.sdk.identity import parent_pid
    out["launcher"] = parent_pid()
    print(json.dumps(out), flush=True)
    print("to stderr", file=sys.stderr)
    sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
    """
)


class RunningPool:
    def __init__(self, tmp: Path, size: int = 2, *extra: str) -> None:
        self.path = str(tmp / "agent.pool.sock")
        self.log = tmp / "pool.log"
        self.proc = subprocess.Popen(
            [
                PY,
                "-m",
                "trainguard.worker.pool",
                "--socket",
                self.path,
                "--size",
                str(size),
                *extra,
            ],
            stderr=self.log.open("wb"),
        )
        self.size = size

    def wait_full(self) -> dict[str, Any]:
        return wait_for(
            lambda: (st := query(self.path)) is not None and len(st["idle"]) >= self.size and st,
            60,
            0.05,
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[RunningPool]:
    p = RunningPool(tmp_path, 2, "--only", "json")
    p.wait_full()
    try:
        yield p
    finally:
        p.stop()


def script(tmp: Path, body: str = PROBE, name: str = "probe.py") -> Path:
    d = tmp / "scripts"
    d.mkdir(exist_ok=True)
    f = d / name
    f.write_text(body)
    return f


def run(
    cmd: list[str], cwd: Path, env: dict[str, str], stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=60
    )


def env_for(pool_path: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINGUARD_", "PROBE_"))}
    env["TRAINGUARD_WORKER_POOL"] = pool_path or "off"
    env["TRAINGUARD_AGENT_SOCKET"] = "/nonexistent/agent.sock"  # no agent for the SDK
    env.update(extra)
    return env


def test_a_warm_worker_gets_what_a_cold_one_gets(pool: RunningPool, tmp_path: Path) -> None:
    probe = script(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    extra = {"PROBE_A": "1", "PROBE_B": "x y", "PROBE_STDIN": "1", "PROBE_EXIT": "7"}
    args = [str(probe), "--flag", "a b", ""]
    plain = run([PY, *args], work, env_for(None, **extra), "hello\n")
    cold = run([*SHIM, *args], work, env_for(None, **extra), "hello\n")
    warm = run([*SHIM, *args], work, env_for(pool.path, **extra), "hello\n")
    outs = {}
    for name, r in (("plain", plain), ("cold", cold), ("warm", warm)):
        assert r.returncode == 7, (name, r.stderr)
        assert r.stderr.splitlines()[-1] == "to stderr", (name, r.stderr)
        outs[name] = json.loads(r.stdout)
    for key in ("argv", "cwd", "env", "path0", "name", "file", "stdin"):
        assert outs["warm"][key] == outs["plain"][key] == outs["cold"][key], key
    assert outs["warm"]["env"] == {
        "PROBE_A": "1",
        "PROBE_B": "x y",
        "PROBE_STDIN": "1",
        "PROBE_EXIT": "7",
    }
    assert outs["warm"]["stdin"] == "hello\n"
    assert outs["warm"]["ppid"] == pool.proc.pid  # it ran warm: forked by the pool
    assert outs["cold"]["ppid"] == os.getpid()  # the shim itself ran it
    # what the SDK reports as the worker's launcher: the shim's parent, as when cold
    assert outs["warm"]["launcher"] == outs["cold"]["launcher"] == os.getpid()
    assert "trainguard-worker" not in warm.stderr  # warm: nothing said
    st = query(pool.path)
    assert st is not None and st["served"] == 1


def test_two_warm_workers_draw_different_random_numbers(pool: RunningPool, tmp_path: Path) -> None:
    probe = script(tmp_path)
    got = [
        json.loads(run([*SHIM, str(probe)], tmp_path, env_for(pool.path)).stdout)["random"]
        for _ in range(2)
    ]
    assert got[0] != got[1]


def test_the_pool_refills_after_use(pool: RunningPool, tmp_path: Path) -> None:
    probe = script(tmp_path)
    before = query(pool.path)
    assert before is not None
    for _ in range(3):
        assert run([*SHIM, str(probe)], tmp_path, env_for(pool.path)).returncode == 0
    after = pool.wait_full()
    assert after["served"] == 3
    assert not set(after["idle"]) & set(before["idle"])  # the used ones were replaced
    assert after["busy"] == []


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_death_by_signal_is_the_shims_own(pool: RunningPool, tmp_path: Path, warm: bool) -> None:
    probe = script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "k.py")
    r = run([*SHIM, str(probe)], tmp_path, env_for(pool.path if warm else None))
    assert r.returncode == -signal.SIGKILL


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_sigterm_to_the_shim_reaches_the_worker(
    pool: RunningPool, tmp_path: Path, warm: bool
) -> None:
    body = textwrap.dedent(
        """
        import os, signal, sys, time
        def on_term(signum, frame):
            # os.write, not print: the signal may land while the main code is still
            # inside print("ready"), and a buffered write cannot be re-entered.
            os.write(1, b"got SIGTERM\\n")
            sys.exit(3)
        signal.signal(signal.SIGTERM, on_term)
        print("ready", os.getpid(), flush=True)
        time.sleep(60)
        """
    )
    probe = script(tmp_path, body, "t.py")
    p = subprocess.Popen(
        [*SHIM, str(probe)],
        cwd=tmp_path,
        env=env_for(pool.path if warm else None),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert p.stdout is not None
    assert p.stdout.readline().startswith("ready")
    os.killpg(p.pid, signal.SIGTERM)  # as torchrun stops its workers: the group
    assert p.wait(30) == 3
    assert p.stdout.read() == "got SIGTERM\n"


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_an_unhandled_sigterm_ends_the_shim_by_sigterm(
    pool: RunningPool, tmp_path: Path, warm: bool
) -> None:
    probe = script(tmp_path, "import time\nprint('ready', flush=True)\ntime.sleep(60)\n", "s.py")
    p = subprocess.Popen(
        [*SHIM, str(probe)],
        cwd=tmp_path,
        env=env_for(pool.path if warm else None),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == -signal.SIGTERM


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_sigkilled_shim_takes_its_warm_worker_with_it(pool: RunningPool, tmp_path: Path) -> None:
    body = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(120)\n"
    probe = script(tmp_path, body, "sleep.py")
    p = subprocess.Popen(
        [*SHIM, str(probe)], cwd=tmp_path, env=env_for(pool.path), stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    worker = int(p.stdout.readline())
    assert worker != p.pid and not _gone(worker)
    p.kill()
    p.wait(10)
    wait_for(lambda: _gone(worker), 10, 0.02)


def test_a_shim_without_a_pool_runs_cold_and_says_so_once(tmp_path: Path) -> None:
    probe = script(tmp_path)
    env = env_for(str(tmp_path / "nobody.pool.sock"), PROBE_EXIT="0")
    r = run([*SHIM, str(probe)], tmp_path, env)
    assert r.returncode == 0
    said = [line for line in r.stderr.splitlines() if line.startswith("trainguard-worker:")]
    assert len(said) == 1 and "no warm pool" in said[0] and "cold" in said[0], r.stderr
    assert json.loads(r.stdout)["ppid"] == os.getpid()


def test_the_pool_is_found_beside_the_agents_socket(pool: RunningPool, tmp_path: Path) -> None:
    """No TRAINGUARD_WORKER_POOL: the shim looks beside the agent socket the SDK finds."""
    import socket as socket_mod

    agent = tmp_path / "agent.sock"  # pool_path_for(agent) is the fixture's socket
    assert pool_path_for(agent) == pool.path
    listener = socket_mod.socket(socket_mod.AF_UNIX, socket_mod.SOCK_DGRAM)
    listener.bind(str(agent))
    try:
        env = env_for(None, TRAINGUARD_AGENT_SOCKET=str(agent))
        del env["TRAINGUARD_WORKER_POOL"]
        r = run([*SHIM, str(script(tmp_path))], tmp_path, env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["ppid"] == pool.proc.pid
    finally:
        listener.close()


def test_a_busy_pool_makes_the_shim_run_cold(tmp_path: Path) -> None:
    p = RunningPool(tmp_path, 1, "--only", "json")
    try:
        p.wait_full()
        slow = script(tmp_path, "import time\nprint('ready', flush=True)\ntime.sleep(60)\n", "w.py")
        first = subprocess.Popen(
            [*SHIM, str(slow)], cwd=tmp_path, env=env_for(p.path), stdout=subprocess.PIPE, text=True
        )
        assert first.stdout is not None and first.stdout.readline() == "ready\n"
        # the one interpreter is taken; the replacement may be ready already: take it too
        st = query(p.path)
        assert st is not None and len(st["busy"]) == 1
        second = None
        if st["idle"]:
            second = subprocess.Popen(
                [*SHIM, str(slow)],
                cwd=tmp_path,
                env=env_for(p.path),
                stdout=subprocess.PIPE,
                text=True,
            )
            assert second.stdout is not None and second.stdout.readline() == "ready\n"
        # a pool forks its replacement only while no request waits; ask until busy
        r = run([*SHIM, str(script(tmp_path))], tmp_path, env_for(p.path))
        assert r.returncode == 0
        if "busy" in r.stderr:
            assert json.loads(r.stdout)["ppid"] == os.getpid()
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait()
        st = query(p.path)
        assert st is not None and st["served"] >= 1
    finally:
        p.stop()


def test_a_preload_that_does_not_import_says_so_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            PY,
            "-m",
            "trainguard.worker.pool",
            "--socket",
            str(tmp_path / "p.sock"),
            "--only",
            "json",
            "--preload",
            "json,no_such_module_xyz",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "no_such_module_xyz" in lines[0] and "cold" in lines[0]
    assert not (tmp_path / "p.sock").exists()


def test_the_supervisor_does_not_restart_a_pool_with_a_bad_preload(tmp_path: Path) -> None:
    sup = PoolProcess(tmp_path / "p.sock", 1, ["no_such_module_xyz"])
    sup.start()
    try:
        wait_for(lambda: sup.gave_up, 60, 0.05)
        assert sup.starts == 1 and sup.stats() is None
    finally:
        sup.stop()


def test_the_supervisor_restarts_a_pool_that_died_and_reports_its_memory(tmp_path: Path) -> None:
    sup = PoolProcess(tmp_path / "p.sock", 1, [])
    sup.command = lambda: [  # type: ignore[method-assign]  # a torch-free pool for the test
        PY,
        "-m",
        "trainguard.worker.pool",
        "--socket",
        sup.pool_socket,
        "--size",
        "1",
        "--only",
        "json",
    ]
    sup.start()
    try:
        st = wait_for(lambda: (s := sup.stats()) and s["idle"] and s, 60, 0.05)
        assert st["rss_bytes"] > 0 and st["pss_bytes"] > 0 and st["cpu_s"] >= 0
        first = st["pid"]
        os.kill(first, signal.SIGKILL)
        st = wait_for(lambda: (s := sup.stats()) and s["pid"] != first and s["idle"] and s, 60, 0.1)
        assert sup.starts == 2
    finally:
        sup.stop()
    assert sup.proc is not None and sup.proc.poll() is not None


@pytest.mark.slow
def test_the_real_pool_preloads_torch_and_runs_a_worker_warm(tmp_path: Path) -> None:
    p = RunningPool(tmp_path, 1)
    try:
        st = p.wait_full()
        assert {"torch", "torch.distributed", "torch.distributed.checkpoint"} <= set(
            st["preloaded"]
        )
        body = textwrap.dedent(
            """
            import json, os, sys
            warm = "torch" in sys.modules  # before any import of ours
            import torch
            print(json.dumps({"warm": warm, "threads": torch.get_num_threads(),
                              "ppid": os.getppid()}))
            """
        )
        r = run(
            [*SHIM, str(script(tmp_path, body, "t.py"))],
            tmp_path,
            env_for(p.path, OMP_NUM_THREADS="2"),
        )
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out == {"warm": True, "threads": 2, "ppid": p.proc.pid}
    finally:
        p.stop()


def test_the_shim_imports_nothing_heavy() -> None:
    code = (
        "import sys, trainguard.worker.shim as s\n"
        "s.find_pool({'TRAINGUARD_AGENT_SOCKET': '/nonexistent'})\n"
        "print(sorted(m for m in sys.modules if m.startswith(('torch', 'msgspec', 'trainguard',"
        " 'numpy', 'pydantic'))))"
    )
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert r.stdout.split("\n")[0] == str(
        [
            "trainguard",
            "trainguard.protocol",
            "trainguard.protocol.discovery",  # the os and socket modules, no msgspec
            "trainguard.worker",
            "trainguard.worker.shim",
        ]
    )


def test_the_shims_plain_json_is_the_protocols_pool_messages() -> None:
    """The shim writes and reads the pool's messages as plain JSON (no msgspec on its
    path); they are the protocol's structs, which the pool and its interpreters decode
    strictly."""
    request = shim.run_request(["train.py", "--x"], [0, 1, 2])
    run = messages.decode_to_pool(json.dumps(request).encode())
    assert isinstance(run, messages.Run) and run.argv == ["train.py", "--x"]
    assert run.python == msgspec.convert(shim.interpreter(), messages.Interpreter)
    with pytest.raises(messages.PoolError):
        messages.decode_to_pool(json.dumps({**shim.run_request(["a"], []), "extra": 1}).encode())
    # What the shim reads of each answer: "t", then "why", "pid", "signal" or "code".
    answers = [
        messages.Refused(why="busy"),
        messages.Busy(why="busy"),
        messages.Started(pid=42),
        messages.Exit(pid=42, signal=15),
        messages.Exit(pid=42, code=3),
    ]
    read = [json.loads(messages.encode(a)) for a in answers]
    assert [r["t"] for r in read] == ["refused", "busy", "started", "exit", "exit"]
    assert (read[0]["why"], read[2]["pid"], read[3]["signal"], read[4]["code"]) == (
        "busy",
        42,
        15,
        3,
    )
    assert json.loads(messages.encode(messages.Go())) == {"t": "go"}


def _torch_free(sup: PoolProcess) -> PoolProcess:
    sup.command = lambda: [  # type: ignore[method-assign]  # a torch-free pool for the test
        *(PY, "-m", "trainguard.worker.pool", "--socket", sup.pool_socket),
        *("--size", str(sup.size), "--only", "json"),
    ]
    return sup


def test_the_agents_metrics_report_the_pool_and_its_memory(tmp_path: Path) -> None:
    import threading

    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from trainguard.agent.config import AgentConfig
    from trainguard.agent.daemon import build_agent
    from trainguard.agent.metrics import AgentExporter
    from trainguard.agent.ranks.server import LocalServer

    cfg = AgentConfig(
        node="node-7",
        server="http://backend",
        spool_dir=tmp_path / "spool",
        socket_path=tmp_path / "agent.sock",
        simulate=1,
        interval=0.05,
        pool=2,
    )
    agent = build_agent(
        cfg, transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"seq": 1}))
    )
    local = LocalServer(agent)
    pool = _torch_free(PoolProcess(pool_path_for(local.socket_path), 2))
    exporter = AgentExporter(agent, port=0, host="127.0.0.1")
    for c in (local, pool, exporter):
        agent.add_component(c)
    t = threading.Thread(target=agent.run)
    t.start()
    try:
        wait_for(lambda: (st := pool.stats()) is not None and len(st["idle"]) == 2, 60, 0.05)
        assert exporter._server is not None
        port = exporter._server.server_address[1]
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        assert got["trainguard_agent_worker_pool_idle"] == 2
        assert got["trainguard_agent_worker_pool_size"] == 2
        assert got["trainguard_agent_worker_pool_rss_bytes"] > 0
        assert got["trainguard_agent_worker_pool_pss_bytes"] > 0
        assert got["trainguard_agent_worker_pool_served_total"] == 0
        assert "worker pool x2 on" in agent.describe(agent.components, 1)
    finally:
        agent.stop()
        t.join(30)
    assert pool.proc is not None and pool.proc.poll() is not None  # stopped with the agent


def test_the_preload_setting_takes_a_comma_separated_list() -> None:
    from pydantic import ValidationError

    from trainguard.agent.config import AgentConfig

    assert AgentConfig(preload="a.b, c").preload == ["a.b", "c"]
    assert AgentConfig(preload=["x"]).preload == ["x"]
    with pytest.raises(ValidationError, match="not a module name"):
        AgentConfig(preload="a b")
