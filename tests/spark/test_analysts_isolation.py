"""Analysts cannot reach maintenance: queries that kill the JVM, plans that never finish and
queries that run too long end in the analysts' query process, which is restarted when need
be, while the manager keeps maintaining the view and answering health; limits on concurrent
queries and answer sizes hold. The process here is one of its own (small limits), so that
its restarts do not disturb the other tests' process.

Every restart costs a JVM start and warm-up (10 to 30 s on a busy machine), which the next
test waits for: the tests are ordered so that the last restart (the never-ending plan's) is
the one nobody waits for, the queries past their time share one restart with the limits,
and a restart waits 0.5 s at most, not the service's backoff of 2, 4 and 8 s for restarts
within a minute of one another (the supervisor's to test: ``restart_backoff``)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator

import httpx
import pytest

from api.auth import issue
from api.manager_app import create_app
from tests.spark.analyst_support import change, join_sql, settle, sim_manager
from warehouse.analysts.supervisor import AnalystProcess, AnalystSettings, QueryTimedOut
from warehouse.backoff import Backoff
from warehouse.store.spark import SparkStore

pytestmark = pytest.mark.spark

TIMEOUT_S = 6.0
GRACE_S = 3.0

# Twelve chained CTEs, each twice the one before: the plan doubles at every step and Spark's
# driver works on it far longer than any timeout, without starting a job to cancel.
EXPLODING_PLAN = (
    "WITH c0 AS (SELECT id FROM {view}), "
    + ", ".join(f"c{i} AS (SELECT id FROM c{i - 1} UNION ALL SELECT id FROM c{i - 1})" for i in range(1, 13))
    + " SELECT count(*) FROM c12"
)
# A ten-way cross join (some 10^10 rows): jobs whose tasks run for hours unless interrupted.
ENDLESS_JOIN = "SELECT count(*) FROM " + ", ".join("{view} " + alias for alias in "abcdefghij")


@pytest.fixture(scope="module")
def small_analysts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AnalystProcess]:
    process = AnalystProcess(
        AnalystSettings(
            work_dir=tmp_path_factory.mktemp("small-analysts"),
            master="local[1]",
            memory="512m",
            concurrency=2,
            per_principal=1,
            timeout_s=TIMEOUT_S,
            grace_s=GRACE_S,
            max_result_bytes=4096,
            spark_conf={"spark.sql.shuffle.partitions": "2"},
            restart_backoff=Backoff(first_s=0.1, max_s=0.5),
        )
    )
    process.start()
    assert process.wait_ready(180), process.status()
    yield process
    process.stop()


async def running_view(tmp_path, store: SparkStore, analysts: AnalystProcess, view: str):
    store.subscribe(analysts.publish)
    manager, sources = await sim_manager(tmp_path, store, seed=11, analysts=analysts)
    await manager.define_view(join_sql(view), name=view, parallelism=2)
    await settle(manager, store, view)
    return manager, sources


def client_of(manager, token: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(manager))
    return httpx.AsyncClient(
        transport=transport, base_url="http://manager", headers={"Authorization": f"Bearer {token}"}, timeout=120
    )


async def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


async def maintained_meanwhile(manager, sources, store: SparkStore, view: str) -> None:
    """Source changes keep reaching the view: W moves on."""
    before = manager.watermark(view)
    rng = random.Random(before)
    for _ in range(3):
        change(sources["s1"], rng)
        await sources["s1"].ship()
    await settle(manager, store, view)
    assert manager.watermark(view) > before


async def test_the_query_process_warms_up_before_it_says_it_is_ready(small_analysts: AnalystProcess) -> None:
    """A fresh JVM's first query pays for loading the planner and code generation: the
    process pays it itself, before it answers, so that no analyst's time limit does."""
    await wait_until(lambda: small_analysts.ready, 120, "the query process is ready")
    log = (small_analysts.settings.work_dir / "query-process.log").read_text()
    warmed, ready = log.find("query process warmed up in"), log.find("analysts' query process ready on")
    assert 0 <= warmed < ready, log[-2000:]


