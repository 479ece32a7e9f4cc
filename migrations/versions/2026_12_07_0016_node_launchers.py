"""node_launchers: the job launchers on each node, hot spares included (the job's shape)

Each row is a torchrun or ft_launcher of a job on a node as its agent last listed them
(wire.Batch.launchers): `active` (ranks of the job run under it), `spare` (waiting in
the rendezvous beyond --nnodes MAX), `restarting`; with its --nnodes MIN:MAX. A node's
rows are replaced by each list its agent sends (docs/engine.md, "The job's shape").

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_launchers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("launcher", sa.String(length=16), nullable=False),
        sa.Column("min_nodes", sa.Integer(), nullable=True),
        sa.Column("max_nodes", sa.Integer(), nullable=True),
        sa.Column("ranks", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("reported_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_node_launchers_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_node_launchers_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_launchers")),
    )
    op.create_index(op.f("ix_node_launchers_job_id"), "node_launchers", ["job_id"])
    op.create_index(op.f("ix_node_launchers_node_id"), "node_launchers", ["node_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_node_launchers_node_id"), table_name="node_launchers")
    op.drop_index(op.f("ix_node_launchers_job_id"), table_name="node_launchers")
    op.drop_table("node_launchers")
