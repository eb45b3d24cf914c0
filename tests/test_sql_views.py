"""Parsing view definitions in SQL into SPJ plans (warehouse.sql_views)."""

from __future__ import annotations

import pytest

from contract.expr import And, Arith, Between, Cmp, Col, InList, IsNull, Like, Lit, Not, Or, compile_filter
from warehouse.plan import OutputColumn, RelationRef
from warehouse.sql_views import ViewDefinitionError, parse_view

TABLES: dict[tuple[str, str], tuple[str, ...]] = {
    ("s1", "R1"): ("A", "B"),
    ("s2", "R2"): ("A", "B"),
    ("s3", "R3"): ("A", "B"),
    ("shop", "orders"): ("id", "customer", "amount", "status", "note"),
    ("crm", "customers"): ("id", "name", "country", "email"),
    ("crm", "regions"): ("country", "region"),
}


@pytest.fixture
def schema():
    return lambda source, table: TABLES.get((source, table))


def o(name: str) -> Col:
    return Col("o", name)


def c(name: str) -> Col:
    return Col("c", name)


# -- rejected --------------------------------------------------------------------------------
REJECTED = [
    # statements
    ("SELECT o.id FROM shop.orders o WHERE", "could not parse the view definition"),
    ("SELECT (o.id FROM shop.orders o", "could not parse the view definition"),
    ("SELECT 'abc FROM shop.orders", "could not parse the view definition"),
    ("", "empty"),
    ("SELECT id FROM shop.orders; SELECT id FROM crm.customers", "multiple statements"),
    ("INSERT INTO shop.orders VALUES (1)", r"only SELECT \(optionally as CREATE VIEW … AS SELECT\) is accepted"),
    ("DROP TABLE shop.orders", "only SELECT"),
    ("CREATE TABLE t AS SELECT id FROM shop.orders", "only SELECT"),
    ("CREATE OR REPLACE VIEW v AS SELECT id FROM shop.orders", "CREATE VIEW options"),
    ("CREATE VIEW v (a) AS SELECT id FROM shop.orders", "column list"),
    ("CREATE VIEW x.v AS SELECT id FROM shop.orders", "invalid view name"),
    ("SELECT id FROM shop.orders UNION SELECT id FROM crm.customers", "UNION"),
    ("SELECT id FROM shop.orders INTERSECT SELECT id FROM crm.customers", "INTERSECT"),
    ("SELECT id FROM shop.orders EXCEPT SELECT id FROM crm.customers", "EXCEPT"),
    ("CREATE VIEW v AS SELECT id FROM shop.orders UNION SELECT id FROM crm.customers", "UNION"),
    ("WITH x AS (SELECT id FROM shop.orders) SELECT id FROM x", "WITH"),
    # clauses
    ("SELECT id FROM shop.orders ORDER BY id", "ORDER BY"),
    ("SELECT id FROM shop.orders LIMIT 5", "LIMIT"),
    ("SELECT id FROM shop.orders OFFSET 5", "OFFSET"),
    ("SELECT 1", "no relation"),
    # FROM
    ("SELECT id FROM orders", "relation orders must be written source.table"),
    ("SELECT id FROM x.shop.orders", "write source.table"),
    ("SELECT id FROM shop.nope", "unknown relation shop.nope"),
    ("SELECT id FROM nosource.orders", "unknown relation nosource.orders"),
    ("SELECT x.id FROM (SELECT id FROM shop.orders) x", "subqueries"),
    ("SELECT o.id FROM shop.orders o, crm.customers o", "duplicate alias o"),
    ("SELECT o.id FROM shop.orders o, crm.customers O", "duplicate alias O"),
    ("SELECT orders.id FROM shop.orders, shop.orders", "shop.orders appears twice as orders; give each occurrence"),
    ("SELECT a.id FROM shop.orders a, shop.orders A", "shop.orders appears twice as A; give each occurrence"),
    ("SELECT o.id FROM shop.orders o(a, b)", "column aliases"),
    ("SELECT o.id FROM shop.orders o RIGHT JOIN crm.customers c ON o.customer = c.id", "RIGHT outer joins are not"),
    ("SELECT o.id FROM shop.orders o FULL OUTER JOIN crm.customers c ON o.customer = c.id", "FULL outer joins"),
    ("SELECT o.id FROM shop.orders o LEFT SEMI JOIN crm.customers c ON o.customer = c.id", "LEFT SEMI JOIN is not"),
    ("SELECT o.id FROM shop.orders o LEFT JOIN crm.customers c USING (id)", "USING"),
    (
        "SELECT o.id FROM shop.orders o LEFT JOIN (crm.customers c JOIN crm.regions r ON c.country = r.country) "
        "ON o.customer = c.id",
        "an outer join whose right side is not a single relation",
    ),
    (
        "SELECT o.id FROM shop.orders o LEFT JOIN crm.customers c ON o.customer = c.id "
        "LEFT JOIN crm.regions r ON c.country = r.country",
        "more than one outer join",
    ),
    (
        "SELECT o.id FROM shop.orders o LEFT JOIN crm.customers c ON o.customer = c.id "
        "JOIN crm.regions r ON o.note = r.country",
        "a join after an outer join is not supported; write the LEFT JOIN last",
    ),
    (
        "SELECT o.id FROM shop.orders o JOIN crm.regions r ON o.note = r.country "
        "LEFT JOIN crm.customers c ON o.customer + r.region = c.id",
        r"an outer join whose ON clause references a third relation \(o.customer \+ r.region = c.id\)",
    ),
    (
        "SELECT o.id FROM shop.orders o JOIN crm.regions r ON o.note = r.country "
        "LEFT JOIN crm.customers c ON o.customer = c.id AND c.name = r.region",
        r"an outer join whose ON clause references a third relation \(o, r with c\)",
    ),
    (
        "SELECT o.id FROM shop.orders o LEFT JOIN crm.customers c ON o.customer = c.id AND o.amount > 3",
        r"an outer join whose ON clause has a condition on its left side alone \(o.amount > 3\)",
    ),
    (
        "SELECT o.id FROM shop.orders o LEFT JOIN crm.customers c ON c.country = 'FR'",
        "an outer join whose ON clause does not compare c with the left side",
    ),
    (
        "SELECT o.id FROM shop.orders o LEFT JOIN crm.customers c ON o.customer = c.id WHERE c.id IS NULL",
        "a condition outside the outer join's ON clause on its right relation c",
    ),
    ("SELECT o.id FROM shop.orders o LEFT JOIN crm.customers c ON 1 = 1", "constant predicate"),
    ("SELECT c.id FROM crm.customers c NATURAL JOIN crm.regions r", "NATURAL joins"),
    ("SELECT c.id FROM crm.customers c JOIN crm.regions r USING (country)", "USING"),
    # SELECT list
    ("SELECT SUM(amount) + 1 FROM shop.orders", "aggregate SUM"),
    ("SELECT UPPER(note) FROM shop.orders", "function UPPER is not supported"),
    ("SELECT amount + 1 AS a FROM shop.orders", r"only columns may be selected; amount \+ 1 is not supported"),
    ("SELECT 1 FROM shop.orders", "only columns may be selected; 1 is not supported"),
    ("SELECT CASE WHEN amount > 1 THEN 1 END FROM shop.orders", "CASE"),
    ("SELECT CAST(amount AS INT) FROM shop.orders", "CAST"),
    ("SELECT ROW_NUMBER() OVER (ORDER BY id) FROM shop.orders", "window functions"),
    ("SELECT (SELECT 1) FROM shop.orders", "subqueries"),
    ("SELECT o.id, c.id FROM shop.orders o, crm.customers c", "duplicate output column name id; give it an alias"),
    ("SELECT id AS x, note AS X FROM shop.orders", "duplicate output column name X"),
    ("SELECT * FROM shop.orders o, crm.customers c", "duplicate output column name id"),
    ("SELECT id FROM shop.orders o, crm.customers c", r"column id is ambiguous \(o.id, c.id\)"),
    ("SELECT nope FROM shop.orders o, crm.customers c", "unknown column nope: none of the relations o, c"),
    ("SELECT o.nope FROM shop.orders o", r"unknown column nope in relation o \(shop.orders\)"),
    ("SELECT z.id FROM shop.orders o", "unknown relation alias z"),
    ("SELECT z.* FROM shop.orders o", "unknown relation alias z"),
    ("SELECT shop.orders.id FROM shop.orders", "alias.column"),
    # WHERE / ON
    ("SELECT id FROM shop.orders WHERE 1 = 1", "constant predicate 1 = 1 is not supported"),
    ("SELECT id FROM shop.orders WHERE id = 1 AND TRUE", "constant predicate TRUE"),
    ("SELECT id FROM shop.orders WHERE UPPER(note) = 'X'", "function UPPER is not supported"),
    ("SELECT id FROM shop.orders WHERE LENGTH(note) > 1", "function LENGTH"),
    ("SELECT id FROM shop.orders WHERE myfunc(note)", "function MYFUNC"),
    ("SELECT id FROM shop.orders WHERE id IN (SELECT id FROM crm.customers)", "subqueries"),
    ("SELECT id FROM shop.orders WHERE EXISTS (SELECT 1 FROM crm.customers)", "subqueries"),
    ("SELECT id FROM shop.orders WHERE amount > (SELECT 1)", "subqueries"),
    ("SELECT id FROM shop.orders WHERE CASE WHEN amount > 1 THEN TRUE END", "CASE"),
    ("SELECT id FROM shop.orders WHERE CAST(note AS INT) = 1", "CAST"),
    ("SELECT id FROM shop.orders WHERE amount::INT = 1", "CAST"),
    ("SELECT id FROM shop.orders WHERE amount / 2 > 1", "amount / 2 is not supported"),
    ("SELECT id FROM shop.orders WHERE id IN (1, amount)", "IN accepts only a list of literals; amount"),
    ("SELECT id FROM shop.orders WHERE note LIKE status", "LIKE needs a string literal pattern"),
    ("SELECT id FROM shop.orders WHERE note ILIKE 'a%'", "ILIKE"),
    ("SELECT id FROM shop.orders WHERE note LIKE 'a!%' ESCAPE '!'", "ESCAPE"),
    ("SELECT id FROM shop.orders WHERE note IS TRUE", "IS TRUE"),
    ("SELECT id FROM shop.orders WHERE * = 1", r"\* is not supported"),
    ("SELECT * EXCEPT (id) FROM shop.orders", "EXCEPT"),
    ("SELECT o.id FROM shop.orders o JOIN crm.customers c ON 1 = 1", "constant predicate 1 = 1"),
    ("SELECT o.id FROM shop.orders o JOIN crm.customers c ON o.customer = c.nope", "unknown column nope"),
]


