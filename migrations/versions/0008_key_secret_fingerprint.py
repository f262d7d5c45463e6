"""API keys: the fingerprint of the key secret each key's hash was made with, so a process whose secret
differs refuses to mint keys nobody would accept and a gateway says why it cannot check them.

Revision ID: 0008_key_secret_fingerprint
Revises: 0007_flow_queue_bounds
Create Date: 2026-12-06 20:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0008_key_secret_fingerprint'
down_revision: str | None = '0007_flow_queue_bounds'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('api_keys', sa.Column('secret_fingerprint', sa.String(length=32), nullable=True))


def downgrade() -> None:
    op.drop_column('api_keys', 'secret_fingerprint')
