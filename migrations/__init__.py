"""Alembic migrations of the catalog database; ``upgrade(url)`` brings a database to head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def alembic_config(url: str):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head", token_sealer: Any = None) -> None:
    """``token_sealer`` (a ``warehouse.catalog.secrets.TokenSealer``) seals the manager
    tokens of a catalog written before they were sealed (migration 0003)."""
    from alembic import command

    config = alembic_config(url)
    config.attributes["token_sealer"] = token_sealer
    command.upgrade(config, revision)
