"""Control-plane schema, the service role, its grants, and row-level security.

Revision ID: 0001
Revises:
Create Date: 2026-11-30 10:35:43.331400
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    _create_tables()
    _secure()


def _create_tables() -> None:
    op.create_table('admin_tokens',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('prefix', sa.String(length=32), nullable=False),
    sa.Column('token_hash', sa.LargeBinary(length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_admin_tokens')),
    sa.UniqueConstraint('name', name=op.f('uq_admin_tokens_name')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_admin_tokens_token_hash'))
    )
    op.create_table('audit_log',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=True), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('action', sa.String(length=100), nullable=False),
    sa.Column('target_type', sa.String(length=64), nullable=False),
    sa.Column('target_id', sa.String(length=64), nullable=True),
    sa.Column('tenant_id', sa.UUID(), nullable=True),
    sa.Column('before', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('after', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('request_id', sa.String(length=64), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_log'))
    )
    op.create_index('ix_audit_log_at', 'audit_log', ['at'], unique=False)
    op.create_index('ix_audit_log_target_type_target_id', 'audit_log', ['target_type', 'target_id'], unique=False)
    op.create_index(op.f('ix_audit_log_tenant_id'), 'audit_log', ['tenant_id'], unique=False)
    op.create_table('models',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('context_length', sa.Integer(), nullable=False),
    sa.Column('num_layers', sa.Integer(), nullable=False),
    sa.Column('num_kv_heads', sa.Integer(), nullable=False),
    sa.Column('head_dim', sa.Integer(), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('params_b', sa.Float(), nullable=True),
    sa.Column('version', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("dtype IN ('float32', 'bfloat16', 'float16', 'fp8', 'int8')", name=op.f('ck_models_dtype')),
    sa.CheckConstraint('context_length > 0 AND num_layers > 0 AND num_kv_heads > 0 AND head_dim > 0', name=op.f('ck_models_shape')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_models')),
    sa.UniqueConstraint('name', name=op.f('uq_models_name'))
    )
    op.create_table('slo_policies',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('ttft_ms', sa.Integer(), nullable=False),
    sa.Column('tpot_ms', sa.Integer(), nullable=False),
    sa.Column('percentile', sa.Numeric(precision=5, scale=2), server_default=sa.text('99'), nullable=False),
    sa.Column('priority', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('sheddable', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('version', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('percentile > 0 AND percentile <= 100', name=op.f('ck_slo_policies_percentile_range')),
    sa.CheckConstraint('priority BETWEEN 0 AND 100', name=op.f('ck_slo_policies_priority_range')),
    sa.CheckConstraint('ttft_ms > 0 AND tpot_ms > 0', name=op.f('ck_slo_policies_targets_positive')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_slo_policies')),
    sa.UniqueConstraint('name', name=op.f('uq_slo_policies_name'))
    )
    op.create_table('tenants',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('display_name', sa.String(length=200), nullable=False),
    sa.Column('status', sa.Enum('active', 'suspended', name='tenant_status', native_enum=False, create_constraint=True, length=32), server_default='active', nullable=False),
    sa.Column('settings', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'"), nullable=False),
    sa.Column('version', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("name ~ '^[a-z0-9][a-z0-9-]{0,63}$'", name=op.f('ck_tenants_name_slug')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tenants')),
    sa.UniqueConstraint('name', name=op.f('uq_tenants_name'))
    )
    op.create_table('api_keys',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('prefix', sa.String(length=32), nullable=False),
    sa.Column('key_hash', sa.LargeBinary(length=32), nullable=False),
    sa.Column('model_scope', postgresql.ARRAY(sa.String(length=200)), server_default=sa.text("'{}'"), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('rotated_to_id', sa.UUID(), nullable=True),
    sa.Column('created_by', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['rotated_to_id'], ['api_keys.id'], name=op.f('fk_api_keys_rotated_to_id_api_keys'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_api_keys_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('key_hash', name=op.f('uq_api_keys_key_hash'))
    )
    op.create_index(op.f('ix_api_keys_tenant_id'), 'api_keys', ['tenant_id'], unique=False)
    op.create_index('uq_api_keys_tenant_id_name_live', 'api_keys', ['tenant_id', 'name'], unique=True, postgresql_where=sa.text('revoked_at IS NULL AND rotated_to_id IS NULL'))
    op.create_table('deployments',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('model_id', sa.UUID(), nullable=False),
    sa.Column('mode', sa.Enum('aggregated', 'pd', name='deployment_mode', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('prefill_min_replicas', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('prefill_max_replicas', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('decode_min_replicas', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('decode_max_replicas', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('engine_settings', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'"), nullable=False),
    sa.Column('kv_connector', sa.String(length=32), nullable=True),
    sa.Column('lmcache', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('device_profile', sa.String(length=16), server_default='cpu', nullable=False),
    sa.Column('slo_policy_id', sa.UUID(), nullable=True),
    sa.Column('desired_state', sa.Enum('running', 'stopped', 'deleted', name='desired_state', native_enum=False, create_constraint=True, length=32), server_default='running', nullable=False),
    sa.Column('observed_state', sa.Enum('pending', 'deploying', 'running', 'unhealthy', 'failed', 'stopped', 'deleted', name='observed_state', native_enum=False, create_constraint=True, length=32), server_default='pending', nullable=False),
    sa.Column('observed_reason', sa.Text(), nullable=True),
    sa.Column('observed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('generation', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('observed_generation', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('version', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("device_profile IN ('cpu', 'gpu')", name=op.f('ck_deployments_device_profile')),
    sa.CheckConstraint("mode = 'aggregated' OR (kv_connector IS NOT NULL AND prefill_max_replicas >= 1)", name=op.f('ck_deployments_pd_needs_connector_and_prefill')),
    sa.CheckConstraint("name ~ '^[a-z0-9][a-z0-9-]{0,62}$'", name=op.f('ck_deployments_name_slug')),
    sa.CheckConstraint('decode_min_replicas >= 0 AND decode_min_replicas <= decode_max_replicas AND decode_max_replicas >= 1', name=op.f('ck_deployments_decode_range')),
    sa.CheckConstraint('prefill_min_replicas >= 0 AND prefill_min_replicas <= prefill_max_replicas', name=op.f('ck_deployments_prefill_range')),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_deployments_model_id_models'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['slo_policy_id'], ['slo_policies.id'], name=op.f('fk_deployments_slo_policy_id_slo_policies'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_deployments')),
    sa.UniqueConstraint('name', name=op.f('uq_deployments_name'))
    )
    op.create_index(op.f('ix_deployments_model_id'), 'deployments', ['model_id'], unique=False)
    op.create_index(op.f('ix_deployments_slo_policy_id'), 'deployments', ['slo_policy_id'], unique=False)
    op.create_table('slo_assignments',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('policy_id', sa.UUID(), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=True),
    sa.Column('model_id', sa.UUID(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('tenant_id IS NOT NULL OR model_id IS NOT NULL', name=op.f('ck_slo_assignments_has_target')),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_slo_assignments_model_id_models'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['policy_id'], ['slo_policies.id'], name=op.f('fk_slo_assignments_policy_id_slo_policies'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_slo_assignments_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_slo_assignments')),
    sa.UniqueConstraint('tenant_id', 'model_id', name=op.f('uq_slo_assignments_tenant_id_model_id'), postgresql_nulls_not_distinct=True)
    )
    op.create_index(op.f('ix_slo_assignments_model_id'), 'slo_assignments', ['model_id'], unique=False)
    op.create_index(op.f('ix_slo_assignments_policy_id'), 'slo_assignments', ['policy_id'], unique=False)
    op.create_index(op.f('ix_slo_assignments_tenant_id'), 'slo_assignments', ['tenant_id'], unique=False)
    op.create_table('tenant_models',
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('model_id', sa.UUID(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_tenant_models_model_id_models'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_tenant_models_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('tenant_id', 'model_id', name=op.f('pk_tenant_models'))
    )
    op.create_index(op.f('ix_tenant_models_model_id'), 'tenant_models', ['model_id'], unique=False)
    op.create_table('usage_daily',
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('day', sa.Date(), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('requests', sa.BigInteger(), nullable=False),
    sa.Column('prompt_tokens', sa.BigInteger(), nullable=False),
    sa.Column('completion_tokens', sa.BigInteger(), nullable=False),
    sa.Column('cached_tokens', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_usage_daily_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('tenant_id', 'day', 'model', name=op.f('pk_usage_daily'))
    )
    op.create_table('users',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=True),
    sa.Column('email', sa.String(length=320), nullable=False),
    sa.Column('password_hash', sa.Text(), nullable=False),
    sa.Column('role', sa.Enum('tenant_admin', 'tenant_member', 'operator', name='user_role', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('disabled', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_login_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("(role = 'operator') = (tenant_id IS NULL)", name=op.f('ck_users_operator_has_no_tenant')),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_users_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_users'))
    )
    op.create_index(op.f('ix_users_tenant_id'), 'users', ['tenant_id'], unique=False)
    op.create_index('uq_users_email_lower', 'users', [sa.literal_column('lower(email)')], unique=True)
    op.create_table('console_sessions',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('token_hash', sa.LargeBinary(length=32), nullable=False),
    sa.Column('user_id', sa.UUID(), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=True),
    sa.Column('csrf_token', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_console_sessions_tenant_id_tenants'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_console_sessions_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_console_sessions')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_console_sessions_token_hash'))
    )
    op.create_index(op.f('ix_console_sessions_tenant_id'), 'console_sessions', ['tenant_id'], unique=False)
    op.create_index(op.f('ix_console_sessions_user_id'), 'console_sessions', ['user_id'], unique=False)
    op.create_table('jobs',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('status', sa.Enum('queued', 'running', 'succeeded', 'failed', name='job_status', native_enum=False, create_constraint=True, length=32), server_default='queued', nullable=False),
    sa.Column('deployment_id', sa.UUID(), nullable=True),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'"), nullable=False),
    sa.Column('result', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('task_id', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['deployment_id'], ['deployments.id'], name=op.f('fk_jobs_deployment_id_deployments'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs'))
    )
    op.create_index(op.f('ix_jobs_deployment_id'), 'jobs', ['deployment_id'], unique=False)
    op.create_index('ix_jobs_status_created_at', 'jobs', ['status', 'created_at'], unique=False)
    op.create_table('rate_limits',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('api_key_id', sa.UUID(), nullable=True),
    sa.Column('requests_per_minute', sa.Integer(), nullable=True),
    sa.Column('tokens_per_minute', sa.Integer(), nullable=True),
    sa.Column('max_concurrency', sa.Integer(), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('coalesce(requests_per_minute, 1) > 0 AND coalesce(tokens_per_minute, 1) > 0 AND coalesce(max_concurrency, 1) > 0', name=op.f('ck_rate_limits_positive')),
    sa.ForeignKeyConstraint(['api_key_id'], ['api_keys.id'], name=op.f('fk_rate_limits_api_key_id_api_keys'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_rate_limits_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rate_limits')),
    sa.UniqueConstraint('tenant_id', 'api_key_id', name=op.f('uq_rate_limits_tenant_id_api_key_id'), postgresql_nulls_not_distinct=True)
    )
    op.create_index(op.f('ix_rate_limits_api_key_id'), 'rate_limits', ['api_key_id'], unique=False)
    op.create_index(op.f('ix_rate_limits_tenant_id'), 'rate_limits', ['tenant_id'], unique=False)
    op.create_table('request_records',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('api_key_id', sa.UUID(), nullable=True),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('deployment', sa.String(length=63), nullable=True),
    sa.Column('endpoint', sa.String(length=64), nullable=False),
    sa.Column('stream', sa.Boolean(), nullable=False),
    sa.Column('status', sa.Enum('completed', 'failed', 'cancelled', name='request_status', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('http_status', sa.Integer(), nullable=False),
    sa.Column('error_code', sa.String(length=64), nullable=True),
    sa.Column('prompt_tokens', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('completion_tokens', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('ttft_ms', sa.Float(), nullable=True),
    sa.Column('tpot_ms', sa.Float(), nullable=True),
    sa.Column('itl_p50_ms', sa.Float(), nullable=True),
    sa.Column('itl_p99_ms', sa.Float(), nullable=True),
    sa.Column('e2e_ms', sa.Float(), nullable=False),
    sa.Column('kv_bytes', sa.BigInteger(), nullable=True),
    sa.Column('handoff_ms', sa.Float(), nullable=True),
    sa.Column('recovery_steps', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'[]'"), nullable=False),
    sa.Column('trace_id', sa.String(length=32), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint('finished_at >= started_at', name=op.f('ck_request_records_time_order')),
    sa.ForeignKeyConstraint(['api_key_id'], ['api_keys.id'], name=op.f('fk_request_records_api_key_id_api_keys'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_request_records_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_request_records'))
    )
    op.create_index(op.f('ix_request_records_api_key_id'), 'request_records', ['api_key_id'], unique=False)
    op.create_index('ix_request_records_tenant_id_started_at', 'request_records', ['tenant_id', 'started_at'], unique=False)
    op.create_index(op.f('ix_request_records_trace_id'), 'request_records', ['trace_id'], unique=False)
    op.create_table('usage_records',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=True), nullable=False),
    sa.Column('request_id', sa.UUID(), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('api_key_id', sa.UUID(), nullable=True),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('prompt_tokens', sa.Integer(), nullable=False),
    sa.Column('completion_tokens', sa.Integer(), nullable=False),
    sa.Column('cached_tokens', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('prompt_tokens >= 0 AND completion_tokens >= 0 AND cached_tokens >= 0', name=op.f('ck_usage_records_non_negative')),
    sa.ForeignKeyConstraint(['api_key_id'], ['api_keys.id'], name=op.f('fk_usage_records_api_key_id_api_keys'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_usage_records_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_usage_records')),
    sa.UniqueConstraint('request_id', name=op.f('uq_usage_records_request_id'))
    )
    op.create_index(op.f('ix_usage_records_api_key_id'), 'usage_records', ['api_key_id'], unique=False)
    op.create_index('ix_usage_records_tenant_id_created_at', 'usage_records', ['tenant_id', 'created_at'], unique=False)


def downgrade() -> None:
    _unsecure()
    _drop_tables()


def _drop_tables() -> None:
    op.drop_index('ix_usage_records_tenant_id_created_at', table_name='usage_records')
    op.drop_index(op.f('ix_usage_records_api_key_id'), table_name='usage_records')
    op.drop_table('usage_records')
    op.drop_index(op.f('ix_request_records_trace_id'), table_name='request_records')
    op.drop_index('ix_request_records_tenant_id_started_at', table_name='request_records')
    op.drop_index(op.f('ix_request_records_api_key_id'), table_name='request_records')
    op.drop_table('request_records')
    op.drop_index(op.f('ix_rate_limits_tenant_id'), table_name='rate_limits')
    op.drop_index(op.f('ix_rate_limits_api_key_id'), table_name='rate_limits')
    op.drop_table('rate_limits')
    op.drop_index('ix_jobs_status_created_at', table_name='jobs')
    op.drop_index(op.f('ix_jobs_deployment_id'), table_name='jobs')
    op.drop_table('jobs')
    op.drop_index(op.f('ix_console_sessions_user_id'), table_name='console_sessions')
    op.drop_index(op.f('ix_console_sessions_tenant_id'), table_name='console_sessions')
    op.drop_table('console_sessions')
    op.drop_index('uq_users_email_lower', table_name='users')
    op.drop_index(op.f('ix_users_tenant_id'), table_name='users')
    op.drop_table('users')
    op.drop_table('usage_daily')
    op.drop_index(op.f('ix_tenant_models_model_id'), table_name='tenant_models')
    op.drop_table('tenant_models')
    op.drop_index(op.f('ix_slo_assignments_tenant_id'), table_name='slo_assignments')
    op.drop_index(op.f('ix_slo_assignments_policy_id'), table_name='slo_assignments')
    op.drop_index(op.f('ix_slo_assignments_model_id'), table_name='slo_assignments')
    op.drop_table('slo_assignments')
    op.drop_index(op.f('ix_deployments_slo_policy_id'), table_name='deployments')
    op.drop_index(op.f('ix_deployments_model_id'), table_name='deployments')
    op.drop_table('deployments')
    op.drop_index('uq_api_keys_tenant_id_name_live', table_name='api_keys', postgresql_where=sa.text('revoked_at IS NULL AND rotated_to_id IS NULL'))
    op.drop_index(op.f('ix_api_keys_tenant_id'), table_name='api_keys')
    op.drop_table('api_keys')
    op.drop_table('tenants')
    op.drop_table('slo_policies')
    op.drop_table('models')
    op.drop_index(op.f('ix_audit_log_tenant_id'), table_name='audit_log')
    op.drop_index('ix_audit_log_target_type_target_id', table_name='audit_log')
    op.drop_index('ix_audit_log_at', table_name='audit_log')
    op.drop_table('audit_log')
    op.drop_table('admin_tokens')


# --- what ORM metadata cannot say ----------------------------------------------------------------------
# The services connect as a role that is neither superuser nor owner, so row-level security binds it.
# Every transaction of theirs sets `baton.scope` ('tenant' | 'system') and `baton.tenant_id` with
# set_config(..., true) (transaction-local); without them a tenant-scoped table shows no rows.

# Frozen here on purpose: a migration never follows later edits of the models module.
TENANT_SCOPED_TABLES = (
    "users", "api_keys", "tenant_models", "rate_limits", "usage_records", "usage_daily",
    "request_records", "console_sessions",
)
APPEND_ONLY_TABLES = ("audit_log",)
_TENANT_MATCH = "nullif(current_setting('baton.tenant_id', true), '')::uuid"
_SYSTEM = "current_setting('baton.scope', true) = 'system'"


def _app_role() -> str:
    role = op.get_context().config.attributes.get("app_role", "baton_app")  # type: ignore[union-attr]
    if not role.replace("_", "").isalnum():
        raise ValueError(f"unsafe role name {role!r}")
    return str(role)


def _secure() -> None:
    role = _app_role()
    op.execute(
        f"""DO $$ BEGIN
              IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN
                CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
              END IF;
            END $$"""
    )
    op.execute(f"GRANT CONNECT ON DATABASE {op.get_bind().engine.url.database} TO {role}")
    op.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
    op.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}")
    op.execute(f"REVOKE ALL ON alembic_version FROM {role}")
    op.execute(f"GRANT SELECT ON alembic_version TO {role}")
    for table in APPEND_ONLY_TABLES:
        op.execute(f"REVOKE UPDATE, DELETE, TRUNCATE ON {table} FROM {role}")
    for table in TENANT_SCOPED_TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        cond = f"{_SYSTEM} OR tenant_id = {_TENANT_MATCH}"
        op.execute(f"CREATE POLICY tenant_isolation ON {table} USING ({cond}) WITH CHECK ({cond})")
    # A tenant sees its own tenant row only.
    op.execute("ALTER TABLE tenants ENABLE ROW LEVEL SECURITY")
    cond = f"{_SYSTEM} OR id = {_TENANT_MATCH}"
    op.execute(f"CREATE POLICY tenant_isolation ON tenants USING ({cond}) WITH CHECK ({cond})")


def _unsecure() -> None:
    role = _app_role()
    for table in (*TENANT_SCOPED_TABLES, "tenants"):
        op.execute(f"DROP POLICY IF EXISTS tenant_isolation ON {table}")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
    op.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {role}")
    op.execute(f"GRANT SELECT ON alembic_version TO {role}")
