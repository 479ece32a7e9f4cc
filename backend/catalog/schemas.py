"""What the catalog route answers."""

from __future__ import annotations

from pydantic import BaseModel


class XidEntry(BaseModel):
    xid: int
    meaning: str
    action: str
    action_text: str


class XidCatalog(BaseModel):
    xids: list[XidEntry]
    unknown: XidEntry
