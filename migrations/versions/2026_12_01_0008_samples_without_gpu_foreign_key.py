"""samples: no foreign key on gpu_id (half of PostgreSQL's work per stored sample)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # SQLite rebuilds the table (batch mode); PostgreSQL drops the constraint in place.
    with op.batch_alter_table("samples") as batch_op:
        batch_op.drop_constraint(op.f("fk_samples_gpu_id_gpus"), type_="foreignkey")


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch_op:
        batch_op.create_foreign_key(
            op.f("fk_samples_gpu_id_gpus"), "gpus", ["gpu_id"], ["id"], ondelete="CASCADE"
        )
