"""Named SQL of the event log. Hot-path statements live here, referred to by name."""

from __future__ import annotations

EVENT_COLUMNS = (
    "position",
    "stream_type",
    "stream_id",
    "stream_version",
    "event_type",
    "schema_version",
    "event_id",
    "idempotency_key",
    "body",
    "payload",
    "correlation_id",
    "causation_id",
    "run_id",
    "policy_version",
)

COPY_TYPES = (
    "int8",
    "text",
    "text",
    "int8",
    "text",
    "int4",
    "uuid",
    "text",
    "jsonb",
    "bytea",
    "uuid",
    "uuid",
    "text",
    "int8",
)

APPEND_SMALL = """
SELECT out_position, out_stream_version, out_duplicate
  FROM gyre_append_v1(%s::uuid[], %s::text[], %s::text[], %s::bigint[], %s::text[], %s::integer[],
                      %s::text[], %s::jsonb[], %s::bytea[], %s::uuid[], %s::uuid[], %s::text[],
                      %s::bigint[])
"""

APPEND_ONE = """
SELECT out_position, out_stream_version, out_duplicate
  FROM gyre_append_one_v1(%s::uuid, %s::text, %s::text, %s::bigint, %s::text, %s::integer, %s::text,
                          %s::jsonb, %s::bytea, %s::uuid, %s::uuid, %s::text, %s::bigint)
"""

LOCK_AND_HEAD = "SELECT gyre_append_lock_v1()"

EXISTING_KEYS = """
SELECT idempotency_key, position, stream_version
  FROM gyre_events
 WHERE idempotency_key = ANY(%s::text[])
"""

STREAM_HEADS = """
SELECT s.stream_type, s.stream_id,
       (SELECT coalesce(max(e.stream_version), 0)
          FROM gyre_events e
         WHERE e.stream_type = s.stream_type AND e.stream_id = s.stream_id)
  FROM unnest(%s::text[], %s::text[]) AS s(stream_type, stream_id)
"""

COPY_EVENTS = "COPY gyre_events ({}) FROM STDIN (FORMAT BINARY)".format(", ".join(EVENT_COLUMNS))

_SELECT = """
SELECT position, stream_type, stream_id, stream_version, event_type, schema_version, event_id,
       idempotency_key, body::text, payload, correlation_id, causation_id, run_id, policy_version,
       recorded_at
  FROM gyre_events
"""

READ_LOG = _SELECT + " WHERE position > %s AND position <= %s ORDER BY position LIMIT %s"
READ_LOG_TYPES = (
    _SELECT
    + " WHERE position > %s AND position <= %s AND event_type = ANY(%s::text[]) ORDER BY position LIMIT %s"
)
READ_STREAM = (
    _SELECT + " WHERE stream_type = %s AND stream_id = %s AND stream_version > %s ORDER BY stream_version"
)
HEAD = "SELECT coalesce(max(position), 0) FROM gyre_events"

GET_CHECKPOINT = "SELECT position FROM {} WHERE name = %s"
SET_CHECKPOINT = """
INSERT INTO {} (name, position, updated_at) VALUES (%s, %s, now())
ON CONFLICT (name) DO UPDATE SET position = EXCLUDED.position, updated_at = now()
"""

LISTEN = "LISTEN gyre_events_v1"
