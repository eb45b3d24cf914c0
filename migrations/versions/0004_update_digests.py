"""A digest of each logged update's content, to tell a resent update from a different one.

``update_log.digest`` is the SHA-256 of the update's changes as canonical JSON
(``warehouse.catalog.db.content_digest``). A wrapper that resends a seq with other content
than the logged one is refused (409) instead of being acknowledged while the new content is
dropped. Rows logged before this revision have no digest: it is computed from their stored
changes when a resend needs it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("update_log", sa.Column("digest", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("update_log") as batch:
        batch.drop_column("digest")
