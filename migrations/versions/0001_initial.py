"""The initial catalog: sources, relations, views, update log, units, store tables.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sources",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("wrapper_url", sa.String(500), nullable=False),
        sa.Column("capture", sa.String(50), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "relations",
        sa.Column("source", sa.String(100), sa.ForeignKey("sources.name", ondelete="CASCADE"), primary_key=True),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("columns", sa.JSON, nullable=False),
        sa.Column("types", sa.JSON, nullable=False),
        sa.Column("primary_key", sa.JSON, nullable=False),
    )
    op.create_table(
        "views",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("sql", sa.Text, nullable=False),
        sa.Column("parallelism", sa.Integer, nullable=False),
        sa.Column("batch_size", sa.Integer, nullable=False),
        sa.Column("commit_mode", sa.String(20), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("bases", sa.JSON, nullable=False),
        sa.Column("watermark", sa.BigInteger, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "update_log",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("source", sa.String(100), nullable=False, index=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("changes", sa.JSON, nullable=False),
        sa.Column("txid", sa.String(100), nullable=True),
        sa.Column("captured_at", sa.Float, nullable=True),
        sa.Column("received_at", sa.Float, nullable=False),
        sa.UniqueConstraint("source", "seq", name="uq_update_log_source_seq"),
    )
    op.create_table(
        "units",
        sa.Column("view", sa.String(64), sa.ForeignKey("views.name", ondelete="CASCADE"), primary_key=True),
        sa.Column("order_no", sa.BigInteger, primary_key=True),
        sa.Column("log_ids", sa.JSON, nullable=False),
        sa.Column("committed", sa.Boolean, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("committed_at", sa.Float, nullable=True),
    )
    op.create_table(
        "store_tables",
        sa.Column("view", sa.String(64), primary_key=True),
        sa.Column("record", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    for table in ("store_tables", "units", "update_log", "views", "relations", "sources"):
        op.drop_table(table)