@pytest.mark.parametrize(("sql", "match"), REJECTED, ids=[sql or "<empty>" for sql, _ in REJECTED])
def test_rejected(schema, sql: str, match: str) -> None:
    with pytest.raises(ViewDefinitionError, match=match):
        parse_view(sql, schema, name="v")


@pytest.mark.parametrize(
    ("name", "match"),
    [(None, "the view needs a name"), ("1v", "invalid view name"), ("a-b", "invalid view name"), ("x" * 64, "invalid")],
)
def test_view_name_rejected(schema, name: str | None, match: str) -> None:
    with pytest.raises(ViewDefinitionError, match=match):
        parse_view("SELECT id FROM shop.orders", schema, name=name)


def test_errors_are_value_errors(schema) -> None:
    with pytest.raises(ValueError):
        parse_view("SELECT id FROM orders", schema, name="v")


# -- accepted --------------------------------------------------------------------------------
def test_two_relation_view_plan(schema) -> None:
    sql = (
        "SELECT o.id AS order_id, c.name, amount FROM shop.orders AS o, crm.customers c "
        "WHERE o.customer = c.id AND o.status = 'paid' AND c.country IN ('FR', 'DE') AND o.amount > 10"
    )
    plan = parse_view(sql, schema, name="paid_orders")
    assert plan.name == "paid_orders"
    assert plan.sql == sql
    assert plan.relations == (
        RelationRef(
            "o",
            "shop",
            "orders",
            ("id", "customer", "amount", "status"),
            And((Cmp("=", o("status"), Lit("paid")), Cmp(">", o("amount"), Lit(10)))),
        ),
        RelationRef("c", "crm", "customers", ("id", "name", "country"), InList(c("country"), ("FR", "DE"))),
    )
    assert plan.join == (Cmp("=", o("customer"), c("id")),)
    assert plan.outputs == (
        OutputColumn("order_id", o("id")),
        OutputColumn("name", c("name")),
        OutputColumn("amount", o("amount")),
    )
    assert plan.output_names == ("order_id", "name", "amount")


