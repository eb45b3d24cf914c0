"""A small CH-benCHmark-style OLTP side for ``pvm bench workload``: TPC-C's New-Order,
Payment and Delivery transactions over warehouse, district, customer, orders, new_order,
order_line, stock and item, split across three databases as three independent shops would
hold them:

* ``pg`` (PostgreSQL): warehouse, district, customer: who buys and pays;
* ``my`` (MariaDB): orders, new_order, order_line: what was ordered and delivered;
* ``lite`` (SQLite): item, stock: what the stores hold.

A TPC-C transaction that touches two or three of them commits once per database (a
New-Order: the district's next order id, the order and its lines, the stock), so it is two
or three *source transactions*; freshness is measured per source transaction. Every row a
transaction writes gets the transaction's number in its ``tx`` column, which no view outputs:
the benchmark traces each update in the manager's log back to its commit time through it
(``VIEWS`` says how it gets there).

Simplifications, so that three small databases on one machine take thousands a second:
money is integer cents; customers are chosen by id (no last-name lookup) and pay their own
district; a Delivery delivers the oldest undelivered order of every district of one
warehouse, as TPC-C's does, in one transaction per database. Each writer process owns
whole warehouses (``owned``), so writers never wait for each other's district rows; 1% of
order lines are supplied by another warehouse, as in TPC-C.

>>> owned(warehouses=5, writer=1, writers=2)
[2, 4]
>>> [pick_transaction(x) for x in (0.1, 0.6, 0.97)]
['new_order', 'payment', 'delivery']
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from array import array
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

DISTRICTS = 10
"""Districts per warehouse (TPC-C's)."""

TABLES: dict[str, dict[str, str]] = {
    "pg": {
        "warehouse": "w_id INTEGER PRIMARY KEY, w_name VARCHAR(10), w_ytd BIGINT, tx BIGINT",
        "district": "d_w_id INTEGER, d_id INTEGER, d_name VARCHAR(10), d_ytd BIGINT, d_next_o_id INTEGER, tx BIGINT, "
        "PRIMARY KEY (d_w_id, d_id)",
        "customer": "c_w_id INTEGER, c_d_id INTEGER, c_id INTEGER, c_last VARCHAR(16), c_balance BIGINT, "
        "c_ytd_payment BIGINT, c_payment_cnt INTEGER, c_delivery_cnt INTEGER, tx BIGINT, "
        "PRIMARY KEY (c_w_id, c_d_id, c_id)",
    },
    "my": {
        "orders": "o_w_id INTEGER, o_d_id INTEGER, o_id INTEGER, o_c_id INTEGER, o_carrier_id INTEGER, "
        "o_ol_cnt INTEGER, tx BIGINT, PRIMARY KEY (o_w_id, o_d_id, o_id)",
        "new_order": "no_w_id INTEGER, no_d_id INTEGER, no_o_id INTEGER, tx BIGINT, PRIMARY KEY (no_w_id, no_d_id, no_o_id)",
        "order_line": "ol_w_id INTEGER, ol_d_id INTEGER, ol_o_id INTEGER, ol_number INTEGER, ol_i_id INTEGER, "
        "ol_supply_w_id INTEGER, ol_quantity INTEGER, ol_amount BIGINT, ol_delivery_d BIGINT, tx BIGINT, "
        "PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number)",
    },
    "lite": {
        "item": "i_id INTEGER PRIMARY KEY, i_name VARCHAR(24), i_price INTEGER, tx BIGINT",
        "stock": "s_w_id INTEGER, s_i_id INTEGER, s_quantity INTEGER, s_ytd INTEGER, s_order_cnt INTEGER, tx BIGINT, "
        "PRIMARY KEY (s_w_id, s_i_id)",
    },
}

INDEXES = {"my": ["CREATE INDEX orders_customer ON orders (o_w_id, o_d_id, o_c_id)"]}
"""TPC-C's secondary index of orders by customer: a customer's change joins through it."""

VIEWS = {
    # undelivered orders and who placed them: MariaDB and PostgreSQL
    "new_order_customers": "CREATE VIEW new_order_customers AS SELECT o.o_w_id, o.o_d_id, o.o_id, o.o_ol_cnt, "
    "c.c_last, c.c_balance FROM my.new_order n, my.orders o, pg.customer c "
    "WHERE n.no_w_id = o.o_w_id AND n.no_d_id = o.o_d_id AND n.no_o_id = o.o_id "
    "AND o.o_w_id = c.c_w_id AND o.o_d_id = c.c_d_id AND o.o_c_id = c.c_id AND n.tx >= 0 AND c.tx >= 0",
    # every order line with its item and district: all three
    "order_line_items": "CREATE VIEW order_line_items AS SELECT ol.ol_w_id, ol.ol_d_id, ol.ol_o_id, ol.ol_number, "
    "ol.ol_quantity, ol.ol_delivery_d, i.i_name, d.d_name FROM my.order_line ol, lite.item i, pg.district d "
    "WHERE ol.ol_i_id = i.i_id AND ol.ol_w_id = d.d_w_id AND ol.ol_d_id = d.d_id AND ol.tx >= 0",
    # stock levels by item and warehouse: SQLite and PostgreSQL
    "stock_items": "CREATE VIEW stock_items AS SELECT s.s_w_id, s.s_i_id, s.s_quantity, i.i_name, i.i_price, "
    "w.w_name FROM lite.stock s, lite.item i, pg.warehouse w WHERE s.s_i_id = i.i_id AND s.s_w_id = w.w_id "
    "AND s.tx >= 0",
}
"""The views. ``tx >= 0`` holds for every row: it makes the wrappers ship the ``tx`` column
(a view's local predicates' columns are shipped) of the relations whose every change the
view sees anyway, so that each update in the manager's log names its source transaction.
District, warehouse and item changes stay out of the views' work: the columns the views
read of them never change, so their deltas cancel in the wrapper's projection."""

MIX = (("new_order", 0.49), ("payment", 0.47), ("delivery", 0.04))
"""TPC-C's 45 : 43 : 4 of these three, as shares of one."""


@dataclass(frozen=True)
class Size:
    warehouses: int
    customers: int  # per district
    items: int


def owned(warehouses: int, writer: int, writers: int) -> list[int]:
    """The warehouses writer ``writer`` (0-based) of ``writers`` writes to."""
    return [w for w in range(1, warehouses + 1) if (w - 1) % writers == writer]


def pick_transaction(x: float) -> str:
    """The transaction of the mix at ``x`` in [0, 1)."""
    for name, share in MIX:
        if x < share:
            return name
        x -= share
    return MIX[-1][0]


# -- creating and populating ------------------------------------------------------------------
def create(urls: dict[str, str], size: Size, seed: int) -> None:
    """The eight tables, each in its database, with TPC-C's initial population scaled down:
    ``customers`` per district, as many orders (the newest 30% undelivered, in new_order),
    5-15 lines each, ``items`` items and a stock row per item and warehouse."""
    rng = random.Random(seed)
    rows: dict[str, list[tuple]] = {t: [] for tables in TABLES.values() for t in tables}
    prices = [rng.randint(100, 10_000) for _ in range(size.items)]
    for i in range(1, size.items + 1):
        rows["item"].append((i, f"item-{i}", prices[i - 1], 0))
    for w in range(1, size.warehouses + 1):
        rows["warehouse"].append((w, f"w{w}", 0, 0))
        for i in range(1, size.items + 1):
            rows["stock"].append((w, i, rng.randint(10, 100), 0, 0, 0))
        for d in range(1, DISTRICTS + 1):
            rows["district"].append((w, d, f"d{w}-{d}", 0, size.customers + 1, 0))
            for c in range(1, size.customers + 1):
                rows["customer"].append((w, d, c, f"last{rng.randrange(1000)}", -1000, 1000, 1, 0, 0))
            for o, c in enumerate(rng.sample(range(1, size.customers + 1), size.customers), start=1):
                delivered = o <= size.customers * 7 // 10
                lines = rng.randint(5, 15)
                rows["orders"].append((w, d, o, c, rng.randint(1, 10) if delivered else None, lines, 0))
                if not delivered:
                    rows["new_order"].append((w, d, o, 0))
                for n in range(1, lines + 1):
                    item = rng.randint(1, size.items)
                    amount = 0 if delivered else prices[item - 1] * 5
                    rows["order_line"].append((w, d, o, n, item, w, 5, amount, 1 if delivered else None, 0))
    for source, tables in TABLES.items():
        engine = sa.create_engine(urls[source])
        with engine.begin() as conn:
            for table, columns in tables.items():
                conn.exec_driver_sql(f"CREATE TABLE {table} ({columns})")
                if rows[table]:
                    marks = ", ".join(f":p{k}" for k in range(len(rows[table][0])))
                    conn.execute(
                        sa.text(f"INSERT INTO {table} VALUES ({marks})"),
                        [{f"p{k}": v for k, v in enumerate(r)} for r in rows[table]],
                    )
            for ddl in INDEXES.get(source, []):
                conn.exec_driver_sql(ddl)
        engine.dispose()


# -- the writer process ---------------------------------------------------------------------------
@dataclass
class District:
    next_o_id: int
    undelivered: deque[tuple[int, int, int]] = field(default_factory=deque)  # (o_id, customer, amount)


class Writer:
    """One writer process's connections and what it knows of its warehouses."""

    def __init__(self, urls: dict[str, str], size: Size, writer: int, writers: int, seed: int) -> None:
        self.size = size
        self.writer, self.writers = writer, writers
        self.rng = random.Random(f"{seed}-{writer}")
        self.engines = {
            s: sa.create_engine(u, connect_args={"timeout": 30} if s == "lite" else {}) for s, u in urls.items()
        }
        self.connections = {s: e.raw_connection() for s, e in self.engines.items()}
        self.paramstyle = {s: "?" if s == "lite" else "%s" for s in urls}
        self.warehouses = owned(size.warehouses, writer, writers)
        self.counter = 0
        self.committed: list[tuple[int, float]] = []  # (tx, commit time) since the last ``take_commits``
        self.prices: dict[int, int] = {}
        self.districts: dict[tuple[int, int], District] = {}
        self._load()

    def _load(self) -> None:
        """The next order id and undelivered orders of every owned district, and the prices."""
        self.prices = dict(self._query("lite", "SELECT i_id, i_price FROM item"))
        for w in self.warehouses:
            for d, next_o in self._query("pg", "SELECT d_id, d_next_o_id FROM district WHERE d_w_id = %s", (w,)):
                self.districts[(w, d)] = District(next_o)
            orders = self._query(
                "my",
                "SELECT o.o_d_id, o.o_id, o.o_c_id, SUM(l.ol_amount) FROM new_order n, orders o, order_line l "
                "WHERE n.no_w_id = %s AND o.o_w_id = n.no_w_id AND o.o_d_id = n.no_d_id AND o.o_id = n.no_o_id "
                "AND l.ol_w_id = o.o_w_id AND l.ol_d_id = o.o_d_id AND l.ol_o_id = o.o_id "
                "GROUP BY o.o_d_id, o.o_id, o.o_c_id ORDER BY o.o_d_id, o.o_id",
                (w,),
            )
            for d, o, c, amount in orders:
                self.districts[(w, d)].undelivered.append((o, c, int(amount)))

    def _sql(self, source: str, statement: str) -> str:
        return statement.replace("%s", self.paramstyle[source])

    def _query(self, source: str, statement: str, params: tuple = ()) -> list[tuple]:
        cursor = self.connections[source].cursor()
        cursor.execute(self._sql(source, statement), params)
        rows = list(cursor.fetchall())
        cursor.close()
        self.connections[source].commit()
        return rows

    @contextmanager
    def transaction(self, source: str) -> Iterator[tuple[Any, int]]:
        """A cursor and the transaction number of one source transaction; its commit time is
        recorded for ``take_commits``."""
        tx = self.counter * self.writers + self.writer + 1
        self.counter += 1
        connection = self.connections[source]
        cursor = connection.cursor()
        try:
            yield cursor, tx
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
        finally:
            cursor.close()
        self.committed.append((tx, time.time()))

    def execute(self, cursor: Any, source: str, statement: str, params: tuple) -> None:
        cursor.execute(self._sql(source, statement), params)

    def run_one(self, kind: str) -> None:
        getattr(self, kind)(self.rng.choice(self.warehouses))

    def new_order(self, w: int) -> None:
        d = self.rng.randint(1, DISTRICTS)
        district = self.districts[(w, d)]
        o, c = district.next_o_id, self.rng.randint(1, self.size.customers)
        district.next_o_id += 1
        lines = []
        for n in range(1, self.rng.randint(5, 15) + 1):
            item = self.rng.randint(1, self.size.items)
            supply = self.rng.randint(1, self.size.warehouses) if self.rng.random() < 0.01 else w
            quantity = self.rng.randint(1, 10)
            lines.append((n, item, supply, quantity, quantity * self.prices[item]))
        with self.transaction("pg") as (cur, tx):
            self.execute(
                cur,
                "pg",
                "UPDATE district SET d_next_o_id = %s, tx = %s WHERE d_w_id = %s AND d_id = %s",
                (o + 1, tx, w, d),
            )
        with self.transaction("my") as (cur, tx):
            self.execute(
                cur, "my", "INSERT INTO orders VALUES (%s, %s, %s, %s, NULL, %s, %s)", (w, d, o, c, len(lines), tx)
            )
            self.execute(cur, "my", "INSERT INTO new_order VALUES (%s, %s, %s, %s)", (w, d, o, tx))
            cur.executemany(
                self._sql("my", "INSERT INTO order_line VALUES (%s, %s, %s, %s, %s, %s, %s, %s, NULL, %s)"),
                [(w, d, o, n, item, supply, q, amount, tx) for n, item, supply, q, amount in lines],
            )
        with self.transaction("lite") as (cur, tx):
            cur.executemany(
                self._sql(
                    "lite",
                    "UPDATE stock SET s_quantity = CASE WHEN s_quantity - %s >= 10 THEN s_quantity - %s "
                    "ELSE s_quantity - %s + 91 END, s_ytd = s_ytd + %s, s_order_cnt = s_order_cnt + 1, tx = %s "
                    "WHERE s_w_id = %s AND s_i_id = %s",
                ),
                [(q, q, q, q, tx, supply, item) for _, item, supply, q, _ in lines],
            )
        district.undelivered.append((o, c, sum(line[4] for line in lines)))

    def payment(self, w: int) -> None:
        d, c = self.rng.randint(1, DISTRICTS), self.rng.randint(1, self.size.customers)
        amount = self.rng.randint(100, 500_000)
        with self.transaction("pg") as (cur, tx):
            self.execute(cur, "pg", "UPDATE warehouse SET w_ytd = w_ytd + %s, tx = %s WHERE w_id = %s", (amount, tx, w))
            self.execute(
                cur,
                "pg",
                "UPDATE district SET d_ytd = d_ytd + %s, tx = %s WHERE d_w_id = %s AND d_id = %s",
                (amount, tx, w, d),
            )
            self.execute(
                cur,
                "pg",
                "UPDATE customer SET c_balance = c_balance - %s, c_ytd_payment = c_ytd_payment + %s, "
                "c_payment_cnt = c_payment_cnt + 1, tx = %s WHERE c_w_id = %s AND c_d_id = %s AND c_id = %s",
                (amount, amount, tx, w, d, c),
            )

    def delivery(self, w: int) -> None:
        carrier, now = self.rng.randint(1, 10), int(time.time())
        delivered = []
        for d in range(1, DISTRICTS + 1):
            queue = self.districts[(w, d)].undelivered
            if queue:
                delivered.append((d, *queue.popleft()))
        if not delivered:
            return
        with self.transaction("my") as (cur, tx):
            for d, o, _, _ in delivered:
                key = (w, d, o)
                self.execute(
                    cur, "my", "DELETE FROM new_order WHERE no_w_id = %s AND no_d_id = %s AND no_o_id = %s", key
                )
                self.execute(
                    cur, "my", "UPDATE orders SET o_carrier_id = %s, tx = %s WHERE o_w_id = %s AND o_d_id = %s AND o_id = %s",
                    (carrier, tx, *key),
                )  # fmt: skip
                self.execute(
                    cur, "my",
                    "UPDATE order_line SET ol_delivery_d = %s, tx = %s WHERE ol_w_id = %s AND ol_d_id = %s AND ol_o_id = %s",
                    (now, tx, *key),
                )  # fmt: skip
        with self.transaction("pg") as (cur, tx):
            for d, _, c, amount in delivered:
                self.execute(
                    cur,
                    "pg",
                    "UPDATE customer SET c_balance = c_balance + %s, c_delivery_cnt = c_delivery_cnt + 1, tx = %s "
                    "WHERE c_w_id = %s AND c_d_id = %s AND c_id = %s",
                    (amount, tx, w, d, c),
                )

    def take_commits(self) -> list[tuple[int, float]]:
        out, self.committed = self.committed, []
        return out

    def close(self) -> None:
        for connection in self.connections.values():
            connection.close()
        for engine in self.engines.values():
            engine.dispose()


def save_commits(commits: list[tuple[int, float]]) -> str:
    """``commits`` written to a temporary file, whose path is returned: a phase's hundreds
    of thousands of commit times reach the benchmark's process (the manager's) as a path,
    read once the phase's memory samples are taken (``load_commits``), not as a message
    that would land in its memory while it is measured.

    >>> load_commits([save_commits([(7, 1.5), (9, 2.25)])])
    {7: 1.5, 9: 2.25}
    """
    with tempfile.NamedTemporaryFile(prefix="pvm-bench-commits-", delete=False) as out:
        array("q", (tx for tx, _ in commits)).tofile(out)
        array("d", (at for _, at in commits)).tofile(out)
        return out.name


def load_commits(paths: list[str]) -> dict[int, float]:
    """The commit times of ``save_commits``' files, by transaction; the files are removed."""
    commits: dict[int, float] = {}
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        os.unlink(path)
        count = len(data) // 16
        txs, times = array("q"), array("d")
        txs.frombytes(data[: 8 * count])
        times.frombytes(data[8 * count :])
        commits.update(zip(txs, times))
    return commits


def write_phases(urls: dict[str, str], size: Size, writer: int, writers: int, seed: int, commands, results) -> None:
    """A writer process: once connected (it says ``ready`` on ``results``), for each
    ``(rate, seconds)`` taken from ``commands`` (None ends it),
    run TPC-C transactions at ``rate`` a second on a fixed schedule for ``seconds``, then put
    ``(writer, figures, commits)`` on ``results``: the transactions run, how late the
    schedule fell, and the file holding ``(tx, commit time)`` of every source transaction
    (``save_commits``). A process of its own: a thread would share the interpreter of the
    manager it loads."""
    try:
        w = Writer(urls, size, writer, writers, seed)
    except Exception as exc:  # the parent reports it
        results.put((writer, {"error": f"{type(exc).__name__}: {exc}"}, []))
        return
    results.put((writer, {"ready": True}, []))
    try:
        while (command := commands.get()) is not None:
            rate, seconds = command
            total, late, counts = int(rate * seconds), 0.0, dict.fromkeys((m for m, _ in MIX), 0)
            started = time.monotonic()
            error = None
            for i in range(total):
                delay = started + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    late = max(late, -delay)
                kind = pick_transaction(w.rng.random())
                try:
                    w.run_one(kind)
                except Exception as exc:  # a lock timeout of SQLite under load: counted, not fatal
                    error = f"{type(exc).__name__}: {str(exc)[:200]}"
                    continue
                counts[kind] += 1
            elapsed = time.monotonic() - started
            figures = {"transactions": sum(counts.values()), "seconds": elapsed, "max_behind_schedule_s": late}
            results.put((writer, {**figures, "mix": counts, "last_error": error}, save_commits(w.take_commits())))
    finally:
        w.close()
