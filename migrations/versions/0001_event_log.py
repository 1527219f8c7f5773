"""The append-only event log, checkpoints, the append function and the database roles.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Appends serialize on this transaction-level advisory lock, and positions are handed out
# (max + 1) while it is held. So position order is commit order, the log has no gaps, and
# a reader that tails by position can never skip an event that commits later with a
# smaller position: no such event can exist.
APPEND_LOCK_KEY = 7_231_640_118

UPGRADE = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'gyre_writer') THEN
        CREATE ROLE gyre_writer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'gyre_projector') THEN
        CREATE ROLE gyre_projector NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'gyre_auditor') THEN
        CREATE ROLE gyre_auditor NOLOGIN;
    END IF;
END
$$;

CREATE TABLE gyre_events (
    position        bigint      NOT NULL,
    stream_type     text        NOT NULL,
    stream_id       text        NOT NULL,
    stream_version  bigint      NOT NULL,
    event_type      text        NOT NULL,
    schema_version  integer     NOT NULL,
    event_id        uuid        NOT NULL,
    idempotency_key text,
    body            jsonb       NOT NULL,
    payload         bytea,
    correlation_id  uuid,
    causation_id    uuid,
    run_id          text,
    policy_version  bigint,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT gyre_events_pk PRIMARY KEY (position),
    CONSTRAINT gyre_events_stream_version_uq UNIQUE (stream_type, stream_id, stream_version),
    CONSTRAINT gyre_events_idempotency_key_uq UNIQUE (idempotency_key),
    CONSTRAINT gyre_events_event_id_uq UNIQUE (event_id),
    CONSTRAINT gyre_events_position_ck CHECK (position >= 1),
    CONSTRAINT gyre_events_stream_version_ck CHECK (stream_version >= 1)
);
-- Token arrays barely compress; skipping pglz saves CPU on every model-call append.
ALTER TABLE gyre_events ALTER COLUMN payload SET STORAGE EXTERNAL;
CREATE INDEX gyre_events_type_position_ix ON gyre_events (event_type, position);
CREATE INDEX gyre_events_run_position_ix ON gyre_events (run_id, position);

CREATE TABLE gyre_checkpoints (
    name       text        NOT NULL,
    position   bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT gyre_checkpoints_pk PRIMARY KEY (name),
    CONSTRAINT gyre_checkpoints_position_ck CHECK (position >= 0)
);

CREATE FUNCTION gyre_events_reject_change_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'GY403',
        MESSAGE = format('gyre_events is append-only: %s is not allowed', TG_OP),
        HINT = 'record a new event that supersedes the old one instead';
END
$$;

CREATE TRIGGER gyre_events_append_only_v1
    BEFORE UPDATE OR DELETE ON gyre_events
    FOR EACH ROW EXECUTE FUNCTION gyre_events_reject_change_v1();
CREATE TRIGGER gyre_events_no_truncate_v1
    BEFORE TRUNCATE ON gyre_events
    FOR EACH STATEMENT EXECUTE FUNCTION gyre_events_reject_change_v1();

-- NOTIFY only wakes readers (they re-read from their checkpoint); an empty payload lets
-- PostgreSQL fold all notifications of one transaction into one.
CREATE FUNCTION gyre_events_notify_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gyre_events_v1', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER gyre_events_notify_v1
    AFTER INSERT ON gyre_events
    FOR EACH STATEMENT EXECUTE FUNCTION gyre_events_notify_v1();

CREATE FUNCTION gyre_append_lock_v1() RETURNS bigint
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock({APPEND_LOCK_KEY});
    SELECT coalesce(max(position), 0) FROM gyre_events;
$$;

-- One round trip for a small batch: lock, then per event in order: idempotency check,
-- expected-version check, insert. A version conflict raises GY409 and rolls back the batch.
CREATE FUNCTION gyre_append_v1(
    p_event_ids uuid[], p_stream_types text[], p_stream_ids text[], p_expected bigint[],
    p_event_types text[], p_schema_versions integer[], p_keys text[], p_bodies jsonb[],
    p_payloads bytea[], p_correlation_ids uuid[], p_causation_ids uuid[], p_run_ids text[],
    p_policy_versions bigint[]
) RETURNS TABLE (out_position bigint, out_stream_version bigint, out_duplicate boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_head bigint;
    v_version bigint;
    i integer;
BEGIN
    v_head := gyre_append_lock_v1();
    FOR i IN 1 .. coalesce(array_length(p_event_ids, 1), 0) LOOP
        IF p_keys[i] IS NOT NULL THEN
            SELECT e.position, e.stream_version INTO out_position, out_stream_version
              FROM gyre_events e WHERE e.idempotency_key = p_keys[i];
            IF FOUND THEN
                out_duplicate := true;
                RETURN NEXT;
                CONTINUE;
            END IF;
        END IF;
        SELECT coalesce(max(e.stream_version), 0) INTO v_version
          FROM gyre_events e
         WHERE e.stream_type = p_stream_types[i] AND e.stream_id = p_stream_ids[i];
        IF p_expected[i] IS NOT NULL AND p_expected[i] <> v_version THEN
            RAISE EXCEPTION USING
                ERRCODE = 'GY409',
                MESSAGE = format('stream %s:%s is at version %s, expected %s',
                                 p_stream_types[i], p_stream_ids[i], v_version, p_expected[i]),
                DETAIL = format('%s|%s|%s|%s', p_expected[i], v_version, p_stream_types[i], p_stream_ids[i]);
        END IF;
        v_head := v_head + 1;
        INSERT INTO gyre_events (
            position, stream_type, stream_id, stream_version, event_type, schema_version,
            event_id, idempotency_key, body, payload, correlation_id, causation_id, run_id,
            policy_version)
        VALUES (
            v_head, p_stream_types[i], p_stream_ids[i], v_version + 1, p_event_types[i],
            p_schema_versions[i], p_event_ids[i], p_keys[i], p_bodies[i], p_payloads[i],
            p_correlation_ids[i], p_causation_ids[i], p_run_ids[i], p_policy_versions[i]);
        out_position := v_head;
        out_stream_version := v_version + 1;
        out_duplicate := false;
        RETURN NEXT;
    END LOOP;
END
$$;

REVOKE ALL ON gyre_events, gyre_checkpoints FROM PUBLIC;
REVOKE ALL ON FUNCTION gyre_append_v1(uuid[], text[], text[], bigint[], text[], integer[], text[],
    jsonb[], bytea[], uuid[], uuid[], text[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION gyre_append_lock_v1() FROM PUBLIC;
GRANT SELECT, INSERT ON gyre_events TO gyre_writer;
GRANT EXECUTE ON FUNCTION gyre_append_v1(uuid[], text[], text[], bigint[], text[], integer[], text[],
    jsonb[], bytea[], uuid[], uuid[], text[], bigint[]) TO gyre_writer;
GRANT EXECUTE ON FUNCTION gyre_append_lock_v1() TO gyre_writer;
GRANT SELECT ON gyre_events TO gyre_projector, gyre_auditor;
GRANT SELECT, INSERT, UPDATE ON gyre_checkpoints TO gyre_projector;
GRANT SELECT ON gyre_checkpoints TO gyre_auditor;
"""

DOWNGRADE = """
DROP FUNCTION gyre_append_v1(uuid[], text[], text[], bigint[], text[], integer[], text[],
    jsonb[], bytea[], uuid[], uuid[], text[], bigint[]);
DROP FUNCTION gyre_append_lock_v1();
DROP TABLE gyre_checkpoints;
DROP TABLE gyre_events;
DROP FUNCTION gyre_events_notify_v1();
DROP FUNCTION gyre_events_reject_change_v1();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
