"""Access requests (a tenant asks for a model, an operator approves or declines), and the kind of an API
key (``standard`` or ``playground``: at most one unrevoked playground key per console user).

Revision ID: 0003_access_requests
Revises: 0002_request_phases
Create Date: 2026-12-02 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003_access_requests'
down_revision: str | None = '0002_request_phases'
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
    op.add_column('api_keys', sa.Column(
        'kind', sa.Enum('standard', 'playground', name='key_kind', native_enum=False, create_constraint=True,
                        length=32),
        server_default='standard', nullable=False))
    op.create_index('uq_api_keys_playground_per_user', 'api_keys', ['tenant_id', 'created_by'], unique=True,
                    postgresql_where=sa.text("kind = 'playground' AND revoked_at IS NULL"))

    op.create_table('access_requests',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('tenant_id', sa.UUID(), nullable=False),
    sa.Column('model_id', sa.UUID(), nullable=True),
    sa.Column('note', sa.String(length=1000), nullable=True),
    sa.Column('requested_by', sa.String(length=200), nullable=False),
    sa.Column('requested_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('state', sa.Enum('pending', 'approved', 'declined', name='access_request_state', native_enum=False,
                               create_constraint=True, length=32), server_default='pending', nullable=False),
    sa.Column('resolved_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('resolved_by', sa.String(length=200), nullable=True),
    sa.Column('reason', sa.String(length=1000), nullable=True),
    sa.CheckConstraint("(state = 'pending') = (resolved_at IS NULL)",
                       name=op.f('ck_access_requests_resolved_unless_pending')),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_access_requests_model_id_models'),
                            ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_access_requests_tenant_id_tenants'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_access_requests')),
    )
    op.create_index(op.f('ix_access_requests_model_id'), 'access_requests', ['model_id'], unique=False)
    op.create_index(op.f('ix_access_requests_tenant_id'), 'access_requests', ['tenant_id'], unique=False)
    op.create_index('ix_access_requests_state_requested_at', 'access_requests', ['state', 'requested_at'],
                    unique=False)
    op.create_index('uq_access_requests_pending', 'access_requests',
                    ['tenant_id', sa.text("coalesce(model_id, '00000000-0000-0000-0000-000000000000'::uuid)")],
                    unique=True, postgresql_where=sa.text("state = 'pending'"))

    # The service role's grants and row-level security, as 0001 gives every tenant-scoped table.
    role = _app_role()
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON access_requests TO {role}")
    op.execute("ALTER TABLE access_requests ENABLE ROW LEVEL SECURITY")
    cond = f"{_SYSTEM} OR tenant_id = {_TENANT_MATCH}"
    op.execute(f"CREATE POLICY tenant_isolation ON access_requests USING ({cond}) WITH CHECK ({cond})")


def downgrade() -> None:
    op.execute("DROP POLICY IF EXISTS tenant_isolation ON access_requests")
    op.drop_index('uq_access_requests_pending', table_name='access_requests')
    op.drop_index('ix_access_requests_state_requested_at', table_name='access_requests')
    op.drop_index(op.f('ix_access_requests_tenant_id'), table_name='access_requests')
    op.drop_index(op.f('ix_access_requests_model_id'), table_name='access_requests')
    op.drop_table('access_requests')
    op.drop_index('uq_api_keys_playground_per_user', table_name='api_keys')
    op.drop_column('api_keys', 'kind')
