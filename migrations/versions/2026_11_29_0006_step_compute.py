"""steps.compute_s: the rank's own work in a step, for straggler scores

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch_op:
        batch_op.add_column(sa.Column("compute_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch_op:
        batch_op.drop_column("compute_s")
