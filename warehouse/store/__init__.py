"""Where materialized views live: the interface, an in-process store and the Spark store."""

from warehouse.store.base import Effect, StoreError, Summed, ViewStore

__all__ = ["Effect", "StoreError", "Summed", "ViewStore"]
