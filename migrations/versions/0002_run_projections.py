"""Projection tables of the run lifecycle and the SQL views people audit with.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE TABLE gyre_executions (
    execution_id        text   NOT NULL,
    run_id              text   NOT NULL,
    group_id            text   NOT NULL,
    status              text   NOT NULL,
    finish_reason       text,
    policy_version      bigint NOT NULL,
    engine              text,
    dispatched_position bigint NOT NULL,
    started_position    bigint,
    finished_position   bigint,
    CONSTRAINT gyre_executions_pk PRIMARY KEY (execution_id)
);
CREATE INDEX gyre_executions_run_ix ON gyre_executions (run_id, status);
CREATE INDEX gyre_executions_group_ix ON gyre_executions (group_id);

CREATE TABLE gyre_counters (
    run_id         text   NOT NULL,
    dispatched     bigint NOT NULL,
    started        bigint NOT NULL,
    finished       bigint NOT NULL,
    as_of_position bigint NOT NULL,
    CONSTRAINT gyre_counters_pk PRIMARY KEY (run_id)
);

CREATE TABLE gyre_cell_roles (
    run_id         text    NOT NULL,
    cell_index     integer NOT NULL,
    role           text    NOT NULL,
    transitions    integer NOT NULL,
    since_position bigint  NOT NULL,
    CONSTRAINT gyre_cell_roles_pk PRIMARY KEY (run_id, cell_index)
);

CREATE TABLE gyre_policy_versions (
    run_id             text   NOT NULL,
    policy_version     bigint NOT NULL,
    step               bigint NOT NULL,
    published_position bigint NOT NULL,
    CONSTRAINT gyre_policy_versions_pk PRIMARY KEY (run_id, policy_version)
);

-- The scheduler's counters as people read them: queued = d - p, running = p - f,
-- waterlevel w = d - f.
CREATE VIEW gyre_waterlevel_v AS
SELECT run_id,
       dispatched                AS d,
       started                   AS p,
       finished                  AS f,
       dispatched - started      AS queued,
       started - finished        AS running,
       dispatched - finished     AS waterlevel,
       as_of_position
  FROM gyre_counters;

-- One row per event with its body as JSON, for ad-hoc audits.
CREATE VIEW gyre_event_log_v AS
SELECT position, recorded_at, run_id, stream_type || ':' || stream_id AS stream, stream_version,
       event_type, schema_version, policy_version, body, octet_length(payload) AS payload_bytes
  FROM gyre_events;

GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE
   ON gyre_executions, gyre_counters, gyre_cell_roles, gyre_policy_versions TO gyre_projector;
GRANT SELECT ON gyre_executions, gyre_counters, gyre_cell_roles, gyre_policy_versions,
                gyre_waterlevel_v, gyre_event_log_v TO gyre_auditor;
"""

DOWNGRADE = """
DROP VIEW gyre_event_log_v;
DROP VIEW gyre_waterlevel_v;
DROP TABLE gyre_policy_versions;
DROP TABLE gyre_cell_roles;
DROP TABLE gyre_counters;
DROP TABLE gyre_executions;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
