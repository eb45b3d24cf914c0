"""Schemathesis against the analysts' operations on the Spark store: generated requests, valid
and invalid, to ``POST /v1/query``, ``GET /v1/views/{name}/rows`` and ``POST
/v1/views/{name}/verify`` of a live manager whose views live in Spark and whose analyst work
runs in the analysts' query process. None may answer 5xx (the in-memory run of every
operation is tests/test_api_schemathesis.py, where these answer 501 or from memory).

A request for the view that exists reaches the store: a page of its rows or a verification
is a Spark job of the query process, about a second on a busy machine. Those requests are
``STORE_EXAMPLES`` per operation and mode (the in-memory run sends these operations 30
each); the others here, refused before any Spark job, are 30 as there."""

from __future__ import annotations

import itertools
import time
from collections import Counter

import httpx
import schemathesis
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.api_support import SCHEMATHESIS_EXAMPLES, LiveManager, exercise
from tests.spark.analyst_support import TABLES, join_sql
from warehouse.store.spark import SparkStore

ANALYST_OPERATIONS = {("POST", "/v1/query"), ("GET", "/v1/views/{name}/rows"), ("POST", "/v1/views/{name}/verify")}
STORE_EXAMPLES = 10


def test_no_analyst_operation_answers_5xx_on_the_spark_store(
    tmp_path, analyst_store: SparkStore, analysts, view
) -> None:
    with LiveManager(tmp_path, TABLES, store=analyst_store, analysts=analysts) as live:
        for name in TABLES:
            r = httpx.post(
                f"{live.url}/v1/sources",
                json={"name": name, "wrapper_url": f"http://{name}.invalid"},
                headers=live.auth("admin"),
            )
            assert r.status_code == 201, r.text
        live.sources["s1"].load("r", [(i, i % 4) for i in range(1, 13)])
        live.sources["s2"].load("s", [(b, 1 + b % 2) for b in range(4)])
        r = httpx.post(
            f"{live.url}/v1/views", json={"sql": join_sql(view), "name": view}, headers=live.auth("admin"), timeout=120
        )
        assert r.status_code == 201, r.text
        deadline = time.monotonic() + 120
        while (
            httpx.get(f"{live.url}/v1/views/{view}", headers=live.auth("admin"), timeout=60).json()["state"] != "active"
        ):
            assert time.monotonic() < deadline, "the view did not become active"
            time.sleep(0.2)

        schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
        operations = [
            op
            for op in (result.ok() for result in schema.get_all_operations())
            if (op.method.upper(), op.path) in ANALYST_OPERATIONS
        ]
        assert len(operations) == len(ANALYST_OPERATIONS)
        failures: list[str] = []
        statuses: Counter[int] = Counter()
        for operation in operations:
            # pinning the view's name changes nothing of an operation without a {name}: its
            # derandomized requests would only be sent twice
            names = (None, view) if "{name}" in operation.path else (None,)
            for mode, pinned in itertools.product((GenerationMode.POSITIVE, GenerationMode.NEGATIVE), names):
                reaches_the_store = pinned is not None
                examples = STORE_EXAMPLES if reaches_the_store else SCHEMATHESIS_EXAMPLES
                try:
                    exercise(operation, mode, live, statuses, {"name": pinned} if pinned else None, examples)
                except Unsatisfiable:
                    pass
                except Exception as exc:  # collect them all, then report
                    failures.append(f"{operation.method.upper()} {operation.path} ({mode.value}): {exc}")
        assert not failures, "\n\n".join(failures)
        print(sorted(statuses.items()))
        assert statuses[200] > 10, statuses  # the store answered, not only refusals
