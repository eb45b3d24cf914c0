"""The maintenance oracle with the Spark view store: the view as of every W and at
quiescence equals recomputation (fewer schedules than with the in-process store: Spark
appends take a fraction of a second each)."""

from __future__ import annotations

import pytest

from tests.test_oracle import OUTER_JOIN_VIEWS, SELF_JOIN_VIEWS, run_schedule
from warehouse.store.spark import SparkStore


@pytest.mark.parametrize("seed", range(6))
async def test_schedule_matches_recomputation_on_spark(spark, tmp_path, seed):
    store = SparkStore(spark, tmp_path / "spark")
    try:
        outcome = await run_schedule(tmp_path, 300 + seed, store=store, transactions=16, inline=False)
        assert not outcome.mismatches, "\n".join(outcome.mismatches)
        assert len(store.views()) == 2
    finally:
        for view in store.views():
            store.drop(view)


@pytest.mark.parametrize("views", [SELF_JOIN_VIEWS, OUTER_JOIN_VIEWS], ids=["self-joins", "left-joins"])
async def test_self_and_left_join_schedules_on_spark(spark, tmp_path, views):
    """NULL-extended rows and a table read twice, in the Spark store's typed tables."""
    store = SparkStore(spark, tmp_path / "spark")
    try:
        outcome = await run_schedule(tmp_path, 320, store=store, transactions=16, inline=False, views=views)
        assert not outcome.mismatches, "\n".join(outcome.mismatches)
        assert len(store.views()) == 2
    finally:
        for view in store.views():
            store.drop(view)