def test_chain_view_and_sweep(schema) -> None:
    # The paper's chain view; its outputs are aliased since all three are named A.
    plan = parse_view(
        "CREATE VIEW chain AS SELECT R1.A AS A1, R2.A AS A2, R3.A AS A3 "
        "FROM s1.R1, s2.R2, s3.R3 WHERE R1.A = R2.B AND R2.A = R3.B",
        schema,
    )
    assert plan.name == "chain"
    assert [(r.alias, r.source, r.table, r.columns, r.where) for r in plan.relations] == [
        ("R1", "s1", "R1", ("A",), None),
        ("R2", "s2", "R2", ("A", "B"), None),
        ("R3", "s3", "R3", ("A", "B"), None),
    ]
    assert plan.join == (
        Cmp("=", Col("R1", "A"), Col("R2", "B")),
        Cmp("=", Col("R2", "A"), Col("R3", "B")),
    )
    assert [s.relation for s in plan.sweep(1)] == [0, 2]
    assert [s.relation for s in plan.sweep(0)] == [1, 2]
    assert [s.relation for s in plan.sweep(None)] == [0, 1, 2]
    assert plan.sweep(1)[0].keys == (Col("R2", "B"),)
    assert plan.sweep(1)[1].keys == (Col("R2", "A"),)


