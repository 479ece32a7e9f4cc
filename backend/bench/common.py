"""What several benchmarks share: a fresh database at the head migration."""

from __future__ import annotations

from pathlib import Path


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
