"""The catalog database: sources, relations, views, the durable update log and progress."""

from warehouse.catalog.db import Catalog, CatalogError

__all__ = ["Catalog", "CatalogError"]
