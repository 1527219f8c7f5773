"""Trajectory trees: nodes, records, per-execution state; views and input rebuild in SQL.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE TABLE gyre_tree_nodes (
    execution_id   text    NOT NULL,
    node_id        integer NOT NULL,
    parent_id      integer,
    root_id        integer NOT NULL,
    kind           text    NOT NULL,
    start          bigint  NOT NULL,
    n_tokens       integer NOT NULL,
    tokens         bytea   NOT NULL,
    provenance     bytea   NOT NULL,
    logprobs       bytea,
    trainable      bytea,
    msg_ends       bytea   NOT NULL,
    path_trainable bigint  NOT NULL,
    path_messages  integer NOT NULL,
    children       integer NOT NULL,
    request_id     text    NOT NULL,
    CONSTRAINT gyre_tree_nodes_pk PRIMARY KEY (execution_id, node_id)
);
ALTER TABLE gyre_tree_nodes ALTER COLUMN tokens SET STORAGE EXTERNAL;
CREATE INDEX gyre_tree_nodes_parent_ix ON gyre_tree_nodes (execution_id, parent_id);

CREATE TABLE gyre_tree_records (
    execution_id   text    NOT NULL,
    request_id     text    NOT NULL,
    run_id         text    NOT NULL,
    seq            integer NOT NULL,
    position       bigint  NOT NULL,
    output_node    integer NOT NULL,
    input_len      bigint  NOT NULL,
    output_len     integer NOT NULL,
    new_input_len  integer NOT NULL,
    prefix_of      text,
    prefix_len     bigint  NOT NULL,
    retry_of       text,
    superseded     boolean NOT NULL,
    agent_kind     text    NOT NULL,
    agent_id       text    NOT NULL,
    purpose        text    NOT NULL,
    leaf_class     text    NOT NULL,
    finish         text    NOT NULL,
    engine         text    NOT NULL,
    policy_version bigint,
    CONSTRAINT gyre_tree_records_pk PRIMARY KEY (execution_id, request_id)
);
CREATE INDEX gyre_tree_records_node_ix ON gyre_tree_records (execution_id, output_node);

CREATE TABLE gyre_tree_state (
    execution_id text    NOT NULL,
    next_node    integer NOT NULL,
    records      integer NOT NULL,
    first_root   integer,
    CONSTRAINT gyre_tree_state_pk PRIMARY KEY (execution_id)
);

-- The node ids from a node up to its root, nearest first.
CREATE FUNCTION gyre_node_path_v1(p_execution text, p_node integer)
RETURNS TABLE (node_id integer, start bigint, depth integer)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE up AS (
        SELECT n.node_id, n.parent_id, n.start, 0 AS depth
          FROM gyre_tree_nodes n WHERE n.execution_id = p_execution AND n.node_id = p_node
        UNION ALL
        SELECT n.node_id, n.parent_id, n.start, up.depth + 1
          FROM gyre_tree_nodes n JOIN up ON n.node_id = up.parent_id
         WHERE n.execution_id = p_execution
    )
    SELECT node_id, start, depth FROM up;
$$;

-- A record's exact input token ids, rebuilt by walking its path (int32, in order).
CREATE FUNCTION gyre_record_input_v1(p_execution text, p_request text)
RETURNS integer[]
LANGUAGE sql STABLE AS $$
    WITH rec AS (
        SELECT output_node, input_len FROM gyre_tree_records
         WHERE execution_id = p_execution AND request_id = p_request
    ), blob AS (
        SELECT substring(string_agg(n.tokens, ''::bytea ORDER BY p.start) FROM 1 FOR 4 * (SELECT input_len FROM rec)::integer) AS b
          FROM gyre_node_path_v1(p_execution, (SELECT output_node FROM rec)) p
          JOIN gyre_tree_nodes n ON n.execution_id = p_execution AND n.node_id = p.node_id
    )
    SELECT array_agg(
               (get_byte(b, 4 * i) | (get_byte(b, 4 * i + 1) << 8) | (get_byte(b, 4 * i + 2) << 16)
                | (get_byte(b, 4 * i + 3) << 24)) ORDER BY i)
      FROM blob, generate_series(0, length(b) / 4 - 1) AS i;
$$;

-- One row per record, with where it sits in its tree.
CREATE VIEW gyre_records_v AS
SELECT r.execution_id, r.request_id, r.seq, r.position, r.agent_kind, r.agent_id, r.purpose,
       r.leaf_class, r.finish, r.engine, r.policy_version, r.prefix_of, r.prefix_len,
       r.new_input_len, r.input_len, r.output_len, r.retry_of, r.superseded,
       n.root_id, r.output_node, n.path_messages AS messages_on_path
  FROM gyre_tree_records r
  JOIN gyre_tree_nodes n ON n.execution_id = r.execution_id AND n.node_id = r.output_node;

-- One row per candidate trajectory: a leaf and its root-to-leaf path.
CREATE VIEW gyre_candidate_trajectories_v AS
SELECT n.execution_id, n.node_id AS leaf_node, r.request_id, r.leaf_class, r.agent_id, n.root_id,
       n.start + n.n_tokens AS path_tokens, n.path_trainable AS trainable_tokens,
       n.path_messages AS path_messages
  FROM gyre_tree_nodes n
  JOIN gyre_tree_records r ON r.execution_id = n.execution_id AND r.output_node = n.node_id
 WHERE n.children = 0 AND NOT r.superseded;

GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON gyre_tree_nodes, gyre_tree_records, gyre_tree_state TO gyre_projector;
GRANT SELECT ON gyre_tree_nodes, gyre_tree_records, gyre_tree_state, gyre_records_v,
                gyre_candidate_trajectories_v TO gyre_auditor;
"""

DOWNGRADE = """
DROP VIEW gyre_candidate_trajectories_v;
DROP VIEW gyre_records_v;
DROP FUNCTION gyre_record_input_v1(text, text);
DROP FUNCTION gyre_node_path_v1(text, integer);
DROP TABLE gyre_tree_state;
DROP TABLE gyre_tree_records;
DROP TABLE gyre_tree_nodes;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
