"""Alembic migrations of the catalog database; ``upgrade(url)`` brings a database to head."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def alembic_config(url: str):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(url), revision)
