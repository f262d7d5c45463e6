"""Rate limits: a cap on one request's tokens (its prompt and the completion it may ask for together),
for a tenant or one of its keys.

Revision ID: 0010_request_token_cap
Revises: 0009_deployment_rollback
Create Date: 2026-12-06 23:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0010_request_token_cap'
down_revision: str | None = '0009_deployment_rollback'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = ("coalesce(requests_per_minute, 1) > 0 AND coalesce(tokens_per_minute, 1) > 0 "
       "AND coalesce(max_concurrency, 1) > 0")


def upgrade() -> None:
    op.add_column('rate_limits', sa.Column('max_tokens_per_request', sa.Integer(), nullable=True))
    op.drop_constraint(op.f('ck_rate_limits_positive'), 'rate_limits', type_='check')
    op.create_check_constraint(op.f('ck_rate_limits_positive'), 'rate_limits',
                               OLD + " AND coalesce(max_tokens_per_request, 1) > 0")


def downgrade() -> None:
    op.drop_constraint(op.f('ck_rate_limits_positive'), 'rate_limits', type_='check')
    op.create_check_constraint(op.f('ck_rate_limits_positive'), 'rate_limits', OLD)
    op.drop_column('rate_limits', 'max_tokens_per_request')
