"""ingest_batches.going_away: the reason a batch gave for its agent's graceful stop

`nodes.going_away` keeps only the last batch's (0014); a policy replay (docs/replay.md)
rebuilds the nodes' silences from the batches, and an agent's goodbye decides whether a
silence is evidence (`node_down`) or an agent gone (`agent_down`). NULL for every batch
but an agent's last before a graceful stop.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-08
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ingest_batches") as batch:
        batch.add_column(sa.Column("going_away", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ingest_batches") as batch:
        batch.drop_column("going_away")
