"""The wrapper as a real process over real HTTP, against a stand-in manager.

The last test is the oracle of the watermark handshake (docs/design.md, invariant 3): while a
writer commits random transactions, every subquery answer with watermark w must equal the
join computed in Python over the initial contents plus the shipped updates 1..w.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contract.expr import Cmp, Col, Expr, Like, Lit, compile_filter, to_wire
from contract.schemas import KEY_RELATION, Update
from contract.zset import ZSet
from pvm.cli import main as pvm_main
from pvm.wrapper_process import WrapperProcess, start_wrapper
from tests.fake_manager import FakeManager
from warehouse.join import extend, local_join
from warehouse.plan import SweepStep
from wrappers.errors import WrapperError

SOURCE = "shop"
TOKEN = "wrapper-secret"
COLUMNS = {"r": ("id", "b", "v"), "s": ("x",)}
INITIAL = [(i, i % 5, random.Random(i).choice(["xa", "Xb", "xc", "y", None])) for i in range(1, 31)]


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "src.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE r (id INTEGER PRIMARY KEY, b INTEGER, v TEXT)")
        conn.execute("CREATE TABLE s (x TEXT)")
        conn.executemany("INSERT INTO r VALUES (?, ?, ?)", INITIAL)
    return path


@pytest.fixture()
def manager() -> Iterator[FakeManager]:
    with FakeManager(token=TOKEN) as m:
        yield m


def start(db: Path, manager: FakeManager, **options: object) -> WrapperProcess:
    return start_wrapper(
        SOURCE,
        f"sqlite:///{db}",
        ["r", "s"],
        manager.url,
        token=TOKEN,
        state_dir=db.parent / "state",
        log_path=db.parent / "wrapper.log",
        **options,  # type: ignore[arg-type]
    )


def execute(db: Path, *statements: str) -> None:
    """One committed transaction."""
    with sqlite3.connect(db, timeout=10) as conn:
        for statement in statements:
            conn.execute(statement)


def flush(url: str) -> int:
    """A subquery without keys: ships everything committed so far; its watermark."""
    response = httpx.post(f"{url}/v1/subquery", json={"relation": "r", "alias": "r", "keys": [], "select": []})
    response.raise_for_status()
    return response.json()["watermark"]


def contents(db: Path, table: str = "r") -> ZSet:
    with sqlite3.connect(db) as conn:
        return ZSet.from_rows(conn.execute(f"SELECT {', '.join(COLUMNS[table])} FROM {table}"))


def replay(initial: ZSet, updates: list[Update], table: str = "r") -> ZSet:
    out = initial.copy()
    for update in updates:
        for change in update.changes:
            if change.relation == table:
                out.add(tuple(change.row[c] for c in COLUMNS[table]), change.sign)
    return out


def outbox_size(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM _pvm_outbox").fetchone()[0]


def wait_for(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_changes_ship_in_order_with_signs_and_leave_the_outbox(db: Path, manager: FakeManager) -> None:
    with start(db, manager) as wrapper:
        execute(db, "INSERT INTO r VALUES (100, 1, 'new')", "INSERT INTO s VALUES ('q')")
        assert flush(wrapper.url) == 1
        with sqlite3.connect(db, isolation_level=None) as conn:  # never committed: never shipped
            conn.execute("BEGIN")
            conn.execute("INSERT INTO r VALUES (200, 2, 'ghost')")
            conn.execute("ROLLBACK")
        execute(db, "UPDATE r SET v = 'newer' WHERE id = 100")
        assert flush(wrapper.url) == 2
        execute(db, "DELETE FROM r WHERE id = 100")
        assert flush(wrapper.url) == 3
        assert flush(wrapper.url) == 3  # nothing new: no new seq

        updates = manager.updates(SOURCE)
        assert [u.seq for u in updates] == [1, 2, 3]
        assert [[(c.relation, c.sign, c.row) for c in u.changes] for u in updates] == [
            [("r", 1, {"id": 100, "b": 1, "v": "new"}), ("s", 1, {"x": "q"})],
            [("r", -1, {"id": 100, "b": 1, "v": "new"}), ("r", 1, {"id": 100, "b": 1, "v": "newer"})],
            [("r", -1, {"id": 100, "b": 1, "v": "newer"})],
        ]
        wait_for(lambda: outbox_size(db) == 0)  # deleted only once acknowledged
        health = httpx.get(f"{wrapper.url}/v1/health").json()
        assert health == {
            "ok": True, "source": SOURCE, "last_seq": 3, "shipped_through": 3, "acked_through": 3, "pending": 0,
            "capture": {"method": "trigger"}, "blocked": None, "shipping_error": None,
            "quarantine": {"rows": 0, "by_relation": {}, "last": None},
            "held": {
                "capturing": 0, "capturing_peak": 2, "shipping": 0, "shipping_peak": 2,
                "part_changes": 100_000, "part_bytes": 8 << 20,
            },
            # SQLite: none stands (wrappers/capture/sqlite.py)
            "standing_snapshot": {"watermark": None, "seconds": 0, "answers": 0, "snapshots": 0},
        }  # fmt: skip
        schema = httpx.get(f"{wrapper.url}/v1/schema").json()
        assert schema["tables"]["r"] == {
            "columns": [
                {"name": "id", "type": "INTEGER"},
                {"name": "b", "type": "INTEGER"},
                {"name": "v", "type": "TEXT"},
            ],
            "primary_key": ["id"],
        }
    assert manager.conflicts == []


def test_manager_failures_are_retried_without_loss_or_duplicates(db: Path, manager: FakeManager) -> None:
    manager.fail_posts = 4
    with start(db, manager) as wrapper:
        for i in range(5):
            execute(db, f"INSERT INTO r VALUES ({100 + i}, {i}, 'n')", f"DELETE FROM r WHERE id = {i + 1}")
            time.sleep(0.06)
        last = flush(wrapper.url)
    updates = manager.updates(SOURCE)
    assert [u.seq for u in updates] == list(range(1, last + 1))
    assert len(manager.posts) > last and manager.fail_posts == 0
    assert manager.conflicts == []
    assert replay(ZSet.from_rows(INITIAL), updates) == contents(db)


def test_restart_resends_pending_updates_with_their_seqs(db: Path, manager: FakeManager) -> None:
    manager.down = True
    wrapper = start(db, manager)
    execute(db, "INSERT INTO r VALUES (100, 1, 'before crash')")
    wait_for(lambda: len(manager.posts) >= 2)  # captured as seq 1, refused twice
    execute(db, "INSERT INTO r VALUES (101, 1, 'in the outbox at the crash')")
    wrapper.kill()  # a crash: nothing was acknowledged
    sent_before = {u.seq: u for batch in manager.posts for u in batch.updates}
    assert list(sent_before) == [1] and outbox_size(db) == 2
    execute(db, "DELETE FROM r WHERE id = 100")
    manager.down = False

    with start(db, manager) as wrapper:
        assert flush(wrapper.url) == 2
    updates = manager.updates(SOURCE)
    assert updates[0] == sent_before[1]  # resent with the same seq and payload
    assert [(c.sign, c.row["id"]) for c in updates[1].changes] == [(1, 101), (-1, 100)]
    assert manager.conflicts == []
    assert replay(ZSet.from_rows(INITIAL), updates) == contents(db)


def test_interest_filters_projects_and_sets_a_boundary(db: Path, manager: FakeManager) -> None:
    interest = {
        "relations": {
            "r": {
                "columns": ["id", "v"],
                "where": [to_wire(Like(Col("r", "v"), "x%")), to_wire(Cmp(">", Col("r", "b"), Lit(50)))],
            }
        }
    }
    with start(db, manager) as wrapper:
        execute(db, "INSERT INTO r VALUES (100, 1, 'old interest')")
        boundary = httpx.put(f"{wrapper.url}/v1/interest", json=interest).json()["boundary"]
        assert boundary == flush(wrapper.url) == 1  # captured before the switch, with the old interest
        execute(db, "INSERT INTO r VALUES (101, 1, 'x1'), (102, 1, 'y'), (103, 99, 'y')", "INSERT INTO s VALUES ('q')")
        assert flush(wrapper.url) == 2
        execute(db, "UPDATE r SET b = 7 WHERE id = 101")  # the shipped projection does not change
        assert flush(wrapper.url) == 2
        execute(db, "UPDATE r SET v = 'z' WHERE id = 101")  # leaves the filter
        assert flush(wrapper.url) == 3
        bad = httpx.put(f"{wrapper.url}/v1/interest", json={"relations": {"r": {"columns": ["nope"], "where": [None]}}})
        assert bad.status_code == 400 and "nope" in bad.json()["detail"]
    with start(db, manager) as wrapper:  # the interest is durable
        execute(db, "INSERT INTO r VALUES (104, 1, 'x2')")
        flush(wrapper.url)

    changes = [(u.seq, c.sign, c.row) for u in manager.updates(SOURCE) for c in u.changes]
    assert changes == [
        (1, 1, {"id": 100, "b": 1, "v": "old interest"}),
        (2, 1, {"id": 101, "v": "x1"}),
        (2, 1, {"id": 103, "v": "y"}),
        (3, -1, {"id": 101, "v": "x1"}),
        (4, 1, {"id": 104, "v": "x2"}),
    ]


def _join(keys: list[list], on: Expr, where: Expr | None, select: list[str], rows: ZSet) -> ZSet:
    """The subquery computed in Python: local_join of the keys with the relation's rows."""
    layout = tuple(Col(KEY_RELATION, f"k{j}") for j in range(len(keys[0])))
    rel_cols = tuple(Col("r", c) for c in COLUMNS["r"])
    relation = rows.filter(compile_filter(where, {c: i for i, c in enumerate(rel_cols)}))
    picked = [len(layout) + COLUMNS["r"].index(c) for c in select]
    joined = local_join(ZSet.from_rows(map(tuple, keys)), SweepStep(0, layout, layout, on), relation, rel_cols)
    return joined.map_rows(lambda row: row[: len(layout)] + tuple(row[i] for i in picked))


