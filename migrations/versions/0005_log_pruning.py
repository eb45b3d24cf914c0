"""What pruning the update log keeps of what it removes.

* ``sources.pruned_through``: every logged update of the source with ``seq <=`` it was
  removed. The receiver's cursor starts after it on a restart, and a wrapper that resends
  such a seq is acknowledged as a duplicate (``Catalog.append_updates``).
* ``views.folded_order`` and ``views.folded_seqs``: the unit records of the view through
  ``folded_order`` were removed; its state as of that order reflects each source through
  ``folded_seqs[source]`` (at least its base). Recovery starts the view's record of units there.
* ``units.source``, ``units.first_seq``, ``units.last_seq``: the seqs a unit holds (a unit is
  one source's updates, in seq order), so that what a view reflects as of an order can be
  told without its log entries, which pruning removes once every view reflects them. Filled
  here from the log for the units recorded before.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from typing import cast

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UNITS = sa.table(
    "units",
    sa.column("view", sa.String),
    sa.column("order_no", sa.BigInteger),
    sa.column("log_ids", sa.JSON),
    sa.column("source", sa.String),
    sa.column("first_seq", sa.BigInteger),
    sa.column("last_seq", sa.BigInteger),
)
LOG = sa.table(
    "update_log", sa.column("id", sa.Integer), sa.column("source", sa.String), sa.column("seq", sa.BigInteger)
)
CHUNK = 400  # units filled at once: two log ids each, within every SQLite's limit on bound parameters


def upgrade() -> None:
    op.add_column("sources", sa.Column("pruned_through", sa.BigInteger, nullable=False, server_default="0"))
    op.add_column("views", sa.Column("folded_order", sa.BigInteger, nullable=False, server_default="0"))
    op.add_column("views", sa.Column("folded_seqs", sa.JSON, nullable=True))
    op.add_column("units", sa.Column("source", sa.String(100), nullable=True))
    op.add_column("units", sa.Column("first_seq", sa.BigInteger, nullable=True))
    op.add_column("units", sa.Column("last_seq", sa.BigInteger, nullable=True))
    bind = op.get_bind()
    recorded: list[tuple[str, int, int, int]] = []
    for view, order, log_ids in bind.execute(sa.select(UNITS.c.view, UNITS.c.order_no, UNITS.c.log_ids)):
        held = cast(list[int], log_ids)
        if held:
            recorded.append((cast(str, view), cast(int, order), held[0], held[-1]))
    for start in range(0, len(recorded), CHUNK):
        chunk = recorded[start : start + CHUNK]
        ends = {i for _, _, first, last in chunk for i in (first, last)}
        logged = {i: (source, seq) for i, source, seq in bind.execute(sa.select(LOG).where(LOG.c.id.in_(ends)))}
        for view, order, first, last in chunk:
            if first in logged and last in logged:
                bind.execute(
                    UNITS.update()
                    .where(UNITS.c.view == view, UNITS.c.order_no == order)
                    .values(source=logged[first][0], first_seq=logged[first][1], last_seq=logged[last][1])
                )


def downgrade() -> None:
    with op.batch_alter_table("units") as batch:
        batch.drop_column("last_seq")
        batch.drop_column("first_seq")
        batch.drop_column("source")
    with op.batch_alter_table("views") as batch:
        batch.drop_column("folded_seqs")
        batch.drop_column("folded_order")
    with op.batch_alter_table("sources") as batch:
        batch.drop_column("pruned_through")