async def test_a_query_that_kills_the_jvm_restarts_only_the_query_process(
    spark_store: SparkStore, small_analysts: AnalystProcess, tmp_path, view: str
) -> None:
    manager, sources = await running_view(tmp_path, spark_store, small_analysts, view)
    restarts = small_analysts.restarts
    try:
        _, token = await issue(manager, "analyst")
        async with client_of(manager, token) as api:
            # a cold query process can spend its time limit planning its first cross join and
            # aggregate: warm it (answered, or cancelled at the limit), so that the query below
            # meets its heap, not its time limit
            warm = await api.post(
                "/v1/query",
                json={
                    "sql": f"SELECT length(aggregate(collect_list(CAST(a.id AS STRING)), 'y', (acc, x) -> acc)) FROM {view} a, {view} b"
                },
            )
            assert warm.status_code in (200, 400), warm.text
            # text that doubles for every row of a cross join: past any heap, yet no single
            # call names a size the check could refuse (lpad(x, 2147483647) it refuses)
            sql = (
                "SELECT length(aggregate(collect_list(CAST(a.id AS STRING)), 'y', (acc, x) -> concat(acc, acc))) "
                f"FROM {view} a, {view} b"
            )
            # on a busy machine the doubling may not reach the heap within the short time
            # limit: the query is then cancelled (400 naming the limit) and sent again
            for _ in range(3):
                await wait_until(lambda: small_analysts.ready, 120, "the query process is ready")
                answer = await api.post("/v1/query", json={"sql": sql})
                if not (answer.status_code == 400 and "ran longer" in answer.text):
                    break
            assert answer.status_code == 503 and answer.headers["Retry-After"], answer.text
            assert "restarted" in answer.json()["detail"]
            health = await api.get("/v1/health")
            assert health.status_code == 200 and health.json()["ok"]
            await maintained_meanwhile(manager, sources, spark_store, view)
            await wait_until(lambda: small_analysts.ready, 120, "the query process came back")
            assert small_analysts.restarts >= restarts + 1  # a cancelled try's tasks may have ended one too
            await settle(manager, spark_store, view)
            # the new process answers; on a busy machine its first read of the view may still
            # meet the short time limit, which is a 400 naming the limit, and is asked again
            for _ in range(3):
                answer = await api.post("/v1/query", json={"sql": f"SELECT count(*) FROM {view}"})
                if not (answer.status_code == 400 and "ran longer" in answer.text):
                    break
            assert answer.status_code == 200, answer.text
            assert answer.json()["rows"] == [[len(spark_store.read_rows(view))]]
    finally:
        await manager.stop()