def _answered(keys: list[list], on: Expr, select: list[str], rows: list[list]) -> ZSet:
    layout = tuple(Col(KEY_RELATION, f"k{j}") for j in range(len(keys[0])))
    step = SweepStep(0, layout, layout, on)
    return extend(
        ZSet.from_rows(map(tuple, keys)), step, [tuple(k) for k in keys], [(r[0], tuple(r[1:-1]), r[-1]) for r in rows]
    )


ON = Cmp("=", Col(KEY_RELATION, "k0"), Col("r", "b"))


def _subquery(keys: list[list], where: Expr | None, select: list[str]) -> dict:
    return {
        "relation": "r", "alias": "r", "keys": keys, "on": to_wire(ON),
        "where": to_wire(where) if where is not None else None, "select": select,
    }  # fmt: skip


def test_subquery_answers_and_bad_requests(db: Path, manager: FakeManager) -> None:
    with start(db, manager) as wrapper:
        keys, where = [[0], [1], [4], [None]], Like(Col("r", "v"), "x%")
        answer = httpx.post(f"{wrapper.url}/v1/subquery", json=_subquery(keys, where, ["id", "v"])).json()
        assert answer["watermark"] == 0 and answer["elapsed_ms"] > 0
        assert answer["rows"] and _answered(keys, ON, ["id", "v"], answer["rows"]) == _join(
            keys, ON, where, ["id", "v"], ZSet.from_rows(INITIAL)
        )
        bad = httpx.post(
            f"{wrapper.url}/v1/subquery", json=_subquery(keys, Cmp("=", Col("r", "color"), Lit(1)), ["id"])
        )
        assert bad.status_code == 400 and bad.json() == {"detail": "relation 'r' has no column 'color'"}
        bad = httpx.post(f"{wrapper.url}/v1/subquery", json={**_subquery(keys, None, ["id"]), "relation": "orders"})
        assert bad.status_code == 400 and "unknown relation 'orders'" in bad.json()["detail"]
        malformed = httpx.post(f"{wrapper.url}/v1/subquery", json={"relation": "r"})
        assert malformed.status_code == 422 and isinstance(malformed.json()["detail"], str)


