"""What several benchmarks share: a fresh database at the head migration, a busy GPU's
sample, a process's resident memory and CPU time."""

from __future__ import annotations

import os
from pathlib import Path

from trainguard.protocol import wire


def fresh_database(data_dir: Path, database_url: str | None, filename: str) -> str:
    """The benchmark's database URL, migrated to head: `database_url` as given, or a new
    SQLite file `filename` in `data_dir` (an old one is removed with its WAL files, which
    SQLite would otherwise replay into the new file)."""
    from trainguard.backend import db

    data_dir.mkdir(parents=True, exist_ok=True)
    url = database_url or f"sqlite:///{(data_dir / filename).resolve()}"
    if url.startswith("sqlite"):
        for suffix in ("", "-wal", "-shm"):
            Path(url.split("///", 1)[1] + suffix).unlink(missing_ok=True)
    db.upgrade(url)
    return url


def rss_cpu(pid: int) -> tuple[float, float]:
    """A live process's resident memory (MiB) and user + system CPU time (s) so far."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, cpu


def busy_sample(uuid: str, ts: float) -> wire.GpuSample:
    """One sample of a busy, healthy H100-class GPU, as the agent sends it."""
    return wire.GpuSample(
        uuid=uuid,
        ts=ts,
        util=90.0,
        mem_util=40.0,
        mem_used_mib=60000.0,
        temp_c=65.0,
        power_w=650.0,
        sm_clock_mhz=1980.0,
        mem_clock_mhz=2619.0,
        ecc_sbe_volatile=0,
        ecc_dbe_volatile=0,
        pcie_replay=0,
    )
