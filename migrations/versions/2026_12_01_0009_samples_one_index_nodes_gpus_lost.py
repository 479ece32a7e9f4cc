"""samples: one index, (gpu_id, ts), no surrogate id; nodes.gpus_lost kept by the writer

On PostgreSQL every stored sample paid for a heap row and three index entries: the id's
primary key (and its sequence), (gpu_id, ts) and ts alone. Each index cost about as much
as the heap row (COPY of 1.3 M rows: 7.2-9.2 us of PostgreSQL CPU per row before, 4.6
after; docs/benchmarks.md). Nothing reads a sample by its id, and the retention pruner,
the only reader of ts alone, walks (gpu_id, ts) GPU by GPU instead.

The id was read in one place: the latest sample of each GPU, to count a node's lost GPUs
on every /nodes read. The writer now keeps that count per node (`gpus_lost`, beside
util_avg and temp_max); this migration fills it from each GPU's latest sample.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The sample's readings at this revision (a GPU whose latest sample has none is lost).
_READINGS = (
    "util",
    "mem_util",
    "mem_used_mib",
    "mem_total_mib",
    "temp_c",
    "mem_temp_c",
    "power_w",
    "energy_mj",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "clock_event_reasons",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "remapped_correctable",
    "remapped_uncorrectable",
    "remap_pending",
    "remap_failure",
    "pcie_replay",
)
_FILL_GPUS_LOST = f"""
UPDATE nodes SET gpus_lost = (
    SELECT count(DISTINCT g.id) FROM gpus g JOIN samples s ON s.gpu_id = g.id
    WHERE g.node_id = nodes.id
      AND s.ts = (SELECT max(s2.ts) FROM samples s2 WHERE s2.gpu_id = g.id)
      AND {" AND ".join(f"s.{c} IS NULL" for c in _READINGS)}
)
"""


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch_op:
        batch_op.add_column(
            sa.Column("gpus_lost", sa.Integer(), server_default="0", nullable=False)
        )
    op.execute(_FILL_GPUS_LOST)
    # PostgreSQL drops the primary key and the id's sequence with the column, in place;
    # SQLite rebuilds the table (batch mode).
    op.drop_index("ix_samples_ts", table_name="samples")
    with op.batch_alter_table("samples") as batch_op:
        batch_op.drop_column("id")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE samples ADD COLUMN id BIGSERIAL PRIMARY KEY")
    else:
        # SQLite: a rebuilt table whose INTEGER PRIMARY KEY numbers the copied rows.
        with op.batch_alter_table("samples", recreate="always") as batch_op:
            batch_op.add_column(
                sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True)
            )
    op.create_index("ix_samples_ts", "samples", ["ts"], unique=False)
    with op.batch_alter_table("nodes") as batch_op:
        batch_op.drop_column("gpus_lost")
