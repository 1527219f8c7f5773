"""Token payloads compressed in place: the log's record payloads and the tree's node arrays.

Revision ID: 0007
Revises: 0006

0005 kept payloads uncompressed on the belief that token arrays barely compress. Measured by
benchmarks/bench_trees.py on a 627-request execution, pglz halves them (4.03 to 2.01 MB: the
high bytes of int32 ids are nearly always zero, provenance runs are long), and the tree's
token columns likewise. A row is compressed once it passes toast_tuple_target (lowered to
128 bytes, so a record's payload of a few hundred tokens is compressed too). Compression is
transparent to SQL: gyre_record_input_v1 and every view read the same bytes as before.
Values written before this migration stay as they were stored.
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE gyre_events ALTER COLUMN payload SET STORAGE EXTENDED;
ALTER TABLE gyre_events SET (toast_tuple_target = 128);
ALTER TABLE gyre_tree_nodes ALTER COLUMN tokens SET STORAGE EXTENDED;
ALTER TABLE gyre_tree_nodes SET (toast_tuple_target = 128);
"""

DOWNGRADE = """
ALTER TABLE gyre_tree_nodes RESET (toast_tuple_target);
ALTER TABLE gyre_tree_nodes ALTER COLUMN tokens SET STORAGE EXTERNAL;
ALTER TABLE gyre_events RESET (toast_tuple_target);
ALTER TABLE gyre_events ALTER COLUMN payload SET STORAGE EXTERNAL;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
