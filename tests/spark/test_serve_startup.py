"""A real ``pvm serve --store spark``: it answers at once, with 503 and ``Retry-After`` until
Spark and the manager have started; and when its Spark JVM dies, readiness says so, health
lists it, and the views' commits go on without it (a commit writes its file itself)."""

from __future__ import annotations

import os
import re
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from queue import Empty, Queue
from typing import Any

import httpx
import pytest

from api.auth import issue_token
from pvm.wrapper_process import start_wrapper
from warehouse.catalog.db import Catalog
from warehouse.store.spark import SparkStore

pytestmark = pytest.mark.spark


def test_the_store_of_a_live_session_is_healthy(spark_store: SparkStore) -> None:
    assert spark_store.health() is None


def lines_of(process: subprocess.Popen[str]) -> Queue[str]:
    """The child's stdout lines, read on a thread (so the pipe never fills)."""
    lines: Queue[str] = Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of the processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append((int(entry.name), stat[stat.index("(") + 1 : stat.rindex(")")]))
    return found


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of every process below ``pid``, from /proc."""
    parents: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            parents.setdefault(ppid, []).append((int(entry.name), name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def wait_for(what: str, probe: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_serve_answers_503_while_spark_starts_and_reports_a_dead_jvm(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    catalog = Catalog(f"sqlite:///{(data / 'catalog.db').resolve()}")
    try:
        admin = {"Authorization": f"Bearer {issue_token(catalog, 'admin')[1]}"}
        wrapper_token = issue_token(catalog, "wrapper", "shop")[1]
    finally:
        catalog.close()
    shop = tmp_path / "shop.db"
    with sqlite3.connect(shop) as db:
        db.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, qty INTEGER)")
        db.executemany("INSERT INTO items VALUES (?, ?)", [(1, 5), (2, 0), (3, 7)])

    log = open(tmp_path / "serve.log", "w")
    serve = subprocess.Popen(
        [sys.executable, "-m", "pvm", "serve", "--data-dir", str(data), "--port", "0", "--connect-port", "-1",
         "--spark-master", "local[1]", "--spark-conf", "spark.sql.shuffle.partitions=1"],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    wrapper = None
    try:
        lines = lines_of(serve)
        try:
            line = lines.get(timeout=60)
        except Empty:
            pytest.fail("pvm serve did not announce its address")
        match = re.search(r"manager listening on (http://\S+)", line)
        assert match, line
        http = httpx.Client(base_url=match.group(1), timeout=60)  # a define on a busy machine took over 10 s

        # at once: Spark needs seconds more to start
        views = http.get("/v1/views", headers=admin)
        assert views.status_code == 503, views.text
        assert views.headers["Retry-After"] == "5" and "starting" in views.json()["detail"]
        assert http.get("/v1/health").json()["starting"] is True
        assert http.get("/v1/ready").status_code == 503

        wait_for("readiness", lambda: http.get("/v1/ready").status_code == 200, 180)
        assert http.get("/v1/views", headers=admin).json() == []
        assert http.get("/v1/health").json() | {"sources": 0} == {
            "ok": True,
            "starting": False,
            "sources": 0,
            "views": 0,
            "problems": [],
        }

        manager_token = secrets.token_urlsafe(32)
        wrapper = start_wrapper(
            "shop", f"sqlite:///{shop}", ["items"], match.group(1), state_dir=tmp_path / "wrapper",
            token=wrapper_token, manager_token=manager_token, log_path=tmp_path / "wrapper.log",
        )  # fmt: skip
        added = http.post("/v1/sources", headers=admin, json={
            "name": "shop", "wrapper_url": wrapper.url, "tables": ["items"], "manager_token": manager_token,
        })  # fmt: skip
        assert added.status_code == 201, added.text
        defined = http.post(
            "/v1/views", headers=admin, json={"sql": "SELECT id, qty FROM shop.items WHERE qty > 0", "name": "stock"}
        )
        assert defined.status_code == 201, defined.text
        loaded = ("active", 1, 2)  # a count may lag W by a few seconds: Spark counts are reused meanwhile
        wait_for(
            "the initial load",
            lambda: (
                tuple(http.get("/v1/views/stock", headers=admin).json()[k] for k in ("state", "watermark", "row_count"))
                == loaded
            ),
            120,
        )

        # two JVMs: the store's, a child of pvm serve, and the analysts' query process's
        assert len([name for _, name in descendants(serve.pid) if name == "java"]) == 2, descendants(serve.pid)
        jvms = [pid for pid, name in children(serve.pid) if name == "java"]
        assert len(jvms) == 1, children(serve.pid)
        os.kill(jvms[0], signal.SIGKILL)  # as an executor's out-of-memory exit takes it down

        not_ready = wait_for("readiness to fail", lambda: (r := http.get("/v1/ready")).status_code == 503 and r, 30)
        assert "the view store does not answer: the Spark JVM does not answer" in not_ready.json()["detail"], (
            not_ready.text
        )
        assert any("Spark JVM does not answer" in p for p in http.get("/v1/health").json()["problems"])

        with sqlite3.connect(shop) as db:
            db.execute("INSERT INTO items VALUES (4, 9)")
        # A commit writes its Parquet file without the JVM (docs/spark.md, "How a commit writes
        # its file"): maintenance goes on while the JVM is gone, and only reads need it.
        view = wait_for(
            "the change to be committed",
            lambda: (v := http.get("/v1/views/stock", headers=admin).json())["watermark"] == 2 and v,
            60,
        )
        assert view["state"] == "active" and view["error"] is None and view["retrying"] is None, view
        assert http.get("/v1/ready").status_code == 503
    finally:
        if wrapper is not None:
            wrapper.stop()
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
        log.close()