def test_self_join_is_one_relation_per_alias(schema) -> None:
    """A table read twice is two relations of the plan, each with its own columns and local
    predicate, and SWEEP queries the other alias like any other relation."""
    plan = parse_view(
        "SELECT e.id, m.note AS boss_note FROM shop.orders e JOIN shop.orders m ON e.customer = m.id "
        "WHERE e.amount > 10 AND m.status = 'vip'",
        schema,
        "bosses",
    )
    assert plan.relations == (
        RelationRef("e", "shop", "orders", ("id", "customer", "amount"), Cmp(">", Col("e", "amount"), Lit(10))),
        RelationRef("m", "shop", "orders", ("id", "status", "note"), Cmp("=", Col("m", "status"), Lit("vip"))),
    )
    assert plan.sources == ("shop",)
    assert plan.join == (Cmp("=", Col("e", "customer"), Col("m", "id")),)
    assert [(s.relation, s.keys) for s in plan.sweep(0)] == [(1, (Col("e", "customer"),))]
    assert [(s.relation, s.keys) for s in plan.sweep(1)] == [(0, (Col("m", "id"),))]


def test_chain_view_without_aliases_has_duplicate_outputs(schema) -> None:
    with pytest.raises(ViewDefinitionError, match="duplicate output column name A"):
        parse_view("SELECT R1.A, R2.A, R3.A FROM s1.R1, s2.R2, s3.R3 WHERE R1.A = R2.B AND R2.A = R3.B", schema, "v")


def test_join_on_is_equivalent_to_where(schema) -> None:
    with_on = parse_view(
        "SELECT o.id, c.name FROM shop.orders o JOIN crm.customers c ON o.customer = c.id AND c.country = 'FR' "
        "INNER JOIN crm.regions r ON r.country = c.country WHERE o.amount > 1",
        schema,
        name="v",
    )
    with_where = parse_view(
        "SELECT o.id, c.name FROM shop.orders o, crm.customers c, crm.regions r "
        "WHERE o.customer = c.id AND c.country = 'FR' AND r.country = c.country AND o.amount > 1",
        schema,
        name="v",
    )
    assert with_on == with_where
    assert with_on.join == (Cmp("=", o("customer"), c("id")), Cmp("=", Col("r", "country"), c("country")))


def test_cross_join(schema) -> None:
    plan = parse_view("SELECT o.id, r.region FROM shop.orders o CROSS JOIN crm.regions r", schema, name="v")
    assert [r.alias for r in plan.relations] == ["o", "r"]
    assert plan.join == ()
    assert [r.columns for r in plan.relations] == [("id",), ("region",)]


def test_create_view_name_and_override(schema) -> None:
    sql = "CREATE VIEW big AS SELECT id FROM shop.orders WHERE amount > 100;"
    assert parse_view(sql, schema).name == "big"
    assert parse_view(sql, schema, name="other").name == "other"
    with pytest.raises(ViewDefinitionError, match="invalid view name 'my view'"):
        parse_view('CREATE VIEW "my view" AS SELECT id FROM shop.orders', schema)


def test_default_alias_is_table_name(schema) -> None:
    plan = parse_view("SELECT orders.id, customers.name FROM shop.orders, crm.customers", schema, name="v")
    assert [r.alias for r in plan.relations] == ["orders", "customers"]
    assert plan.outputs == (OutputColumn("id", Col("orders", "id")), OutputColumn("name", Col("customers", "name")))


