"""Analysts' Spark Connect through the manager's gateway: a real pyspark Connect client (its
own process) reads a view with an analyst token of the service, and everything else an
analyst session could try (files, scripts, writes, DDL, UDFs, store tables, settings, other
tokens' sessions) is refused; tokens of other roles, unknown and revoked tokens get nothing.

One client process opens a session per token it is given, in turn (a process costs its
interpreter and PySpark's import, about a second on a busy machine); the revoked token's
session is a process of its own, after the revocation."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import uuid

import pytest

from api.auth import issue, verifier_for
from api.connect_gateway import ConnectGateway, GatewaySettings
from tests.spark.analyst_support import change, join_sql, settle, sim_manager
from warehouse.catalog.db import Catalog
from warehouse.store.spark import SparkStore

pytestmark = pytest.mark.spark

CLIENT = r"""
import json, re, sys
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

view, sessions = sys.argv[1], json.loads(sys.argv[2])  # [[address, attempts to make, or null: all]]

def attempts_of(spark):
    return {
        "sql": lambda: [list(r) for r in spark.sql(f"SELECT id, b, c FROM {view} ORDER BY id, b, c").collect()],
        "dataframe": lambda: [list(r) for r in spark.table(view).where(F.col("c") > 0).groupBy("c").count().orderBy("c").collect()],
        "select_expr": lambda: spark.table(view).selectExpr("id + 1 AS next").count(),
        "schema": lambda: spark.table(view).schema.simpleString(),
        "read_file": lambda: spark.read.text("/etc/passwd").collect(),
        "read_parquet": lambda: spark.read.parquet("/tmp").collect(),
        "script": lambda: spark.sql(f"SELECT TRANSFORM(id) USING 'cat' FROM {view}").collect(),
        "write": lambda: spark.table(view).write.parquet("/tmp/pvm-connect-write-test"),
        "drop": lambda: spark.sql(f"DROP VIEW {view}").collect(),
        "insert": lambda: spark.sql(f"INSERT INTO pvm_zlog_{view} SELECT 1, 1, 1, 1, 1").collect(),
        "udf": lambda: spark.table(view).select(F.udf(lambda x: x)("id")).collect(),
        "temp_view": lambda: spark.table(view).createOrReplaceTempView("mine"),
        "store_table": lambda: spark.table(f"pvm_zlog_{view}").collect(),
        "setting": lambda: spark.conf.set("spark.sql.shuffle.partitions", "1"),
        "environment": lambda: spark.sql("SELECT current_user()").collect(),
        "reflect": lambda: spark.table(view).select(F.expr("reflect('java.lang.System', 'getenv', 'HOME')")).collect(),
        "cache": lambda: spark.table(view).cache().count(),
    }

def outcome(attempt):
    try:
        return {"ok": attempt()}
    except Exception as exc:
        text = " ".join(str(exc).split())
        code = re.search(r"StatusCode\.([A-Z_]+)", text)
        details = re.search(r'details = "([^"]*)"', text)
        return {"code": code.group(1) if code else type(exc).__name__, "detail": details.group(1) if details else text[:300]}

out = []
for address, names in sessions:
    attempts = attempts_of(SparkSession.builder.remote(address).create())
    out.append({name: outcome(attempts[name]) for name in names or attempts})
print(json.dumps(out))
"""


def clients(url: str, view: str, *sessions: tuple[str | None, str | None, list[str] | None]) -> list[dict]:
    """What each of ``sessions`` (a token, a session id, the attempts to make: None for all)
    got, each a Spark Connect session of its own, opened in turn by one client process."""
    addresses = [
        [url + "/" + "".join(f";{k}={v}" for k, v in (("token", token), ("session_id", session)) if v), attempts]
        for token, session, attempts in sessions
    ]
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, view, json.dumps(addresses)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


async def test_analysts_read_views_through_spark_connect_and_nothing_else(
    analyst_store: SparkStore, analysts, tmp_path, view: str
) -> None:
    pytest.importorskip("grpc", reason="the Spark Connect client needs grpcio (pip install '.[connect]')")
    manager, sources = await sim_manager(tmp_path, analyst_store, seed=7, analysts=analysts)
    verifier = verifier_for(manager)
    gateway = ConnectGateway(GatewaySettings("127.0.0.1", 0), verifier.verify, analysts, lambda: list(manager.views))
    url = gateway.start()
    try:
        await manager.define_view(join_sql(view), name=view, parallelism=2)
        rng = random.Random(7)
        for _ in range(8):
            change(sources[rng.choice(["s1", "s2"])], rng)
            for s in sources.values():
                await s.ship()
        await settle(manager, analyst_store, view)
        expected = sorted(list(r) for r in analyst_store.read_rows(view))
        info, token = await issue(manager, "analyst")
        _, other = await issue(manager, "analyst")
        _, wrapper = await issue(manager, "wrapper", "s1")
        session = str(uuid.uuid4())
        sql = ["sql"]
        seen, again, own, stolen, as_wrapper, *unauthenticated = await asyncio.to_thread(
            clients,
            url,
            view,
            (token, None, None),  # every attempt
            (token, None, sql),  # then the view, as before
            (token, session, sql),  # a session, then another token in it
            (other, session, sql),
            (wrapper, None, sql),  # other roles, missing and unknown tokens
            (None, None, sql),
            ("pvm_1_" + "x" * 40, None, sql),
        )
        assert seen["sql"] == {"ok": expected}
        by_c: dict[int, int] = {}
        for row in expected:
            if row[2] > 0:
                by_c[row[2]] = by_c.get(row[2], 0) + 1
        assert seen["dataframe"] == {"ok": [[c, n] for c, n in sorted(by_c.items())]}
        assert seen["select_expr"] == {"ok": len(expected)}
        assert seen["schema"] == {"ok": "struct<id:bigint,b:bigint,c:bigint>"}
        refused = {name: result for name, result in seen.items() if "ok" not in result}
        assert set(refused) == set(seen) - {"sql", "dataframe", "select_expr", "schema"}, seen
        assert {result["code"] for result in refused.values()} == {"PERMISSION_DENIED"}, refused
        for name, words in {
            "read_file": "reading data sources or files",
            "read_parquet": "reading data sources or files",
            "script": "TRANSFORM",
            "write": "writing",
            "drop": "only a SELECT",
            "insert": "only a SELECT",
            "udf": "user-defined functions",
            "temp_view": "creating views",
            "store_table": "unknown view",
            "setting": "setting spark.sql.shuffle.partitions is not allowed",
            "environment": "CURRENT_USER",
            "reflect": "reflect",
            "cache": "persist",
        }.items():
            assert words in refused[name]["detail"], (name, refused[name])
        assert not (tmp_path / "pvm-connect-write-test").exists()
        # nothing an analyst tried changed the view
        assert again == {"sql": {"ok": expected}}

        # a session stays with the token that opened it
        assert "ok" in own["sql"]
        assert stolen["sql"]["code"] == "PERMISSION_DENIED" and "another token" in stolen["sql"]["detail"]

        # other roles, missing, unknown and revoked tokens
        assert as_wrapper["sql"]["code"] == "PERMISSION_DENIED"
        assert [bad["sql"]["code"] for bad in unauthenticated] == ["UNAUTHENTICATED"] * 2
        verifier.remember(await manager.db(Catalog.revoke_token, info.id))
        [revoked] = await asyncio.to_thread(clients, url, view, (token, None, sql))
        assert revoked["sql"]["code"] == "UNAUTHENTICATED"
    finally:
        gateway.stop()
        await manager.stop()
