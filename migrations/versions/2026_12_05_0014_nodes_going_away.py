"""nodes.going_away: the reason an agent gave in its last batch before a graceful stop

An agent stopped by SIGTERM/SIGINT (an upgrade, systemctl stop) says so in its last batch
(`Batch.going_away`). The node keeps that reason until its next batch clears it: while it
is set, the node's silence reads `agent_down` (the agent is gone, not the node), and the
engine never takes that silence for evidence against the node.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("going_away", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("going_away")
