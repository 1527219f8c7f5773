"""Evaluations, rewards and rollout groups; the SQL audit views of reward provenance.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE TABLE gyre_artifacts (
    execution_id       text   NOT NULL,
    artifact_version   text   NOT NULL,
    run_id             text   NOT NULL,
    branch_refs        jsonb  NOT NULL,
    location           text   NOT NULL,
    preserved_position bigint NOT NULL,
    CONSTRAINT gyre_artifacts_pk PRIMARY KEY (execution_id, artifact_version)
);

CREATE TABLE gyre_evaluations (
    evaluation_id    text             NOT NULL,
    execution_id     text             NOT NULL,
    run_id           text             NOT NULL,
    attempt          integer          NOT NULL,
    evaluator        text             NOT NULL,
    artifact_version text             NOT NULL,
    branch_refs      jsonb            NOT NULL,
    status           text             NOT NULL,
    error_kind       text,
    score            double precision,
    score_low        double precision,
    score_high       double precision,
    finish_reason    text,
    critique         text             NOT NULL,
    detail           text             NOT NULL,
    position         bigint           NOT NULL,
    CONSTRAINT gyre_evaluations_pk PRIMARY KEY (evaluation_id)
);
CREATE INDEX gyre_evaluations_execution_ix ON gyre_evaluations (execution_id, position);

CREATE TABLE gyre_rewards (
    execution_id     text             NOT NULL,
    run_id           text             NOT NULL,
    status           text             NOT NULL,
    reward           double precision,
    evaluation_id    text,
    artifact_version text,
    branch_refs      jsonb,
    reason           text             NOT NULL,
    attempts         integer,
    error            text,
    position         bigint           NOT NULL,
    CONSTRAINT gyre_rewards_pk PRIMARY KEY (execution_id)
);

CREATE TABLE gyre_groups (
    group_id          text    NOT NULL,
    run_id            text    NOT NULL,
    query_id          text    NOT NULL,
    size              integer NOT NULL,
    policy_version    bigint  NOT NULL,
    dispatched        integer NOT NULL,
    surplus           integer NOT NULL,
    closed            integer NOT NULL,
    valid             integer NOT NULL,
    placeholders      integer NOT NULL,
    excluded          integer NOT NULL,
    status            text    NOT NULL,
    error             text,
    ready_position    bigint,
    consumed_step     bigint,
    consumed_position bigint,
    CONSTRAINT gyre_groups_pk PRIMARY KEY (group_id)
);
CREATE INDEX gyre_groups_status_ix ON gyre_groups (status, policy_version, ready_position);

CREATE TABLE gyre_group_members (
    execution_id        text             NOT NULL,
    group_id            text             NOT NULL,
    run_id              text             NOT NULL,
    policy_version      bigint           NOT NULL,
    finish_reason       text,
    outcome             text,
    reward              double precision,
    dispatched_position bigint           NOT NULL,
    CONSTRAINT gyre_group_members_pk PRIMARY KEY (execution_id)
);
CREATE INDEX gyre_group_members_group_ix ON gyre_group_members (group_id);

-- How many bytes of a bytea equal v (a token provenance code), and how many of those are
-- also marked 1 in a parallel mask (NULL mask: none).
CREATE FUNCTION gyre_count_code_v1(b bytea, v integer, mask bytea DEFAULT NULL)
RETURNS TABLE (matching integer, masked integer)
LANGUAGE sql IMMUTABLE AS $$
    SELECT count(*)::integer,
           count(*) FILTER (WHERE mask IS NOT NULL AND get_byte(mask, i) = 1)::integer
      FROM generate_series(0, length(b) - 1) AS i
     WHERE get_byte(b, i) = v;
$$;

-- Every decided outcome with the evaluation, artifact version and branches behind it, its
-- group, how the execution closed and the training step that used it (if any).
CREATE VIEW gyre_reward_provenance_v AS
SELECT r.execution_id, r.run_id, m.group_id, g.policy_version AS dispatch_policy_version,
       r.status AS outcome, r.reward, r.reason, r.evaluation_id,
       e.evaluator, e.attempt, e.score, e.score_low, e.score_high,
       COALESCE(r.artifact_version, e.artifact_version) AS artifact_version,
       COALESCE(r.branch_refs, e.branch_refs) AS branch_refs,
       COALESCE(e.finish_reason, m.finish_reason) AS finish_reason,
       COALESCE(e.finish_reason, m.finish_reason) IN ('harness_timeout', 'overall_timeout') AS partial,
       e.position AS evaluation_position, r.position AS outcome_position,
       g.consumed_step AS training_step
  FROM gyre_rewards r
  LEFT JOIN gyre_evaluations e ON e.evaluation_id = r.evaluation_id
  LEFT JOIN gyre_group_members m ON m.execution_id = r.execution_id
  LEFT JOIN gyre_groups g ON g.group_id = m.group_id;

-- The rewards a training step used: one row per execution of every group the step consumed.
CREATE VIEW gyre_step_rewards_v AS
SELECT g.run_id, g.consumed_step AS step, g.group_id, g.policy_version AS dispatch_policy_version,
       m.execution_id, r.status AS outcome, r.reward, r.evaluation_id, e.evaluator,
       COALESCE(r.artifact_version, e.artifact_version) AS artifact_version,
       COALESCE(r.branch_refs, e.branch_refs) AS branch_refs,
       e.finish_reason, r.reason
  FROM gyre_groups g
  JOIN gyre_group_members m ON m.group_id = g.group_id
  LEFT JOIN gyre_rewards r ON r.execution_id = m.execution_id
  LEFT JOIN gyre_evaluations e ON e.evaluation_id = r.evaluation_id
 WHERE g.consumed_step IS NOT NULL AND m.finish_reason IS DISTINCT FROM 'surplus';

-- Rewards scored from the preserved work of an execution that timed out (partial scoring).
CREATE VIEW gyre_partial_rewards_v AS
SELECT r.execution_id, r.run_id, e.finish_reason, r.reward, e.score_low, e.score_high,
       r.evaluation_id, e.evaluator, e.artifact_version, e.branch_refs, r.position AS outcome_position
  FROM gyre_rewards r
  JOIN gyre_evaluations e ON e.evaluation_id = r.evaluation_id
 WHERE r.status = 'valid' AND e.finish_reason IN ('harness_timeout', 'overall_timeout');

-- Executions left out of training for lack of a valid reward, with every failed attempt.
CREATE VIEW gyre_excluded_executions_v AS
SELECT r.execution_id, r.run_id, m.group_id, m.finish_reason, r.reason, r.attempts, r.error AS last_error,
       (SELECT count(*) FROM gyre_evaluations e
         WHERE e.execution_id = r.execution_id AND e.status = 'failed') AS failed_attempts,
       (SELECT string_agg(DISTINCT e.error_kind, ',' ORDER BY e.error_kind) FROM gyre_evaluations e
         WHERE e.execution_id = r.execution_id AND e.status = 'failed') AS error_kinds,
       r.position AS outcome_position
  FROM gyre_rewards r
  LEFT JOIN gyre_group_members m ON m.execution_id = r.execution_id
 WHERE r.status = 'excluded';

-- Zero-reward placeholders inserted for total failures, so their groups stay complete.
CREATE VIEW gyre_placeholders_v AS
SELECT r.execution_id, r.run_id, m.group_id, m.finish_reason, r.reason, r.evaluation_id,
       r.position AS outcome_position
  FROM gyre_rewards r
  LEFT JOIN gyre_group_members m ON m.execution_id = r.execution_id
 WHERE r.status = 'placeholder';

-- Evaluator critique fed back to the policy: every such token is context, never a target.
CREATE VIEW gyre_critique_tokens_v AS
SELECT n.execution_id, n.node_id, n.request_id AS introduced_by, c.matching AS critique_tokens,
       c.masked AS critique_marked_trainable
  FROM gyre_tree_nodes n
 CROSS JOIN LATERAL gyre_count_code_v1(n.provenance, 5, n.trainable) AS c
 WHERE c.matching > 0;

GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE
   ON gyre_artifacts, gyre_evaluations, gyre_rewards, gyre_groups, gyre_group_members TO gyre_projector;
GRANT SELECT ON gyre_artifacts, gyre_evaluations, gyre_rewards, gyre_groups, gyre_group_members,
                gyre_reward_provenance_v, gyre_step_rewards_v, gyre_partial_rewards_v,
                gyre_excluded_executions_v, gyre_placeholders_v, gyre_critique_tokens_v TO gyre_auditor;
"""

DOWNGRADE = """
DROP VIEW gyre_critique_tokens_v;
DROP VIEW gyre_placeholders_v;
DROP VIEW gyre_excluded_executions_v;
DROP VIEW gyre_partial_rewards_v;
DROP VIEW gyre_step_rewards_v;
DROP VIEW gyre_reward_provenance_v;
DROP FUNCTION gyre_count_code_v1(bytea, integer, bytea);
DROP TABLE gyre_group_members;
DROP TABLE gyre_groups;
DROP TABLE gyre_rewards;
DROP TABLE gyre_evaluations;
DROP TABLE gyre_artifacts;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
