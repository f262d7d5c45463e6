"""Request records: the decode server's measured phases (nullable JSONB).

Revision ID: 0002_request_phases
Revises: 0001
Create Date: 2026-12-02 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0002_request_phases'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing, and records from before keep NULL (the console
    # then derives their waterfall from the record's timings). Grants and row-level security are per
    # table (0001), so the service role reads and writes the column as it does the rest of the row.
    op.add_column('request_records', sa.Column('phases', postgresql.JSONB(astext_type=sa.Text()), nullable=True))


def downgrade() -> None:
    op.drop_column('request_records', 'phases')