@pytest.mark.parametrize("q", [1, 2], ids=["shared_handshakes", "own_snapshots"])
def test_watermark_handshake_under_concurrent_writes(db: Path, manager: FakeManager, q: int) -> None:
    """Every answer equals the join over the initial contents plus exactly updates 1..watermark,
    whether subqueries waiting together share a handshake and its snapshot (q = 1) or each
    takes its own (q = 2)."""
    stop = threading.Event()
    committed = []

    def writer() -> None:
        rng = random.Random(7)
        conn = sqlite3.connect(db, timeout=10, isolation_level=None)
        next_id = 1000
        while not stop.is_set():
            conn.execute("BEGIN IMMEDIATE")
            for _ in range(rng.randint(1, 3)):
                op = rng.random()
                if op < 0.45:
                    value = rng.choice(["xa", "Xb", "xc", "y", None])
                    conn.execute("INSERT INTO r VALUES (?, ?, ?)", (next_id, rng.randint(0, 5), value))
                    next_id += 1
                elif op < 0.8:
                    conn.execute("DELETE FROM r WHERE id = (SELECT id FROM r ORDER BY random() LIMIT 1)")
                else:
                    conn.execute(
                        "UPDATE r SET b = ? WHERE id = (SELECT id FROM r ORDER BY random() LIMIT 1)",
                        (rng.randint(0, 5),),
                    )
            rolled_back = rng.random() < 0.1
            conn.execute("ROLLBACK" if rolled_back else "COMMIT")
            committed.append(not rolled_back)
            time.sleep(rng.random() * 0.004)
        conn.close()

    answers: list[tuple[list[list], Expr | None, dict]] = []
    refused: list[str] = []

    def querier(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=wrapper.url, timeout=30) as client:
            while not stop.is_set():
                keys = [[k] for k in rng.sample(range(6), rng.randint(1, 4))]
                where = rng.choice([None, Like(Col("r", "v"), "x%")])
                response = client.post("/v1/subquery", json=_subquery(keys, where, ["id", "v"]))
                if response.status_code != 200:
                    refused.append(f"{response.status_code}: {response.text}")
                    continue
                answers.append((keys, where, response.json()))

    with start(db, manager, poll_interval=0.02, query_delay_ms=10, max_concurrent_queries=q) as wrapper:
        threads = [threading.Thread(target=writer)] + [threading.Thread(target=querier, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        time.sleep(3.0)
        stop.set()
        for t in threads:
            t.join()
        last = flush(wrapper.url)

    assert not refused, refused[:3]
    updates = manager.updates(SOURCE)
    assert [u.seq for u in updates] == list(range(1, last + 1))
    assert replay(ZSet.from_rows(INITIAL), updates) == contents(db)
    watermarks = sorted({a["watermark"] for _, _, a in answers})
    assert sum(committed) > 100 and len(answers) > 50 and len(watermarks) > 10, (
        sum(committed),
        len(answers),
        len(watermarks),
    )
    states = {0: ZSet.from_rows(INITIAL)}
    for w in range(1, last + 1):
        states[w] = replay(states[w - 1], [updates[w - 1]])
    for keys, where, answer in answers:
        expected = _join(keys, ON, where, ["id", "v"], states[answer["watermark"]])
        assert _answered(keys, ON, ["id", "v"], answer["rows"]) == expected, answer["watermark"]


def test_command_line_errors_and_install(db: Path, manager: FakeManager, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{db}"
    assert pvm_main(["wrapper", "install", "--url", url, "--tables", "r,nope"]) == 2
    assert "no such table in" in capsys.readouterr().err
    assert pvm_main(["wrapper", "install", "--url", "oracle://h/db", "--tables", "r"]) == 2
    assert "not implemented for oracle" in capsys.readouterr().err
    assert pvm_main(["wrapper", "install", "--url", url, "--tables", "r,s"]) == 0
    assert pvm_main(["wrapper", "uninstall", "--url", url, "--tables", "r,s"]) == 0
    assert outbox_table_count(db) == 0
    with pytest.raises(WrapperError, match="exit status 2.*no such table in .*: nope"):
        start_wrapper(SOURCE, url, ["nope"], manager.url, state_dir=db.parent / "state", log_path=db.parent / "bad.log")


def outbox_table_count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE '_pvm%'").fetchone()[0]


def test_a_busy_source_answers_the_oldest_unit_first(db: Path, manager: FakeManager) -> None:
    """With q = 1 and subqueries waiting, the smallest priority (the oldest unit) goes next."""
    finished: list[float] = []

    def ask(client: httpx.Client, priority: float) -> None:
        body = {**_subquery([[1]], None, ["id"]), "priority": priority}
        assert client.post("/v1/subquery", json=body, timeout=30).status_code == 200
        finished.append(priority)

    with (
        start(db, manager, query_delay_ms=300, max_concurrent_queries=1) as wrapper,
        httpx.Client(base_url=wrapper.url) as client,
    ):
        threads = []
        for priority in (5.0, 9.0, 1.0):  # the first holds the source; then a young and an old unit wait
            threads.append(threading.Thread(target=ask, args=(client, priority)))
            threads[-1].start()
            time.sleep(0.1)
        for t in threads:
            t.join(30)
    assert finished == [5.0, 1.0, 9.0]
