"""samples: indexed by (bucket, gpu_id, ts), bucket = floor(ts / 8), a generated column

Indexed by (gpu_id, ts), each GPU's new samples went to a leaf page of its own. At
131,072 GPUs that is ~1 GB of index leaves written every few seconds: more than
PostgreSQL's shared_buffers, so backends evicted dirty pages themselves, and after every
checkpoint each leaf's first change wrote its whole page to the WAL again. Raw COPY in
the goal's write pattern (docs/benchmarks.md, "The samples' index"): WAL per sample grew
from 232 to 1,092 bytes and PostgreSQL's CPU per sample from 6.0 to 10.1 us within five
simulated minutes; with the bucket leading, 223-228 bytes and 5.0-6.4 us, flat.

The bucket is computed by the database (a stored generated column), so every writer, COPY
or INSERT, gets it right. PostgreSQL rewrites the table to add it; SQLite rebuilds it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# floor(ts / 8); SQLite's cast truncates, a floor for the wire's ts >= 0, and needs no
# math functions compiled into the library.
_BUCKET = {
    "postgresql": "CAST(floor(ts / 8) AS INTEGER)",
    "sqlite": "CAST(ts / 8 AS INTEGER)",
}


def upgrade() -> None:
    bucket = _BUCKET[op.get_bind().dialect.name]
    op.drop_index("ix_samples_gpu_ts", table_name="samples")
    with op.batch_alter_table("samples") as batch_op:
        batch_op.add_column(
            sa.Column("bucket", sa.Integer(), sa.Computed(bucket, persisted=True))
        )
    op.create_index("ix_samples_bucket_gpu_ts", "samples", ["bucket", "gpu_id", "ts"])


def downgrade() -> None:
    op.drop_index("ix_samples_bucket_gpu_ts", table_name="samples")
    with op.batch_alter_table("samples") as batch_op:
        batch_op.drop_column("bucket")
    op.create_index("ix_samples_gpu_ts", "samples", ["gpu_id", "ts"])
