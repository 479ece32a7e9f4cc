"""sample rollups: 60 s and 900 s aggregates kept after raw samples expire

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sample_rollups",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("width_s", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.Float(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("util", sa.REAL(), nullable=True),
        sa.Column("util_max", sa.REAL(), nullable=True),
        sa.Column("mem_util", sa.REAL(), nullable=True),
        sa.Column("mem_used_mib", sa.REAL(), nullable=True),
        sa.Column("temp_c", sa.REAL(), nullable=True),
        sa.Column("temp_max", sa.REAL(), nullable=True),
        sa.Column("power_w", sa.REAL(), nullable=True),
        sa.Column("sm_clock_mhz", sa.REAL(), nullable=True),
        sa.Column("mem_clock_mhz", sa.REAL(), nullable=True),
        sa.Column("ecc_sbe_volatile", sa.BigInteger(), nullable=True),
        sa.Column("ecc_dbe_volatile", sa.BigInteger(), nullable=True),
        sa.Column("remapped_uncorrectable", sa.Integer(), nullable=True),
        sa.Column("pcie_replay", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name=op.f("fk_sample_rollups_gpu_id_gpus"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("gpu_id", "width_s", "bucket", name=op.f("pk_sample_rollups")),
    )
    # The pruner deletes expired raw samples by time across all GPUs.
    with op.batch_alter_table("samples") as batch_op:
        batch_op.create_index("ix_samples_ts", ["ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch_op:
        batch_op.drop_index("ix_samples_ts")
    op.drop_table("sample_rollups")
