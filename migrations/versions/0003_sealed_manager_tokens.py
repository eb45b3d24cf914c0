"""Manager tokens sealed at rest: ``sources.manager_token`` (clear text) becomes
``sources.sealed_manager_token``, the token sealed with the catalog's key file
(``warehouse.catalog.secrets``).

Existing tokens are sealed here, with the key of whoever opens the catalog (``Catalog``
passes its ``TokenSealer`` as the ``token_sealer`` attribute of the Alembic config). A
catalog that holds tokens cannot be upgraded without one: the check comes before any change,
so a refused upgrade leaves the catalog as it was (MariaDB cannot roll DDL back).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from warehouse.catalog.secrets import SealError

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

SOURCES = sa.table(
    "sources",
    sa.column("name", sa.String),
    sa.column("manager_token", sa.String),
    sa.column("sealed_manager_token", sa.Text),
)


def _sealer(tokens: Sequence[tuple[str, str]], action: str):
    sealer = context.config.attributes.get("token_sealer")
    if sealer is None and tokens:
        names = ", ".join(sorted(name for name, _ in tokens))
        raise SealError(
            f"the catalog keeps the manager tokens of source(s) {names}; {action} them needs the catalog's "
            "key file: open the catalog with the manager's data directory (pvm serve --data-dir DIR, or "
            "pvm token … --data-dir DIR next to --catalog)"
        )
    return sealer


def upgrade() -> None:
    bind = op.get_bind()
    clear = bind.execute(
        sa.select(SOURCES.c.name, SOURCES.c.manager_token).where(SOURCES.c.manager_token.is_not(None))
    ).all()
    sealer = _sealer(clear, "sealing")
    op.add_column("sources", sa.Column("sealed_manager_token", sa.Text, nullable=True))
    for name, token in clear:
        bind.execute(SOURCES.update().where(SOURCES.c.name == name).values(sealed_manager_token=sealer.seal(token)))
    with op.batch_alter_table("sources") as batch:
        batch.drop_column("manager_token")


def downgrade() -> None:
    bind = op.get_bind()
    sealed = bind.execute(
        sa.select(SOURCES.c.name, SOURCES.c.sealed_manager_token).where(SOURCES.c.sealed_manager_token.is_not(None))
    ).all()
    sealer = _sealer(sealed, "unsealing")
    op.add_column("sources", sa.Column("manager_token", sa.String(300), nullable=True))
    for name, token in sealed:
        bind.execute(SOURCES.update().where(SOURCES.c.name == name).values(manager_token=sealer.unseal(token)))
    with op.batch_alter_table("sources") as batch:
        batch.drop_column("sealed_manager_token")
