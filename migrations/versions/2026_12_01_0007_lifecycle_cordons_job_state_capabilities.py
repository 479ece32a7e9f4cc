"""lifecycle: node cordon history, job state and end, rank capabilities

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_cordons",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("by", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=True),
        sa.Column("evidence", sa.Text(), nullable=False),
        sa.Column("released_at", sa.Float(), nullable=True),
        sa.Column("released_by", sa.String(length=128), nullable=True),
        sa.Column("release_reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["incidents.id"],
            name=op.f("fk_node_cordons_incident_id_incidents"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_node_cordons_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_cordons")),
    )
    with op.batch_alter_table("node_cordons") as batch_op:
        batch_op.create_index("ix_node_cordons_node_at", ["node_id", "at"], unique=False)
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(
            sa.Column(
                "state", sa.String(length=16), server_default=sa.text("'running'"), nullable=False
            )
        )
        batch_op.add_column(sa.Column("state_since", sa.Float(), nullable=True))
        batch_op.add_column(
            sa.Column("state_reason", sa.Text(), server_default=sa.text("''"), nullable=False)
        )
        batch_op.add_column(sa.Column("ended_at", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("display_name", sa.String(length=128), nullable=True))
    with op.batch_alter_table("ranks") as batch_op:
        batch_op.add_column(sa.Column("in_process", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("launcher", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ranks") as batch_op:
        batch_op.drop_column("launcher")
        batch_op.drop_column("in_process")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("display_name")
        batch_op.drop_column("ended_at")
        batch_op.drop_column("state_reason")
        batch_op.drop_column("state_since")
        batch_op.drop_column("state")
    with op.batch_alter_table("node_cordons") as batch_op:
        batch_op.drop_index("ix_node_cordons_node_at")
    op.drop_table("node_cordons")
