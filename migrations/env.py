from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from warehouse.catalog.models import Base

config = context.config
url = config.get_main_option("sqlalchemy.url")
connection = config.attributes.get("connection")


def run() -> None:
    if connection is not None:
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    assert url is not None  # migrations.alembic_config always sets it
    engine = create_engine(url)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run()
