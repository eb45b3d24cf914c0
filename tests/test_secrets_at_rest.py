"""Secrets and data at rest: ``pvm serve`` and ``pvm wrapper run`` make their files the
service user's alone (umask 077, explicit modes, older files tightened with a log line);
the first admin token goes to a 0600 file, never to the log; the catalog keeps the manager
tokens sealed with a key file (SQLite and PostgreSQL), and older catalogs holding them in
clear text are sealed on upgrade."""

from __future__ import annotations

import os
import re
import select
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

import migrations
from pvm.wrapper_process import start_wrapper
from tests.api_support import LiveManager
from tests.fake_manager import FakeManager
from warehouse.catalog.db import Catalog, RelationInfo
from warehouse.catalog.secrets import KEY_FILE, SealError, TokenSealer

MANAGER_TOKEN = "the-manager-token-of-shop-0123456789"
TOKEN_PATTERN = re.compile(r"pvm_\d+_")


def mode(path: Path) -> str:
    return oct(stat.S_IMODE(path.lstat().st_mode))


def process_umask(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return re.search(r"^Umask:\s*(\d+)", status, re.M).group(1)


def read_line(process: subprocess.Popen, timeout: float = 60.0) -> str:
    """The process's next stdout line, or fail after ``timeout``."""
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    assert ready, "no line in time"
    return process.stdout.readline()


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """What an earlier version left had the modes of a umask of 022."""
    old = os.umask(0o022)
    yield
    os.umask(old)


# -- pvm serve ---------------------------------------------------------------------------------


def earlier_data_dir(data_dir: Path) -> None:
    """A data directory as an earlier version left it: 0755, catalog and store files 0644."""
    data_dir.mkdir(mode=0o755)
    os.chmod(data_dir, 0o755)
    migrations.upgrade(f"sqlite:///{data_dir / 'catalog.db'}")
    part = data_dir / "spark" / "views" / "v" / "base" / "v0" / "part-00000.parquet"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"PAR1")
    for path in (data_dir / "catalog.db", part):
        os.chmod(path, 0o644)


def test_serve_makes_its_files_private_and_keeps_the_admin_token_out_of_its_log(tmp_path: Path, loose_umask) -> None:
    data_dir = tmp_path / "data"
    earlier_data_dir(data_dir)
    serve = subprocess.Popen(
        [sys.executable, "-m", "pvm", "serve", "--data-dir", str(data_dir), "--store", "memory", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = read_line(serve).split()[-1]
        assert process_umask(serve.pid) == "0077"
        token_file = data_dir / "admin-token"
        token = token_file.read_text().strip()
        assert mode(token_file) == "0o600"
        deadline = time.monotonic() + 60
        while (
            answer := httpx.get(f"{url}/v1/tokens", headers={"Authorization": f"Bearer {token}"})
        ).status_code == 503:
            assert time.monotonic() < deadline, answer.text  # the API answers while the manager starts
            time.sleep(0.2)
        assert answer.status_code == 200, answer.text
    finally:
        serve.terminate()
        _, err = serve.communicate(timeout=30)
    assert token not in err and not TOKEN_PATTERN.search(err), err
    assert str(token_file) in err  # where it is, instead
    assert "changed the modes of" in err
    frozen = re.search(r"manager started in [0-9.]+ s \(([0-9]+) long-lived objects frozen\)", err)
    assert frozen is not None and int(frozen.group(1)) > 10_000, err  # out of every full collection (pvm/heap.py)
    assert mode(data_dir) == "0o700"
    assert {mode(p) for p in data_dir.glob("catalog.db*")} == {"0o600"}
    store = [data_dir / "spark", *(data_dir / "spark").rglob("*")]
    assert {mode(p) for p in store if p.is_dir()} == {"0o700"}
    assert {mode(p) for p in store if p.is_file()} == {"0o600"}


# -- pvm wrapper run ---------------------------------------------------------------------------


def test_wrapper_state_outbox_and_replica_files_are_private(tmp_path: Path, loose_umask) -> None:
    db = tmp_path / "legacy.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, modified INTEGER)")
        conn.execute("INSERT INTO items VALUES (1, 'bolt', 1)")
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o755)
    os.chmod(state_dir, 0o755)
    (state_dir / "legacy.lock").touch(mode=0o644)  # left by an earlier version
    with FakeManager() as manager:
        wrapper = start_wrapper(
            "legacy", f"sqlite:///{db}", ["items"], manager.url, state_dir=state_dir, log_path=tmp_path / "wrapper.log",
            capture_args=["--capture", "timestamp", "--timestamp-column", "modified", "--settle-seconds", "0"],
        )  # fmt: skip
        try:
            assert process_umask(wrapper.process.pid) == "0077"
            with sqlite3.connect(db) as conn:
                conn.execute("UPDATE items SET name = 'nut', modified = 2 WHERE id = 1")
            manager.wait_through("legacy", 1)  # shipped: the replica and the state were written
            files = {p.name: mode(p) for p in state_dir.iterdir()}
        finally:
            wrapper.stop()
    assert {"legacy.state.sqlite3", "legacy.lock", "legacy.replica.sqlite3"} <= set(files), files
    assert set(files.values()) == {"0o600"}, files
    assert mode(state_dir) == "0o700"
    assert "changed the modes of" in (tmp_path / "wrapper.log").read_text()


# -- the catalog -------------------------------------------------------------------------------


