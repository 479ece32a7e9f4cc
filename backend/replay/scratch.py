"""The replay's scratch database: a SQLite file in a folder of its own, made by the real
migrations, that nothing else opens. The live database is only read (by the export)."""

from __future__ import annotations

import shutil
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from trainguard.backend import db

TEMPLATE = "template.db"


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def migrated(folder: Path, name: str) -> tuple[Engine, sessionmaker[Session]]:
    """A fresh database `name` in `folder`, at the migrations' head. The migrations run
    once per folder (into a template, copied for each database)."""
    template = folder / TEMPLATE
    if not template.exists():
        db.upgrade(_url(template))
    path = folder / name
    shutil.copyfile(template, path)
    engine = db.make_engine(_url(path))
    return engine, sessionmaker(engine, expire_on_commit=False)
