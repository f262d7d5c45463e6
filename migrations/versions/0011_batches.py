"""The Batch API: files (``/v1/files``, their bytes in parts), batches and their lines, tenant-scoped under
row-level security; usage records name the batch a request was a line of.

Revision ID: 0011_batches
Revises: 0010_request_token_cap
Create Date: 2026-12-07 13:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0011_batches'
down_revision: str | None = '0010_request_token_cap'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here on purpose, like 0001's policies: a migration never follows later edits of the models module.
_TENANT_MATCH = "nullif(current_setting('baton.tenant_id', true), '')::uuid"
_SYSTEM = "current_setting('baton.scope', true) = 'system'"
TABLES = ("files", "file_parts", "batches", "batch_lines")


def _app_role() -> str:
    role = op.get_context().config.attributes.get("app_role", "baton_app")  # type: ignore[union-attr]
    if not role.replace("_", "").isalnum():
        raise ValueError(f"unsafe role name {role!r}")
    return str(role)


def _tenant(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f(f'fk_{table}_tenant_id_tenants'),
                                   ondelete='CASCADE')


def _key(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(['api_key_id'], ['api_keys.id'], name=op.f(f'fk_{table}_api_key_id_api_keys'),
                                   ondelete='SET NULL')


def _ts(name: str, nullable: bool = True) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table('files',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('api_key_id', sa.UUID(), nullable=True),
    sa.Column('purpose', sa.String(length=32), nullable=False),
    sa.Column('filename', sa.String(length=255), nullable=False),
    sa.Column('bytes', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('lines', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    _ts('expires_at'),
    _key('files'), _tenant('files'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_files')),
    )
    op.create_index(op.f('ix_files_api_key_id'), 'files', ['api_key_id'], unique=False)
    op.create_index(op.f('ix_files_expires_at'), 'files', ['expires_at'], unique=False)
    op.create_index(op.f('ix_files_tenant_id'), 'files', ['tenant_id'], unique=False)
    op.create_table('file_parts',
    sa.Column('file_id', sa.String(length=64), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=False),
    sa.ForeignKeyConstraint(['file_id'], ['files.id'], name=op.f('fk_file_parts_file_id_files'), ondelete='CASCADE'),
    _tenant('file_parts'),
    sa.PrimaryKeyConstraint('file_id', 'seq', name=op.f('pk_file_parts')),
    )
    op.create_table('batches',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('api_key_id', sa.UUID(), nullable=True),
    sa.Column('endpoint', sa.String(length=64), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('input_file_id', sa.String(length=64), nullable=False),
    sa.Column('output_file_id', sa.String(length=64), nullable=True),
    sa.Column('error_file_id', sa.String(length=64), nullable=True),
    sa.Column('completion_window', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('total', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('metadata', postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), nullable=True),
    sa.Column('errors', postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    _ts('expires_at', nullable=False), _ts('in_progress_at'), _ts('finalizing_at'), _ts('completed_at'),
    _ts('failed_at'), _ts('expired_at'), _ts('cancelling_at'), _ts('cancelled_at'),
    _key('batches'), _tenant('batches'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_batches')),
    )
    op.create_index(op.f('ix_batches_api_key_id'), 'batches', ['api_key_id'], unique=False)
    op.create_index(op.f('ix_batches_model'), 'batches', ['model'], unique=False)
    op.create_index(op.f('ix_batches_status'), 'batches', ['status'], unique=False)
    op.create_index(op.f('ix_batches_tenant_id'), 'batches', ['tenant_id'], unique=False)
    op.create_table('batch_lines',
    sa.Column('batch_id', sa.String(length=64), nullable=False),
    sa.Column('line', sa.Integer(), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('custom_id', sa.String(length=512), nullable=False),
    sa.Column('body', sa.LargeBinary(), nullable=False),
    sa.Column('state', sa.String(length=16), server_default=sa.text("'pending'"), nullable=False),
    sa.Column('attempt', sa.Integer(), server_default=sa.text('0'), nullable=False),
    _ts('lease_until'), _ts('not_before'),
    sa.Column('request_id', sa.UUID(), nullable=False),
    sa.Column('response', sa.LargeBinary(), nullable=True),
    sa.Column('error', postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), nullable=True),
    _ts('finished_at'),
    sa.ForeignKeyConstraint(['batch_id'], ['batches.id'], name=op.f('fk_batch_lines_batch_id_batches'),
                            ondelete='CASCADE'),
    _tenant('batch_lines'),
    sa.PrimaryKeyConstraint('batch_id', 'line', name=op.f('pk_batch_lines')),
    sa.UniqueConstraint('batch_id', 'custom_id', name=op.f('uq_batch_lines_batch_id_custom_id')),
    )
    op.create_index('ix_batch_lines_open', 'batch_lines', ['batch_id', 'state'], unique=False,
                    postgresql_where=sa.text("state IN ('pending', 'running')"))
    op.add_column('usage_records', sa.Column('batch_id', sa.String(length=64), nullable=True))
    op.create_index(op.f('ix_usage_records_batch_id'), 'usage_records', ['batch_id'], unique=False)

    role = _app_role()
    cond = f"{_SYSTEM} OR tenant_id = {_TENANT_MATCH}"
    for table in TABLES:
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {role}")
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY tenant_isolation ON {table} USING ({cond}) WITH CHECK ({cond})")


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"DROP POLICY IF EXISTS tenant_isolation ON {table}")
    op.drop_index(op.f('ix_usage_records_batch_id'), table_name='usage_records')
    op.drop_column('usage_records', 'batch_id')
    op.drop_index('ix_batch_lines_open', table_name='batch_lines', postgresql_where=sa.text(
        "state IN ('pending', 'running')"))
    op.drop_table('batch_lines')
    for name in ('ix_batches_tenant_id', 'ix_batches_status', 'ix_batches_model', 'ix_batches_api_key_id'):
        op.drop_index(op.f(name), table_name='batches')
    op.drop_table('batches')
    op.drop_table('file_parts')
    for name in ('ix_files_tenant_id', 'ix_files_expires_at', 'ix_files_api_key_id'):
        op.drop_index(op.f(name), table_name='files')
    op.drop_table('files')
