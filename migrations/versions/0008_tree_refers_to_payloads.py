"""Tree nodes refer to the record payloads instead of copying their arrays.

Revision ID: 0008
Revises: 0007

Until now every unique token was stored twice: in the ``model_call.recorded`` event's payload
and again in its tree node (ids, provenance, logprobs, the trainable mask). A node now names the
event whose payload holds its tokens (``position``) and the byte offset of its slice of each
array there (``tokens_at``, ``provenance_at``, ``logprobs_at``, ``trainable_at``; the last two
only for output nodes); a split moves the lower half's offsets past the cut. ``msg_ends`` stays
in the node (the payload's ends are path offsets of the record, not of the node).
``gyre_record_input_v1`` and ``gyre_critique_tokens_v`` read through the references with
``substring``. The tree projection is derived state: its tables are emptied and its checkpoint
removed, so the next catch-up rebuilds every tree from the log (as 0006 did).
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

RECORD_INPUT = """
CREATE OR REPLACE FUNCTION gyre_record_input_v1(p_execution text, p_request text)
RETURNS integer[]
LANGUAGE sql STABLE AS $$
    WITH rec AS (
        SELECT output_node, input_len FROM gyre_tree_records
         WHERE execution_id = p_execution AND request_id = p_request
    ), blob AS (
        SELECT substring(string_agg({slice}, ''::bytea ORDER BY p.start)
                         FROM 1 FOR 4 * (SELECT input_len FROM rec)::integer) AS b
          FROM gyre_node_path_v1(p_execution, (SELECT output_node FROM rec)) p
          JOIN gyre_tree_nodes n ON n.execution_id = p_execution AND n.node_id = p.node_id
          {join}
    )
    SELECT array_agg(
               (get_byte(b, 4 * i) | (get_byte(b, 4 * i + 1) << 8) | (get_byte(b, 4 * i + 2) << 16)
                | (get_byte(b, 4 * i + 3) << 24)) ORDER BY i)
      FROM blob, generate_series(0, length(b) / 4 - 1) AS i;
$$;
"""

# substring counts from 1; tokens_at is a 0-based byte offset.
REFERRING = RECORD_INPUT.format(
    slice="substring(e.payload FROM n.tokens_at + 1 FOR 4 * n.n_tokens)",
    join="JOIN gyre_events e ON e.position = n.position",
)
COPYING = RECORD_INPUT.format(slice="n.tokens", join="")

CRITIQUE = """
CREATE VIEW gyre_critique_tokens_v AS
SELECT n.execution_id, n.node_id, n.request_id AS introduced_by, c.matching AS critique_tokens,
       c.masked AS critique_marked_trainable
  FROM gyre_tree_nodes n
  {join}
 CROSS JOIN LATERAL gyre_count_code_v1({provenance}, 5, {trainable}) AS c
 WHERE c.matching > 0;
GRANT SELECT ON gyre_critique_tokens_v TO gyre_auditor;
"""
REFERRING_CRITIQUE = CRITIQUE.format(
    join="JOIN gyre_events e ON e.position = n.position",
    provenance="substring(e.payload FROM n.provenance_at + 1 FOR n.n_tokens)",
    trainable="CASE WHEN n.trainable_at IS NULL THEN NULL "
    "ELSE substring(e.payload FROM n.trainable_at + 1 FOR n.n_tokens) END",
)
COPYING_CRITIQUE = CRITIQUE.format(join="", provenance="n.provenance", trainable="n.trainable")

UPGRADE = f"""
DROP VIEW gyre_critique_tokens_v;
TRUNCATE gyre_tree_nodes, gyre_tree_records, gyre_tree_state;
DELETE FROM gyre_checkpoints WHERE name = 'projection:trees';
ALTER TABLE gyre_tree_nodes
    DROP COLUMN tokens, DROP COLUMN provenance, DROP COLUMN logprobs, DROP COLUMN trainable,
    ADD COLUMN position bigint NOT NULL, ADD COLUMN tokens_at integer NOT NULL,
    ADD COLUMN provenance_at integer NOT NULL, ADD COLUMN logprobs_at integer,
    ADD COLUMN trainable_at integer;
{REFERRING}
{REFERRING_CRITIQUE}
"""

DOWNGRADE = f"""
DROP VIEW gyre_critique_tokens_v;
TRUNCATE gyre_tree_nodes, gyre_tree_records, gyre_tree_state;
DELETE FROM gyre_checkpoints WHERE name = 'projection:trees';
ALTER TABLE gyre_tree_nodes
    DROP COLUMN position, DROP COLUMN tokens_at, DROP COLUMN provenance_at,
    DROP COLUMN logprobs_at, DROP COLUMN trainable_at,
    ADD COLUMN tokens bytea NOT NULL, ADD COLUMN provenance bytea NOT NULL,
    ADD COLUMN logprobs bytea, ADD COLUMN trainable bytea;
ALTER TABLE gyre_tree_nodes ALTER COLUMN tokens SET STORAGE EXTENDED;
{COPYING}
{COPYING_CRITIQUE}
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