def test_star_expansion(schema) -> None:
    plan = parse_view("SELECT * FROM crm.regions r, shop.orders o", schema, name="v")
    assert plan.output_names == ("country", "region", "id", "customer", "amount", "status", "note")
    assert plan.relations[0].columns == ("country", "region")
    assert plan.relations[1].columns == TABLES["shop", "orders"]


def test_alias_star_and_columns(schema) -> None:
    plan = parse_view("SELECT r.*, o.id FROM crm.regions r, shop.orders o WHERE o.note = r.region", schema, name="v")
    assert plan.outputs == (
        OutputColumn("country", Col("r", "country")),
        OutputColumn("region", Col("r", "region")),
        OutputColumn("id", o("id")),
    )
    assert plan.relations[1].columns == ("id", "note")  # schema order, not usage order


def test_unqualified_columns_resolve_to_their_only_relation(schema) -> None:
    plan = parse_view("SELECT name, amount FROM shop.orders o, crm.customers c WHERE customer = email", schema, "v")
    assert plan.outputs == (OutputColumn("name", c("name")), OutputColumn("amount", o("amount")))
    assert plan.join == (Cmp("=", o("customer"), c("email")),)


def test_identifier_case(schema) -> None:
    # exact spelling first, then the single case-insensitive match; names come from the schema
    plan = parse_view("SELECT O.ID, \"Amount\" AS a FROM shop.orders o WHERE o.Status = 'x'", schema, "v")
    assert plan.outputs == (OutputColumn("id", o("id")), OutputColumn("a", o("amount")))
    assert plan.relations[0].where == Cmp("=", o("status"), Lit("x"))


def test_relation_with_no_needed_column(schema) -> None:
    # a relation the view reads for multiplicity only still is a relation of the plan
    plan = parse_view("SELECT o.id FROM shop.orders o, crm.regions r", schema, name="v")
    assert [r.columns for r in plan.relations] == [("id",), ()]


def test_predicate_translation(schema) -> None:
    plan = parse_view(
        "SELECT id FROM shop.orders WHERE amount != -2.5 AND NOT (status IN ('a', 'b')) AND status NOT IN ('c') "
        "AND amount BETWEEN 1 AND 10 AND amount NOT BETWEEN 3 AND 4 AND note IS NULL AND status IS NOT NULL "
        "AND note LIKE 'a%' AND note NOT LIKE '%z' AND (amount + 1) * 2 - -3 >= 7 AND (id = 1 OR id = 2 OR id = 3) "
        "AND NOT id = 4 AND status <> 'it''s' AND id IN (1, -1, NULL, TRUE)",
        schema,
        name="v",
    )
    amount, status, note, id_ = (Col("orders", name) for name in ("amount", "status", "note", "id"))
    assert plan.relations[0].where == And(
        (
            Cmp("<>", amount, Lit(-2.5)),
            InList(status, ("a", "b"), negated=True),
            InList(status, ("c",), negated=True),
            Between(amount, Lit(1), Lit(10)),
            Between(amount, Lit(3), Lit(4), negated=True),
            IsNull(note),
            IsNull(status, negated=True),
            Like(note, "a%"),
            Like(note, "%z", negated=True),
            Cmp(">=", Arith("-", Arith("*", Arith("+", amount, Lit(1)), Lit(2)), Lit(-3)), Lit(7)),
            Or((Cmp("=", id_, Lit(1)), Cmp("=", id_, Lit(2)), Cmp("=", id_, Lit(3)))),
            Not(Cmp("=", id_, Lit(4))),
            Cmp("<>", status, Lit("it's")),
            InList(id_, (1, -1, None, True)),
        )
    )
    assert plan.join == ()


def test_or_across_relations_is_a_join_conjunct(schema) -> None:
    plan = parse_view(
        "SELECT o.id FROM shop.orders o, crm.customers c WHERE (o.customer = c.id OR c.name IS NULL) AND o.id > 0",
        schema,
        name="v",
    )
    assert plan.join == (Or((Cmp("=", o("customer"), c("id")), IsNull(c("name")))),)
    assert plan.relations[0].where == Cmp(">", o("id"), Lit(0))
    assert plan.relations[1].where is None
    assert plan.relations[1].columns == ("id", "name")


