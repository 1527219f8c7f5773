"""SQLAlchemy models of every table gyre's migrations create.

These are the models the migrated schema is checked against (``gyre db check``); the
migrations themselves are explicit SQL. Hot-path code does not use the ORM: it reads the
column lists from here and sends named SQL through psycopg.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

metadata = sa.MetaData()

events = sa.Table(
    "gyre_events",
    metadata,
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("stream_type", sa.Text, nullable=False),
    sa.Column("stream_id", sa.Text, nullable=False),
    sa.Column("stream_version", sa.BigInteger, nullable=False),
    sa.Column("event_type", sa.Text, nullable=False),
    sa.Column("schema_version", sa.Integer, nullable=False),
    sa.Column("event_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("idempotency_key", sa.Text, nullable=True),
    sa.Column("body", pg.JSONB, nullable=False),
    sa.Column("payload", pg.BYTEA, nullable=True),
    sa.Column("correlation_id", pg.UUID(as_uuid=True), nullable=True),
    sa.Column("causation_id", pg.UUID(as_uuid=True), nullable=True),
    sa.Column("run_id", sa.Text, nullable=True),
    sa.Column("policy_version", sa.BigInteger, nullable=True),
    sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
    sa.PrimaryKeyConstraint("position", name="gyre_events_pk"),
    sa.UniqueConstraint("stream_type", "stream_id", "stream_version", name="gyre_events_stream_version_uq"),
    sa.UniqueConstraint("idempotency_key", name="gyre_events_idempotency_key_uq"),
    sa.UniqueConstraint("event_id", name="gyre_events_event_id_uq"),
    sa.CheckConstraint("position >= 1", name="gyre_events_position_ck"),
    sa.CheckConstraint("stream_version >= 1", name="gyre_events_stream_version_ck"),
    sa.Index("gyre_events_type_position_ix", "event_type", "position"),
    sa.Index("gyre_events_run_position_ix", "run_id", "position"),
)

checkpoints = sa.Table(
    "gyre_checkpoints",
    metadata,
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
    sa.PrimaryKeyConstraint("name", name="gyre_checkpoints_pk"),
    sa.CheckConstraint("position >= 0", name="gyre_checkpoints_position_ck"),
)

# --- projections of the run lifecycle (rebuildable from gyre_events at any time) ---

executions = sa.Table(
    "gyre_executions",
    metadata,
    sa.Column("execution_id", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("group_id", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("finish_reason", sa.Text, nullable=True),
    sa.Column("policy_version", sa.BigInteger, nullable=False),
    sa.Column("engine", sa.Text, nullable=True),
    sa.Column("dispatched_position", sa.BigInteger, nullable=False),
    sa.Column("started_position", sa.BigInteger, nullable=True),
    sa.Column("finished_position", sa.BigInteger, nullable=True),
    sa.PrimaryKeyConstraint("execution_id", name="gyre_executions_pk"),
    sa.Index("gyre_executions_run_ix", "run_id", "status"),
    sa.Index("gyre_executions_group_ix", "group_id"),
)

counters = sa.Table(
    "gyre_counters",
    metadata,
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("dispatched", sa.BigInteger, nullable=False),
    sa.Column("started", sa.BigInteger, nullable=False),
    sa.Column("finished", sa.BigInteger, nullable=False),
    sa.Column("as_of_position", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint("run_id", name="gyre_counters_pk"),
)

cell_roles = sa.Table(
    "gyre_cell_roles",
    metadata,
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("cell_index", sa.Integer, nullable=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("transitions", sa.Integer, nullable=False),
    sa.Column("since_position", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint("run_id", "cell_index", name="gyre_cell_roles_pk"),
)

policy_versions = sa.Table(
    "gyre_policy_versions",
    metadata,
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("policy_version", sa.BigInteger, nullable=False),
    sa.Column("step", sa.BigInteger, nullable=False),
    sa.Column("published_position", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint("run_id", "policy_version", name="gyre_policy_versions_pk"),
)

# --- trajectory trees: one radix tree of token nodes per execution ---

tree_nodes = sa.Table(
    "gyre_tree_nodes",
    metadata,
    sa.Column("execution_id", sa.Text, nullable=False),
    sa.Column("node_id", sa.Integer, nullable=False),
    sa.Column("parent_id", sa.Integer, nullable=True),
    sa.Column("root_id", sa.Integer, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("start", sa.BigInteger, nullable=False),
    sa.Column("n_tokens", sa.Integer, nullable=False),
    # A node's arrays are not copied here: they are slices of the payload of the record event
    # at ``position``, starting ``*_at`` bytes in, ``n_tokens`` long (migration 0008).
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("tokens_at", sa.Integer, nullable=False),
    sa.Column("provenance_at", sa.Integer, nullable=False),
    sa.Column("logprobs_at", sa.Integer, nullable=True),
    sa.Column("trainable_at", sa.Integer, nullable=True),
    sa.Column("msg_ends", pg.BYTEA, nullable=False),
    sa.Column("path_trainable", sa.BigInteger, nullable=False),
    sa.Column("path_messages", sa.Integer, nullable=False),
    sa.Column("children", sa.Integer, nullable=False),
    sa.Column("request_id", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("execution_id", "node_id", name="gyre_tree_nodes_pk"),
    sa.Index("gyre_tree_nodes_parent_ix", "execution_id", "parent_id"),
)

tree_records = sa.Table(
    "gyre_tree_records",
    metadata,
    sa.Column("execution_id", sa.Text, nullable=False),
    sa.Column("request_id", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("output_node", sa.Integer, nullable=False),
    sa.Column("input_len", sa.BigInteger, nullable=False),
    sa.Column("output_len", sa.Integer, nullable=False),
    sa.Column("new_input_len", sa.Integer, nullable=False),
    sa.Column("prefix_of", sa.Text, nullable=True),
    sa.Column("prefix_len", sa.BigInteger, nullable=False),
    sa.Column("retry_of", sa.Text, nullable=True),
    sa.Column("superseded", sa.Boolean, nullable=False),
    sa.Column("agent_kind", sa.Text, nullable=False),
    sa.Column("agent_id", sa.Text, nullable=False),
    sa.Column("purpose", sa.Text, nullable=False),
    sa.Column("leaf_class", sa.Text, nullable=False),
    sa.Column("finish", sa.Text, nullable=False),
    sa.Column("engine", sa.Text, nullable=False),
    sa.Column("policy_version", sa.BigInteger, nullable=True),
    sa.PrimaryKeyConstraint("execution_id", "request_id", name="gyre_tree_records_pk"),
    sa.Index("gyre_tree_records_node_ix", "execution_id", "output_node"),
)

tree_state = sa.Table(
    "gyre_tree_state",
    metadata,
    sa.Column("execution_id", sa.Text, nullable=False),
    sa.Column("next_node", sa.Integer, nullable=False),
    sa.Column("records", sa.Integer, nullable=False),
    sa.Column("first_root", sa.Integer, nullable=True),
    sa.Column("topology", pg.BYTEA, nullable=False),
    sa.PrimaryKeyConstraint("execution_id", name="gyre_tree_state_pk"),
)

# --- evaluations, rewards and rollout groups (gyre_store.group_projections) ---

artifacts = sa.Table(
    "gyre_artifacts",
    metadata,
    sa.Column("execution_id", sa.Text, nullable=False),
    sa.Column("artifact_version", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("branch_refs", pg.JSONB, nullable=False),
    sa.Column("location", sa.Text, nullable=False),
    sa.Column("preserved_position", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint("execution_id", "artifact_version", name="gyre_artifacts_pk"),
)

evaluations = sa.Table(
    "gyre_evaluations",
    metadata,
    sa.Column("evaluation_id", sa.Text, nullable=False),
    sa.Column("execution_id", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("evaluator", sa.Text, nullable=False),
    sa.Column("artifact_version", sa.Text, nullable=False),
    sa.Column("branch_refs", pg.JSONB, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("error_kind", sa.Text, nullable=True),
    sa.Column("score", sa.Float(precision=53), nullable=True),
    sa.Column("score_low", sa.Float(precision=53), nullable=True),
    sa.Column("score_high", sa.Float(precision=53), nullable=True),
    sa.Column("finish_reason", sa.Text, nullable=True),
    sa.Column("critique", sa.Text, nullable=False),
    sa.Column("detail", sa.Text, nullable=False),
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint("evaluation_id", name="gyre_evaluations_pk"),
    sa.Index("gyre_evaluations_execution_ix", "execution_id", "position"),
)

rewards = sa.Table(
    "gyre_rewards",
    metadata,
    sa.Column("execution_id", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("reward", sa.Float(precision=53), nullable=True),
    sa.Column("evaluation_id", sa.Text, nullable=True),
    sa.Column("artifact_version", sa.Text, nullable=True),
    sa.Column("branch_refs", pg.JSONB, nullable=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint("execution_id", name="gyre_rewards_pk"),
)

groups = sa.Table(
    "gyre_groups",
    metadata,
    sa.Column("group_id", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("query_id", sa.Text, nullable=False),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("policy_version", sa.BigInteger, nullable=False),
    sa.Column("dispatched", sa.Integer, nullable=False),
    sa.Column("surplus", sa.Integer, nullable=False),
    sa.Column("closed", sa.Integer, nullable=False),
    sa.Column("valid", sa.Integer, nullable=False),
    sa.Column("placeholders", sa.Integer, nullable=False),
    sa.Column("excluded", sa.Integer, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("ready_position", sa.BigInteger, nullable=True),
    sa.Column("consumed_step", sa.BigInteger, nullable=True),
    sa.Column("consumed_position", sa.BigInteger, nullable=True),
    sa.PrimaryKeyConstraint("group_id", name="gyre_groups_pk"),
    sa.Index("gyre_groups_status_ix", "status", "policy_version", "ready_position"),
)

group_members = sa.Table(
    "gyre_group_members",
    metadata,
    sa.Column("execution_id", sa.Text, nullable=False),
    sa.Column("group_id", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("policy_version", sa.BigInteger, nullable=False),
    sa.Column("finish_reason", sa.Text, nullable=True),
    sa.Column("outcome", sa.Text, nullable=True),
    sa.Column("reward", sa.Float(precision=53), nullable=True),
    sa.Column("dispatched_position", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint("execution_id", name="gyre_group_members_pk"),
    sa.Index("gyre_group_members_group_ix", "group_id"),
)
