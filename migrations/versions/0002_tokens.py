"""Bearer tokens of the API's roles, and the token the manager presents to each wrapper.

``tokens`` holds one row per issued token: its role (admin, analyst, wrapper), the source a
wrapper token is bound to, a label, and a salted PBKDF2 hash of its secret (the secret
itself is shown once, when the token is created). ``sources.manager_token`` is the secret
the manager sends to the source's wrapper (the wrapper's ``--manager-token``); the manager
must present it, so it is kept as given.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("source", sa.String(100), nullable=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("hash", sa.String(300), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float, nullable=True),
    )
    op.add_column("sources", sa.Column("manager_token", sa.String(300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sources") as batch:
        batch.drop_column("manager_token")
    op.drop_table("tokens")
