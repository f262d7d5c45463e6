"""Flow control: an SLO policy's own queue bounds (the longest wait, and how many of a tenant's requests
may wait at once); null keeps the gateway's settings.

Revision ID: 0007_flow_queue_bounds
Revises: 0006_flow_control
Create Date: 2026-12-06 17:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0007_flow_queue_bounds'
down_revision: str | None = '0006_flow_control'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('slo_policies', sa.Column('max_wait_s', sa.Float(), nullable=True))
    op.add_column('slo_policies', sa.Column('max_waiting', sa.Integer(), nullable=True))
    op.create_check_constraint('max_wait_range', 'slo_policies', 'max_wait_s > 0 AND max_wait_s <= 3600')
    op.create_check_constraint('max_waiting_range', 'slo_policies', 'max_waiting >= 1 AND max_waiting <= 100000')


def downgrade() -> None:
    op.drop_constraint('max_waiting_range', 'slo_policies', type_='check')
    op.drop_constraint('max_wait_range', 'slo_policies', type_='check')
    op.drop_column('slo_policies', 'max_waiting')
    op.drop_column('slo_policies', 'max_wait_s')