def test_literals(schema) -> None:
    plan = parse_view(
        "SELECT id FROM shop.orders WHERE amount = 3 AND amount = 1.5 AND amount = 1e3 AND amount = -(-4) "
        "AND status = TRUE AND note = FALSE AND note = NULL AND -amount < 0",
        schema,
        name="v",
    )
    values = [p.right.value for p in plan.relations[0].where.args[:7]]
    assert values == [3, 1.5, 1000.0, 4, True, False, None]
    assert type(values[0]) is int and type(values[1]) is float
    assert plan.relations[0].where.args[7] == Cmp("<", Arith("-", Lit(0), Col("orders", "amount")), Lit(0))


def test_boolean_column_condition(schema) -> None:
    plan = parse_view("SELECT id FROM shop.orders WHERE status AND NOT note", schema, name="v")
    assert plan.relations[0].where == And((Col("orders", "status"), Not(Col("orders", "note"))))


# -- semantics: parsed local predicates evaluated in Python ----------------------------------
def _filter(schema, where: str):
    """A filter over keyword rows, from the parsed local predicate of ``where``."""
    plan = parse_view(f"SELECT id FROM shop.orders o WHERE {where}", schema, name="v")
    rel = plan.relations[0]
    keep = compile_filter(rel.where, {col: i for i, col in enumerate(rel.cols())})
    return lambda **row: keep(tuple(row.get(name) for name in rel.columns))


def test_in_semantics(schema) -> None:
    keep = _filter(schema, "o.status IN ('a', 'b')")
    assert [keep(status=s) for s in ("a", "b", "c", None)] == [True, True, False, False]
    keep_not = _filter(schema, "o.status NOT IN ('a', NULL)")
    assert [keep_not(status=s) for s in ("a", "c", None)] == [False, False, False]  # NULL in list: never true


def test_between_semantics(schema) -> None:
    keep = _filter(schema, "amount BETWEEN 10 AND 20")
    assert [keep(amount=a) for a in (9, 10, 20, 21, None)] == [False, True, True, False, False]
    keep_not = _filter(schema, "amount NOT BETWEEN 10 AND 20")
    assert [keep_not(amount=a) for a in (9, 15, None)] == [True, False, False]


def test_like_semantics(schema) -> None:
    keep = _filter(schema, "note LIKE 'ab_%'")
    assert [keep(note=n) for n in ("abc", "abcdef", "ab", "xabc", None)] == [True, True, False, False, False]
    keep_not = _filter(schema, "NOT note LIKE 'ab%'")
    assert [keep_not(note=n) for n in ("abc", "x", None)] == [False, True, False]


def test_null_semantics(schema) -> None:
    keep = _filter(schema, "note IS NULL AND amount + 1 > 5")
    rows = [dict(amount=5, note=None), dict(amount=4, note=None), dict(amount=5, note="x"), dict()]
    assert [keep(**row) for row in rows] == [True, False, False, False]
    keep_not = _filter(schema, "note IS NOT NULL OR amount = 1")
    assert [keep_not(**row) for row in (dict(amount=2, note="x"), dict(amount=1), dict())] == [True, True, False]


def test_left_join_plan(schema) -> None:
    """The ON conjuncts reading the right relation alone are its local predicate; those with
    the left side are join conjuncts; the right relation is swept last."""
    plan = parse_view(
        "SELECT o.id, c.name FROM shop.orders o JOIN crm.regions r ON o.note = r.country "
        "LEFT OUTER JOIN crm.customers c ON o.customer = c.id AND c.country = 'FR' WHERE o.amount > 3",
        schema,
        "v",
    )
    assert plan.outer == 2
    assert plan.relations[2] == RelationRef(
        "c", "crm", "customers", ("id", "name", "country"), Cmp("=", c("country"), Lit("FR"))
    )
    assert plan.outer_on == (Cmp("=", o("customer"), c("id")),)
    assert plan.partner_step.keys == plan.partner_step.layout == (o("customer"),)
    # every term but the right relation's own queries it last
    assert [s.relation for s in plan.sweep(None)] == [0, 1, 2]
    assert [s.relation for s in plan.sweep(0)] == [1, 2]
    assert [s.relation for s in plan.sweep(1)] == [0, 2]
    assert [s.relation for s in plan.sweep(2)] == [0, 1]
    assert plan.sweep(0)[-1].keys == (o("customer"),)
