"""Deployments: the reconciler's memory for rolling back, the Serve application entries of the last
generation seen running, and a generation that failed to start in Ray with why.

Revision ID: 0009_deployment_rollback
Revises: 0008_key_secret_fingerprint
Create Date: 2026-12-06 20:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0009_deployment_rollback'
down_revision: str | None = '0008_key_secret_fingerprint'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('deployments', sa.Column('last_good', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column('deployments', sa.Column('failed_generation', sa.Integer(), nullable=True))
    op.add_column('deployments', sa.Column('failed_reason', sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column('deployments', 'failed_reason')
    op.drop_column('deployments', 'failed_generation')
    op.drop_column('deployments', 'last_good')
