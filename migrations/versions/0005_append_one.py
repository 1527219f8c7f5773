"""A single-event append function with scalar arguments.

Revision ID: 0005
Revises: 0004

Most appends are one event (a counter update, a role change). Passing thirteen one-element
arrays costs the client more than the insert itself, so one event goes through this
function: the same lock, idempotency check, version check and insert as gyre_append_v1.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE FUNCTION gyre_append_one_v1(
    p_event_id uuid, p_stream_type text, p_stream_id text, p_expected bigint, p_event_type text,
    p_schema_version integer, p_key text, p_body jsonb, p_payload bytea, p_correlation_id uuid,
    p_causation_id uuid, p_run_id text, p_policy_version bigint,
    OUT out_position bigint, OUT out_stream_version bigint, OUT out_duplicate boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    v_head bigint;
    v_version bigint;
BEGIN
    v_head := gyre_append_lock_v1();
    IF p_key IS NOT NULL THEN
        SELECT e.position, e.stream_version INTO out_position, out_stream_version
          FROM gyre_events e WHERE e.idempotency_key = p_key;
        IF FOUND THEN
            out_duplicate := true;
            RETURN;
        END IF;
    END IF;
    SELECT coalesce(max(e.stream_version), 0) INTO v_version
      FROM gyre_events e WHERE e.stream_type = p_stream_type AND e.stream_id = p_stream_id;
    IF p_expected IS NOT NULL AND p_expected <> v_version THEN
        RAISE EXCEPTION USING
            ERRCODE = 'GY409',
            MESSAGE = format('stream %s:%s is at version %s, expected %s',
                             p_stream_type, p_stream_id, v_version, p_expected),
            DETAIL = format('%s|%s|%s|%s', p_expected, v_version, p_stream_type, p_stream_id);
    END IF;
    INSERT INTO gyre_events (
        position, stream_type, stream_id, stream_version, event_type, schema_version, event_id,
        idempotency_key, body, payload, correlation_id, causation_id, run_id, policy_version)
    VALUES (
        v_head + 1, p_stream_type, p_stream_id, v_version + 1, p_event_type, p_schema_version,
        p_event_id, p_key, p_body, p_payload, p_correlation_id, p_causation_id, p_run_id,
        p_policy_version);
    out_position := v_head + 1;
    out_stream_version := v_version + 1;
    out_duplicate := false;
END
$$;
REVOKE ALL ON FUNCTION gyre_append_one_v1(uuid, text, text, bigint, text, integer, text, jsonb, bytea,
    uuid, uuid, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gyre_append_one_v1(uuid, text, text, bigint, text, integer, text, jsonb, bytea,
    uuid, uuid, text, bigint) TO gyre_writer;
"""

DOWNGRADE = """
DROP FUNCTION gyre_append_one_v1(uuid, text, text, bigint, text, integer, text, jsonb, bytea, uuid, uuid,
    text, bigint);
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
