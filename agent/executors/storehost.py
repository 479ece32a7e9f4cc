"""The in-process Wrapper's TCPStore, hosted outside the training ranks.

NVRx's default store lives in rank 0's process, so losing rank 0 loses the job. Here the
agent on the job's first node hosts a long-lived TCPStore server (`StoreHost`, an agent
component, or `python -m agent.storehost --port N` standalone), and every rank's Wrapper
connects as a client through `AgentStore`, a store factory that prefixes every key with the
job run and launcher generation and reports no critical ranks (the default reports rank 0,
which makes it wait forever at termination). The application's own rendezvous store
(`app_store`) uses the same server under another prefix, fresh per Wrapper iteration.

The port is fixed and below the ephemeral range (32768-60999): a port inside it collided
with outgoing connections in 1 launch of 16 when measured here.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import threading
import warnings
from typing import Any

from trainguard.worker import PYNVML_DEPRECATED

DEFAULT_PORT = 29600


def generation() -> str:
    """One launcher generation, the same string on every node of a rendezvous round.

    Without the agent's shared store (torchrun under TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
    the README's line: TORCHELASTIC_USE_AGENT_STORE is "False") every round publishes a
    new master port, and that port alone names the round: torchrun counts a restart only
    on the node whose workers failed, so TORCHELASTIC_RESTART_COUNT differs between nodes
    after one node's restart. With the shared store the master port stays the same across
    rounds, and the restart count tells them apart."""
    port = os.environ.get("MASTER_PORT", "0")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "False":
        return f"p{port}"
    return f"g{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}p{port}"


def run_id(job: str | None = None) -> str:
    return job or os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID") or "local"


class StoreHost:
    """A TCPStore server that outlives the ranks (agent component: start/stop)."""

    def __init__(self, port: int = DEFAULT_PORT, host: str = "0.0.0.0") -> None:
        if not 0 < port < 32768:
            raise ValueError(f"store port {port} must be below the ephemeral range (< 32768)")
        self.port = port
        self.host = host
        self.store: Any = None

    def start(self) -> None:
        dist = _torch_distributed()  # the train extra; only the hosting agent needs it
        self.store = dist.TCPStore(
            self.host,
            self.port,
            world_size=None,
            is_master=True,
            timeout=datetime.timedelta(seconds=30),
            wait_for_workers=False,
            use_libuv=True,
        )

    def stop(self) -> None:
        self.store = None  # the server closes with its last reference


def _torch_distributed() -> Any:
    """torch.distributed, imported without the deprecated pynvml distribution's warning
    (torch imports pynvml; trainguard.worker.PYNVML_DEPRECATED)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PYNVML_DEPRECATED, category=FutureWarning)
        import torch.distributed as dist
    return dist


def _client(host: str, port: int, timeout: float) -> Any:
    dist = _torch_distributed()
    return dist.TCPStore(
        host,
        port,
        is_master=False,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=False,
        use_libuv=True,
    )


def _make_agent_store() -> type:
    with warnings.catch_warnings():  # torch and NVRx import the deprecated pynvml
        warnings.filterwarnings("ignore", message=PYNVML_DEPRECATED, category=FutureWarning)
        import torch.distributed as dist
        from nvidia_resiliency_ext.inprocess.store import StoreMixin

    class AgentStore(dist.PrefixStore, StoreMixin):
        """Store factory for `inprocess.Wrapper(store_factory=AgentStore, store_kwargs=...)`:
        a client of the agent-hosted server under `inprocess/<run>/<generation>/`."""

        def __init__(
            self,
            host: str = "127.0.0.1",
            port: int = DEFAULT_PORT,
            job: str | None = None,
            timeout: float = 60.0,
        ) -> None:
            prefix = f"trainguard/inprocess/{run_id(job)}/{generation()}"
            self.base_store = _client(host, port, timeout)
            super().__init__(prefix, self.base_store)

        @property
        def critical_ranks(self) -> tuple[int, ...]:
            return ()

    return AgentStore


_agent_store: type | None = None


def __getattr__(name: str) -> Any:
    # AgentStore is built on first use so that importing this module needs no torch.
    global _agent_store
    if name == "AgentStore":
        if _agent_store is None:
            _agent_store = _make_agent_store()
            _agent_store.__module__ = __name__
            _agent_store.__qualname__ = "AgentStore"
        return _agent_store
    raise AttributeError(name)


def store_kwargs(
    host: str, port: int, job: str | None = None, timeout: float = 60.0
) -> dict[str, Any]:
    return {"host": host, "port": port, "job": job, "timeout": timeout}


def app_store(
    host: str, port: int, iteration: int, job: str | None = None, timeout: float = 60.0
) -> Any:
    """The application's store for init_process_group, fresh per generation and iteration."""
    dist = _torch_distributed()
    prefix = f"trainguard/app/{run_id(job)}/{generation()}/i{iteration}"
    return dist.PrefixStore(prefix, _client(host, port, timeout))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Host the in-process Wrapper's TCPStore")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--host", default="0.0.0.0")
    args = p.parse_args(argv)
    host = StoreHost(args.port, args.host)
    host.start()
    print(f"trainguard store listening on {args.host}:{args.port}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    host.stop()


if __name__ == "__main__":
    main()
