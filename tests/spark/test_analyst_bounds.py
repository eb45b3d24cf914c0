"""Analyst SQL that Spark would run differently than it reads, or that sqlglot cannot take,
over real Spark views: a bare ``user`` is Spark's current_user() (quoted too) and is refused,
a view column named ``user`` is read qualified, deep nesting and pipe syntax are 400s."""

from __future__ import annotations

import getpass

import pytest

from tests.spark.analyst_support import api_client, settle, sim_manager
from warehouse.store.spark import SparkStore

pytestmark = pytest.mark.spark


async def test_environment_words_and_deep_queries_over_http(
    analyst_store: SparkStore, analysts, tmp_path, view: str
) -> None:
    manager, _ = await sim_manager(tmp_path, analyst_store, analysts=analysts)
    named = f"{view}_u"
    try:
        await manager.define_view(f"CREATE VIEW {view} AS SELECT r.id FROM s1.r", name=view)
        await manager.define_view(f"CREATE VIEW {named} AS SELECT r.id, r.b AS user FROM s1.r", name=named)
        await settle(manager, analyst_store, view)
        await settle(manager, analyst_store, named)
        async with await api_client(manager) as api:
            for sql in (
                f"SELECT user FROM {view}",
                f"SELECT `user` FROM {view}",
                f"SELECT id FROM {view} WHERE user = 'x'",
            ):
                answer = await api.post("/v1/query", json={"sql": sql})
                assert answer.status_code == 400, answer.text  # it used to answer the service's OS user
                assert "qualify it" in answer.json()["detail"] and getpass.getuser() not in answer.text
            # a view column named user is read qualified, and is the column
            answer = await api.post(
                "/v1/query", json={"sql": f"SELECT {named}.user FROM {named} ORDER BY {named}.id", "limit": 100}
            )
            assert answer.status_code == 200, answer.text
            expected = sorted(analyst_store.read_rows(named))
            assert [r[0] for r in answer.json()["rows"]] == [b for _, b in expected]
            answer = await api.post("/v1/query", json={"sql": f"SELECT u.user FROM {named} AS u WHERE u.user >= 0"})
            assert answer.status_code == 200 and len(answer.json()["rows"]) == len(expected)

            for sql, reason in (
                (f"SELECT {'(' * 300}1{')' * 300} FROM {view}", "levels deep"),
                (f"SELECT id FROM {view} WHERE {'NOT ' * 1000}id = 1", "levels deep"),
                (f"FROM {view} |> WHERE id > 1", "pipe syntax"),
            ):
                answer = await api.post("/v1/query", json={"sql": sql})
                assert answer.status_code == 400 and reason in answer.json()["detail"], answer.text[:300]
    finally:
        await manager.stop()
