"""Tree topology beside the nodes: admission reads one row and no token.

Revision ID: 0006
Revises: 0005

``gyre_tree_state.topology`` holds each execution's parents, path offsets, trainable counts
and candidate leaves (``gyre_store.trees.topology``). The tree projection is derived state:
its tables are emptied and its checkpoint removed, so the next catch-up rebuilds every tree,
topology included, from the log.
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UPGRADE = """
TRUNCATE gyre_tree_nodes, gyre_tree_records, gyre_tree_state;
DELETE FROM gyre_checkpoints WHERE name = 'projection:trees';
ALTER TABLE gyre_tree_state ADD COLUMN topology bytea NOT NULL;
"""

DOWNGRADE = """
TRUNCATE gyre_tree_nodes, gyre_tree_records, gyre_tree_state;
DELETE FROM gyre_checkpoints WHERE name = 'projection:trees';
ALTER TABLE gyre_tree_state DROP COLUMN topology;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
