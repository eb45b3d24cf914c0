"""The aggregate view of ``pvm bench aggregate``, its data, and the two ways to maintain it.

The view groups the join of ``shop.orders`` (N rows) with ``crm.customers`` by the
customer's region, with every supported aggregate (``VIEW_SQL``); its select-project-join
body has one row per order, N in all. The data follow fixed formulas of the order id
(``Data``), so Spark generates the sources at any N without the bench holding them, and the
bench knows any order's body row without asking Spark:

* order ``i`` belongs to customer ``(i - 1) % customers + 1``, customer ``c`` to region
  ``r<c % groups>``;
* orders ``1 … groups`` hold one region each and its MAX (``100000 + i``, above every other
  amount), orders ``groups + 1 … 2·groups`` one region each and its MIN (1 to 9, below every
  other amount): deleting one of them removes its region's extreme;
* every 50th other order has a NULL amount (``COUNT(amount)`` differs from ``COUNT(*)``),
  the others ``10 + i·7919 mod 9973``: a prime modulus, so that the amounts do not repeat
  with the regions' period and each region holds about as many distinct amounts as orders
  (up to 9973), one multiset row each in the store.

Its two maintenances, of one single-row source update at a time:

* **incremental**, the service's path: the update's effect on the body ΔV (one or two body
  rows) through the aggregate operator (``warehouse.aggregate.encode``) into the store's
  z-log (``SparkStore.commit``), then the published W moved (``SparkStore.publish``);
* **recompute**: the view's GROUP BY over the body's rows as they now are, computed by
  Spark from scratch and written as the view's new state (Parquet).

The store's initial state is the body's stored rows computed by Spark
(``warehouse.aggregate.encode_sql``, what ``encode`` would write of the whole body, as a
view's initial load in Spark computes them), loaded as order 1.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from contract.zset import ZSet
from warehouse.aggregate import Summary
from warehouse.sql_views import parse_view

VIEW_SQL = (
    "SELECT c.region, COUNT(*) AS orders, COUNT(o.amount) AS priced, SUM(o.amount) AS revenue, "
    "AVG(o.amount) AS mean, MIN(o.amount) AS smallest, MAX(o.amount) AS largest "
    "FROM shop.orders o JOIN crm.customers c ON o.customer = c.id GROUP BY c.region"
)
TABLES = {("shop", "orders"): ("id", "customer", "amount"), ("crm", "customers"): ("id", "region")}
BODY_TYPES = ("STRING", "BIGINT")  # the body's columns: c.region, o.amount
TOP = 100_000  # planted maxima are TOP + i, above every other amount
NULL_EVERY = 50
MODULUS = 9973  # ordinary amounts are 10 + i·7919 mod MODULUS

Kind = Literal["insert", "delete max", "update", "delete min"]
KINDS: tuple[Kind, ...] = ("insert", "delete max", "update", "delete min")


def summary() -> Summary:
    """The view's aggregate over its body ``(c.region, o.amount)``."""
    plan = parse_view(VIEW_SQL, lambda source, table: TABLES.get((source, table)), name="aggregate_bench")
    assert plan.summary is not None, "VIEW_SQL groups"
    return plan.summary


BodyRow = tuple[str, int | None]  # (region, amount)


