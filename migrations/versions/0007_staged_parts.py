"""Updates in parts, staged in the catalog instead of memory, and logged a part per row.

* ``staged_parts``: the parts received so far of an update whose last part has not arrived
  (a source stages one update at a time: its part 0 drops whatever the source staged). Each
  row is one checked part, its changes as the part carried them and how many; ``txid`` and
  ``captured_at`` as every part carries them. They outlive a restart: the receiver takes the
  update up again where its parts stand.
* ``update_log_parts``: the changes of an update logged from its parts, one row per part,
  copied from ``staged_parts`` with its last part in the transaction that logs it. Its log
  row's ``changes`` is empty and ``parts`` counts these rows; a log row whose ``parts`` is 0
  holds its changes itself, as before. Pruning a log row removes its parts (the foreign key
  cascades).

Nothing grows with an update's size but rows: no JSON value holds more than one part (one
message), on any database.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-08
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "staged_parts",
        sa.Column("source", sa.String(100), primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True),
        sa.Column("part", sa.Integer, primary_key=True),
        sa.Column("txid", sa.String(100), nullable=True),
        sa.Column("captured_at", sa.Double, nullable=True),
        sa.Column("changes", sa.JSON, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
    )
    op.create_table(
        "update_log_parts",
        sa.Column("log_id", sa.Integer, sa.ForeignKey("update_log.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("part", sa.Integer, primary_key=True),
        sa.Column("changes", sa.JSON, nullable=False),
    )
    op.add_column("update_log", sa.Column("parts", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_table("update_log_parts")  # first: it refers to the update log
    op.drop_table("staged_parts")
    with op.batch_alter_table("update_log") as batch:
        batch.drop_column("parts")
