"""Epoch times in double precision on every database.

The catalog's times (seconds since the epoch: ``received_at``, ``committed_at``, ...) were
``sa.Float`` columns: double precision on SQLite (REAL) and PostgreSQL (FLOAT), but MariaDB
and MySQL store a bare FLOAT in single precision, 24 bits of mantissa, so a time of 1.8e9
seconds is rounded to a multiple of 128 s. Pruning compares them with a cut-off (an update
received, a unit committed before it, ``Catalog.prune``): rounded up, a fresh row stays past
its cut-off, rounded down, a young one goes before its retention ends. ``DOUBLE`` holds
them to the microsecond. SQLite's REAL is an 8-byte double already: nothing to change there
(and recreating its tables would run the cascades of their foreign keys).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TIMES = {
    "sources": {"created_at": False},
    "views": {"created_at": False},
    "update_log": {"captured_at": True, "received_at": False},
    "units": {"started_at": False, "committed_at": True},
    "tokens": {"created_at": False, "revoked_at": True},
}
"""Table -> column -> nullable: every epoch-time column of the catalog."""


def _retype(old: type[sa.types.TypeEngine], new: type[sa.types.TypeEngine]) -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, columns in TIMES.items():
        for column, nullable in columns.items():
            # MySQL's MODIFY restates the whole column: say whether it is nullable
            op.alter_column(table, column, type_=new(), existing_type=old(), existing_nullable=nullable)


def upgrade() -> None:
    _retype(sa.Float, sa.Double)


def downgrade() -> None:
    _retype(sa.Double, sa.Float)
