"""Stored ``/v1/responses`` answers (for ``previous_response_id`` and ``GET /v1/responses/{id}``), tenant-scoped
under row-level security, each with its expiry.

Revision ID: 0004_stored_responses
Revises: 0003_access_requests
Create Date: 2026-12-03 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0004_stored_responses'
down_revision: str | None = '0003_access_requests'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here on purpose, like 0001's policies: a migration never follows later edits of the models module.
_TENANT_MATCH = "nullif(current_setting('baton.tenant_id', true), '')::uuid"
_SYSTEM = "current_setting('baton.scope', true) = 'system'"


def _app_role() -> str:
    role = op.get_context().config.attributes.get("app_role", "baton_app")  # type: ignore[union-attr]
    if not role.replace("_", "").isalnum():
        raise ValueError(f"unsafe role name {role!r}")
    return str(role)


def upgrade() -> None:
    op.create_table('stored_responses',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('api_key_id', sa.UUID(), nullable=True),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('previous_response_id', sa.String(length=64), nullable=True),
    sa.Column('conversation', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('body', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['api_key_id'], ['api_keys.id'], name=op.f('fk_stored_responses_api_key_id_api_keys'),
                            ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_stored_responses_tenant_id_tenants'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_stored_responses')),
    )
    op.create_index(op.f('ix_stored_responses_api_key_id'), 'stored_responses', ['api_key_id'], unique=False)
    op.create_index(op.f('ix_stored_responses_expires_at'), 'stored_responses', ['expires_at'], unique=False)
    op.create_index(op.f('ix_stored_responses_tenant_id'), 'stored_responses', ['tenant_id'], unique=False)

    role = _app_role()
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON stored_responses TO {role}")
    op.execute("ALTER TABLE stored_responses ENABLE ROW LEVEL SECURITY")
    cond = f"{_SYSTEM} OR tenant_id = {_TENANT_MATCH}"
    op.execute(f"CREATE POLICY tenant_isolation ON stored_responses USING ({cond}) WITH CHECK ({cond})")


def downgrade() -> None:
    op.execute("DROP POLICY IF EXISTS tenant_isolation ON stored_responses")
    op.drop_index(op.f('ix_stored_responses_tenant_id'), table_name='stored_responses')
    op.drop_index(op.f('ix_stored_responses_expires_at'), table_name='stored_responses')
    op.drop_index(op.f('ix_stored_responses_api_key_id'), table_name='stored_responses')
    op.drop_table('stored_responses')