@dataclass(frozen=True)
class Data:
    """The sources at ``rows`` orders: ``customers`` customers in ``groups`` regions."""

    rows: int
    groups: int

    @property
    def customers(self) -> int:
        return max(2 * self.groups, self.rows // 20)

    def region(self, customer: int) -> str:
        return f"r{customer % self.groups}"

    def customer(self, order: int) -> int:
        return (order - 1) % self.customers + 1

    def amount(self, order: int) -> int | None:
        """The amount of an order as generated (``amount_sql`` is the same in Spark SQL).

        >>> d = Data(1000, 10)
        >>> [d.amount(i) for i in (1, 10, 11, 20, 50, 21)]
        [100001, 100010, 3, 3, None, 6741]
        """
        if order <= self.groups:
            return TOP + order
        if order <= 2 * self.groups:
            return order % 9 + 1
        if order % NULL_EVERY == 0:
            return None
        return 10 + order * 7919 % MODULUS

    def amount_sql(self) -> str:
        g = self.groups
        return (
            f"CASE WHEN id <= {g} THEN {TOP} + id WHEN id <= {2 * g} THEN id % 9 + 1 "
            f"WHEN id % {NULL_EVERY} = 0 THEN CAST(NULL AS BIGINT) ELSE 10 + id * 7919 % {MODULUS} END"
        )

    def body_row(self, order: int) -> BodyRow:
        return self.region(self.customer(order)), self.amount(order)


def write_sources(spark: Any, data: Data, orders: str, customers: str, body: str) -> int:
    """The two source tables as Parquet at ``orders`` and ``customers``, and the view's body
    (their join, with the order id) at ``body``; returns the body's row count."""
    spark.range(1, data.rows + 1).selectExpr(
        "id", f"(id - 1) % {data.customers} + 1 AS customer", f"{data.amount_sql()} AS amount"
    ).write.mode("overwrite").parquet(orders)
    spark.range(1, data.customers + 1).selectExpr("id", f"concat('r', id % {data.groups}) AS region").write.mode(
        "overwrite"
    ).parquet(customers)
    o, c = spark.read.parquet(orders).alias("o"), spark.read.parquet(customers).alias("c")
    joined = o.join(c, o["customer"] == c["id"]).select(o["id"], c["region"], o["amount"])
    joined.write.mode("overwrite").parquet(body)
    return int(spark.read.parquet(body).count())


def recompute_sql(body: str, deleted: Sequence[int], added: str) -> str:
    """The view's GROUP BY over the body as it now is: the rows of ``body`` (id, region,
    amount) less the orders ``deleted`` from it, plus the rows of the relation ``added``.

    >>> print(recompute_sql("b", [7, 3], "a"))  # doctest: +NORMALIZE_WHITESPACE
    SELECT region, COUNT(*) AS orders, COUNT(amount) AS priced, SUM(amount) AS revenue,
    AVG(amount) AS mean, MIN(amount) AS smallest, MAX(amount) AS largest FROM (SELECT region,
    amount FROM b WHERE id NOT IN (3, 7) UNION ALL SELECT region, amount FROM a) GROUP BY region
    """
    gone = f" WHERE id NOT IN ({', '.join(map(str, sorted(deleted)))})" if deleted else ""
    return (
        "SELECT region, COUNT(*) AS orders, COUNT(amount) AS priced, SUM(amount) AS revenue, "
        "AVG(amount) AS mean, MIN(amount) AS smallest, MAX(amount) AS largest "
        f"FROM (SELECT region, amount FROM {body}{gone} UNION ALL SELECT region, amount FROM {added}) "
        "GROUP BY region"
    )


@dataclass
class Update:
    """One single-row source update and its effect on the view's body."""

    kind: Kind
    order_id: int
    delta: ZSet  # of body rows (region, amount)

    @property
    def groups(self) -> list[str]:
        return sorted({row[0] for row in self.delta.rows()})


@dataclass
class Body:
    """The body as updates leave it: the generated rows less ``deleted`` orders, plus
    ``added`` ones (inserted, or the new version of an updated order)."""

    data: Data
    rng: random.Random
    deleted: set[int] = field(default_factory=set)
    added: dict[int, BodyRow] = field(default_factory=dict)
    inserted: int = 0
    _maxima: list[int] = field(default_factory=list)
    _minima: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        g = self.data.groups
        self._maxima = self.rng.sample(range(1, g + 1), g)
        self._minima = self.rng.sample(range(g + 1, 2 * g + 1), g)

    def next_update(self, kind: Kind) -> Update:
        """Apply one update of ``kind`` and return its body effect. ``delete max`` and
        ``delete min`` delete a region's only row holding its extreme; ``update`` changes the
        amount of a priced order neither planted nor touched before."""
        d = self.data
        if kind == "insert":
            self.inserted += 1
            order = d.rows + self.inserted
            row: BodyRow = (d.region(self.rng.randint(1, d.customers)), self.rng.randint(10, MODULUS + 9))
            self.added[order] = row
            return Update(kind, order, ZSet({row: 1}))
        if kind in ("delete max", "delete min"):
            planted = self._maxima if kind == "delete max" else self._minima
            if not planted:
                raise ValueError(f"every region's planted extreme is deleted already: {kind}")
            order = planted.pop()
            self.deleted.add(order)
            return Update(kind, order, ZSet({d.body_row(order): -1}))
        order = self.rng.randint(2 * d.groups + 1, d.rows)
        while order in self.deleted or d.amount(order) is None:
            order = self.rng.randint(2 * d.groups + 1, d.rows)
        old = d.body_row(order)
        amount = self.rng.randint(10, MODULUS + 9)
        new: BodyRow = (old[0], amount if amount != old[1] else amount + 1)  # a change, not a no-op
        self.deleted.add(order)
        self.added[order] = new
        return Update(kind, order, ZSet({old: -1}) + ZSet({new: 1}))
