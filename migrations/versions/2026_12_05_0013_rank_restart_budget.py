"""ranks: the launcher's restart budget as each rank's environment says it

`max_restarts` (torchrun / ft_launcher `--max-restarts`, TORCHELASTIC_MAX_RESTARTS) and
`restart_count` (TORCHELASTIC_RESTART_COUNT: the restarts of it used), declared by the
SDK; NULL: unknown (an older SDK, or no such launcher). The job's restarts left are read
from its live ranks (docs/engine.md, "The launcher's restart budget").

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ranks") as batch_op:
        batch_op.add_column(sa.Column("max_restarts", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("restart_count", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ranks") as batch_op:
        batch_op.drop_column("restart_count")
        batch_op.drop_column("max_restarts")
