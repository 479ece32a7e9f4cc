"""samples: indexed by (bucket, gpu_id), without ts: an index PostgreSQL deduplicates

With a float8 in its key a btree index cannot be deduplicated (0 and -0 compare equal
but differ), so (bucket, gpu_id, ts) held an entry per sample. Without ts, a GPU's
samples of one bucket (8 at 1 Hz) share one key, and PostgreSQL keeps them as one entry
with a list of row pointers. `trainguard bench sample-index --gpus 131072 --seconds 120
--layout bucket_gpu_ts --layout bucket_gpu` (docs/benchmarks.md, "The samples' index
without ts"): 51.6 -> 13.2 index bytes per row, 4x fewer index blocks read back into
shared_buffers, 12 % less WAL per row, PostgreSQL's CPU per row the same within the
runs' spread. A read still finds a GPU's window by its buckets; the few rows of the
window's two edge buckets are filtered by ts from the table.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_samples_bucket_gpu_ts", table_name="samples")
    op.create_index("ix_samples_bucket_gpu", "samples", ["bucket", "gpu_id"])


def downgrade() -> None:
    op.drop_index("ix_samples_bucket_gpu", table_name="samples")
    op.create_index("ix_samples_bucket_gpu_ts", "samples", ["bucket", "gpu_id", "ts"])
