"""How a catalogue model is served: its kind (``generate`` or ``embed``), and the tool-call parser,
reasoning parser and chat template its engines get.

Revision ID: 0005_model_serving
Revises: 0004_stored_responses
Create Date: 2026-12-03 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005_model_serving'
down_revision: str | None = '0004_stored_responses'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('models', sa.Column('kind', sa.String(length=16), server_default=sa.text("'generate'"),
                                      nullable=False))
    op.add_column('models', sa.Column('tool_call_parser', sa.String(length=64), nullable=True))
    op.add_column('models', sa.Column('reasoning_parser', sa.String(length=64), nullable=True))
    op.add_column('models', sa.Column('chat_template', sa.Text(), nullable=True))
    op.create_check_constraint(op.f('ck_models_kind'), 'models', "kind IN ('generate', 'embed')")
    op.create_check_constraint(op.f('ck_models_embed_serving'), 'models',
                               "kind = 'generate' OR (tool_call_parser IS NULL AND reasoning_parser IS NULL)")


def downgrade() -> None:
    op.drop_constraint(op.f('ck_models_embed_serving'), 'models', type_='check')
    op.drop_constraint(op.f('ck_models_kind'), 'models', type_='check')
    op.drop_column('models', 'chat_template')
    op.drop_column('models', 'reasoning_parser')
    op.drop_column('models', 'tool_call_parser')
    op.drop_column('models', 'kind')