def test_an_sqlite_catalog_is_private_and_an_older_one_is_tightened(tmp_path: Path, loose_umask, caplog) -> None:
    fresh = Catalog(f"sqlite:///{tmp_path / 'fresh.db'}")
    fresh.add_token("admin", None, "x", "hash")  # writes: the WAL files exist now
    assert {p.name: mode(p) for p in tmp_path.glob("fresh.db*")} == dict.fromkeys(
        ("fresh.db", "fresh.db-wal", "fresh.db-shm"), "0o600"
    )
    fresh.close()
    older = tmp_path / "older.db"
    migrations.upgrade(f"sqlite:///{older}")
    os.chmod(older, 0o644)
    Catalog(f"sqlite:///{older}").close()
    assert mode(older) == "0o600"
    assert any("changed the modes of" in r.getMessage() and str(older) in r.getMessage() for r in caplog.records)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.servers)])
def catalog_url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'catalog.db'}"
    return request.getfixturevalue("postgresql_catalog")


def raw_sources(url: str) -> list[dict]:
    """The sources table as the database holds it, every column."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(sa.text("SELECT * FROM sources"))]
    finally:
        engine.dispose()


def test_the_catalog_never_holds_a_manager_token_in_clear(catalog_url: str, tmp_path: Path) -> None:
    key_file = tmp_path / "keys" / KEY_FILE
    catalog = Catalog(catalog_url, key_file)
    try:
        catalog.add_source(
            "shop",
            "http://127.0.0.1:8101",
            "trigger",
            [RelationInfo("shop", "r", ("k",), ("INTEGER",), ("k",))],
            MANAGER_TOKEN,
        )
        assert catalog.sources()["shop"].manager_token == MANAGER_TOKEN
    finally:
        catalog.close()
    (row,) = raw_sources(catalog_url)
    assert MANAGER_TOKEN not in repr(row) and row["sealed_manager_token"]
    if catalog_url.startswith("sqlite"):  # nowhere in the files either (the WAL included)
        assert all(MANAGER_TOKEN.encode() not in p.read_bytes() for p in tmp_path.glob("catalog.db*"))
    assert mode(key_file) == "0o600"
    with pytest.raises(SealError, match="does not open with the key"):  # another key file: refused, named
        Catalog(catalog_url, tmp_path / "other.key").sources()


def test_an_older_catalog_with_clear_tokens_is_sealed_on_upgrade_and_still_read(
    catalog_url: str, tmp_path: Path
) -> None:
    migrations.upgrade(catalog_url, "0002")
    engine = sa.create_engine(catalog_url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO sources (name, wrapper_url, capture, created_at, manager_token) VALUES (:n, :u, 'trigger', 1.0, :t)"
            ),
            [
                {"n": "shop", "u": "http://127.0.0.1:8101", "t": MANAGER_TOKEN},
                {"n": "crm", "u": "http://127.0.0.1:8102", "t": None},
            ],
        )
    engine.dispose()
    key_file = tmp_path / KEY_FILE
    catalog = Catalog(catalog_url, key_file)
    try:
        sources = catalog.sources()
    finally:
        catalog.close()
    assert sources["shop"].manager_token == MANAGER_TOKEN and sources["crm"].manager_token is None
    rows = {r["name"]: r for r in raw_sources(catalog_url)}
    assert "manager_token" not in rows["shop"] and MANAGER_TOKEN not in repr(rows)
    assert TokenSealer(key_file).unseal(rows["shop"]["sealed_manager_token"]) == MANAGER_TOKEN


@pytest.mark.servers
def test_an_older_server_catalog_is_not_upgraded_without_its_key(postgresql_catalog: str) -> None:
    migrations.upgrade(postgresql_catalog, "0002")
    engine = sa.create_engine(postgresql_catalog)
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO sources (name, wrapper_url, capture, created_at, manager_token) "
            f"VALUES ('shop', 'http://127.0.0.1:8101', 'trigger', 1.0, '{MANAGER_TOKEN}')"
        ))  # fmt: skip
    with pytest.raises(SealError, match=r"manager tokens of source\(s\) shop.*--data-dir"):
        Catalog(postgresql_catalog)  # no key file: pvm token … --catalog URL without --data-dir
    with engine.connect() as conn:  # left as it was
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == "0002"
        assert conn.execute(sa.text("SELECT manager_token FROM sources")).scalar_one() == MANAGER_TOKEN
    engine.dispose()


async def test_a_source_registered_through_the_api_is_sealed_and_unsealed_after_a_restart(tmp_path: Path) -> None:
    from warehouse.manager import Manager
    from warehouse.store.memory import MemoryStore

    live = LiveManager(tmp_path)
    with live:
        async with httpx.AsyncClient(base_url=live.url, headers=live.auth("admin")) as http:
            body = {"name": "shop", "wrapper_url": "http://127.0.0.1:8101", "manager_token": MANAGER_TOKEN}
            assert (await http.post("/v1/sources", json=body)).status_code == 201
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    assert MANAGER_TOKEN not in repr(raw_sources(url))
    restarted = Manager(url, MemoryStore(), connect=live._connect)
    await restarted.start()
    try:
        assert restarted.manager_tokens == {"shop": MANAGER_TOKEN}
    finally:
        await restarted.stop()


def test_the_key_is_made_once_even_by_processes_racing_for_it(tmp_path: Path) -> None:
    key_file = tmp_path / KEY_FILE
    script = (
        "import sys; from pathlib import Path; from warehouse.catalog.secrets import TokenSealer;"
        "print(TokenSealer(Path(sys.argv[1])).seal('t'))"
    )
    racers = [
        subprocess.Popen([sys.executable, "-c", script, str(key_file)], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    sealed = [r.communicate(timeout=60)[0].strip() for r in racers]
    assert all(TokenSealer(key_file).unseal(s) == "t" for s in sealed)
    assert [p.name for p in tmp_path.iterdir()] == [KEY_FILE] and mode(key_file) == "0o600"  # no temporary files left
