"""ingest_batches: an index on received_at, for the retention pruner to drop old keys

A batch's key (node, agent_id, seq) makes its replay a no-op. Nothing deleted the keys:
at 16,384 nodes batching every 8 s that is 2,048 rows a second, 177 M a day. The pruner
now drops keys with the raw samples' window (raw_retention_s), by this index.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_ingest_batches_received_at", "ingest_batches", ["received_at"])


def downgrade() -> None:
    op.drop_index("ix_ingest_batches_received_at", table_name="ingest_batches")