async def test_limits_hold_and_queries_past_their_time_stop_running(
    spark_store: SparkStore, small_analysts: AnalystProcess, tmp_path, view: str
) -> None:
    """An answer is cut to the size limit; one token, then the service, runs no more queries
    at once than its limit; and queries past their time are answered so and stop running."""
    manager, sources = await running_view(tmp_path, spark_store, small_analysts, view)
    await wait_until(lambda: small_analysts.ready, 120, "the query process is ready")
    try:
        _, first = await issue(manager, "analyst")
        _, second = await issue(manager, "analyst")
        _, third = await issue(manager, "analyst")
        async with client_of(manager, first) as a, client_of(manager, second) as b, client_of(manager, third) as c:
            wide = f"SELECT a.id, a.b, b.c, lpad('x', 100, 'x') AS pad FROM {view} a, {view} b"
            answer = await c.post("/v1/query", json={"sql": wide, "limit": 1000})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["truncated"] and 0 < len(body["rows"]) < 1000
            assert len(str(body["rows"])) <= 4096 * 1.2

            restarts = small_analysts.restarts
            slow = asyncio.create_task(a.post("/v1/query", json={"sql": ENDLESS_JOIN.format(view=view)}))
            await wait_until(lambda: sum(small_analysts._admitted.values()) == 1, 10, "the slow query runs")
            again = await a.post("/v1/query", json={"sql": f"SELECT count(*) FROM {view}"})
            assert again.status_code == 429 and again.headers["Retry-After"] == "1"
            assert "the most one token may run at once" in again.json()["detail"]
            other = asyncio.create_task(b.post("/v1/query", json={"sql": ENDLESS_JOIN.format(view=view)}))
            await wait_until(lambda: sum(small_analysts._admitted.values()) == 2, 10, "both slow queries run")
            full = await c.post("/v1/query", json={"sql": f"SELECT count(*) FROM {view}"})
            assert full.status_code == 429 and "the most the service runs at once" in full.json()["detail"]
            # the first is answered past its time (400 naming the limit); so is the other, or it
            # ends in the process that the first's ignored cancel ended (503)
            answer = await slow
            assert answer.status_code == 400 and "longer than" in answer.json()["detail"], answer.text
            ended = (await other).status_code
            assert ended in (400, 503), ended

            # Their jobs are cancelled; a cross join's tasks never look at their interrupt, so
            # the process ends itself once they have run the grace period past the cancel:
            # nothing of the queries holds a core afterwards.
            def stopped() -> bool:
                health = small_analysts._health()
                if small_analysts.restarts > restarts:
                    return small_analysts.ready
                return health is not None and not health.running and not health.zombie_tasks

            await wait_until(stopped, GRACE_S + 60, "the queries' work stopped")
            if small_analysts.restarts > restarts:
                # ended by its own reaper (exit 71), or, on a machine too busy for the reaper
                # to look in time, by the manager once the grace period after the cancel passed;
                # the other query's 503 may have been the first to see it gone
                why = small_analysts.last_exit or ""
                assert (
                    "exited with code 71" in why
                    or "after it was cancelled" in why
                    or (ended == 503 and "stopped answering" in why)
                ), why
            await settle(manager, spark_store, view)
            started = time.monotonic()
            answer = await c.post("/v1/query", json={"sql": f"SELECT count(*) FROM {view}"})
            assert answer.status_code == 200 and time.monotonic() - started < TIMEOUT_S  # no core held
    finally:
        await manager.stop()


async def test_a_plan_that_never_finishes_is_ended_and_health_answers_meanwhile(
    spark_store: SparkStore, small_analysts: AnalystProcess, tmp_path, view: str
) -> None:
    manager, sources = await running_view(tmp_path, spark_store, small_analysts, view)
    await wait_until(lambda: small_analysts.ready, 120, "the query process is ready")
    restarts = small_analysts.restarts
    try:
        _, token = await issue(manager, "analyst")
        async with client_of(manager, token) as api:
            # the API refuses the statement before any Spark sees it
            refused = await api.post("/v1/query", json={"sql": EXPLODING_PLAN.format(view=view)})
            assert refused.status_code == 400 and "4096 times" in refused.json()["detail"], refused.text
            # and the query process, handed such a plan anyway, is ended when it cannot stop
            started = time.monotonic()
            query = asyncio.create_task(small_analysts.query(EXPLODING_PLAN.format(view=view), 10, "direct"))
            slowest = 0.0
            while not query.done():
                asked = time.monotonic()
                assert (await api.get("/v1/health")).status_code == 200
                slowest = max(slowest, time.monotonic() - asked)
                await asyncio.sleep(0.2)
            with pytest.raises(QueryTimedOut, match="longer than"):
                await query
            assert time.monotonic() - started < TIMEOUT_S + 5
            assert slowest < 0.5, f"health took {slowest:.2f} s while the query ran"
            await maintained_meanwhile(manager, sources, spark_store, view)
            # the driver never stopped working on the plan: the process is ended
            await wait_until(
                lambda: small_analysts.restarts > restarts, GRACE_S + 30, "the query process was restarted"
            )
            assert "still ran" in (small_analysts.last_exit or "")
    finally:
        await manager.stop()
