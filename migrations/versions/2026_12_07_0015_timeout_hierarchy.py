"""ranks.timeouts and jobs.timeout_warnings: the timeout hierarchy at job start

`ranks.timeouts`: the timeouts around each rank (wire.Timeouts: its process group's,
its launcher's, its NVRx Wrapper's, its longest checkpoint save, and trainguard's own
hang threshold and waits), as its agent last reported them; NULL: none reported (an
older agent or SDK). `jobs.timeout_warnings`: the codes of the hierarchy's rules the
job broke when last checked, so each new violation is announced by one event
(docs/restarts.md, "Timeout hierarchy").

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ranks") as batch:
        batch.add_column(sa.Column("timeouts", sa.JSON(), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("timeout_warnings", sa.JSON(), server_default=sa.text("'[]'"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("timeout_warnings")
    with op.batch_alter_table("ranks") as batch:
        batch.drop_column("timeouts")
