"""Flow control: a tenant's share weight in its SLO policy; each request's queue wait and class.

Revision ID: 0006_flow_control
Revises: 0005_model_serving
Create Date: 2026-12-05 23:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0006_flow_control'
down_revision: str | None = '0005_model_serving'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A policy's weight: its tenants' share of a band's tokens, relative to the others' (1 = equal).
    op.add_column('slo_policies', sa.Column('weight', sa.Float(), nullable=False, server_default=sa.text('1')))
    op.create_check_constraint('weight_range', 'slo_policies', 'weight > 0 AND weight <= 100')
    # Nullable, no default: records from before flow control keep NULL (no queue measured).
    op.add_column('request_records', sa.Column('queue_ms', sa.Float(), nullable=True))
    op.add_column('request_records', sa.Column('flow_class', sa.String(100), nullable=True))


def downgrade() -> None:
    op.drop_column('request_records', 'flow_class')
    op.drop_column('request_records', 'queue_ms')
    op.drop_constraint('weight_range', 'slo_policies', type_='check')
    op.drop_column('slo_policies', 'weight')
