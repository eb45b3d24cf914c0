"""SQL from analysts and administrators is bounded before sqlglot parses it
(warehouse/sql_bounds.py): too deep, too long, pipe syntax and words Spark would read as
environment functions are refused with a message, never a RecursionError or a 500."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.analyst import QueryRejected, check_query
from tests.api_support import VIEW, api_env
from warehouse import sql_bounds

DEEP = {
    "parentheses": "SELECT " + "(" * 200 + "1" + ")" * 200 + " FROM v",
    "NOT": "SELECT 1 FROM v WHERE " + "NOT " * 500 + "x",
    "CASE": "SELECT " + "CASE WHEN x THEN " * 100 + "1" + " END" * 100 + " FROM v",
    "function calls": "SELECT " + "abs(" * 100 + "x" + ")" * 100 + " FROM v",
    "subqueries": "SELECT * FROM " + "(SELECT * FROM " * 60 + "v" + ") t" * 60,
    "brackets": "SELECT " + "array(" * 80 + "1" + ")" * 80 + " FROM v",
    "signs": "SELECT " + "- " * 400 + "1 FROM v",
}


@pytest.mark.parametrize("construct", sorted(DEEP))
def test_deep_analyst_queries_are_refused_naming_the_bound(construct: str) -> None:
    with pytest.raises(QueryRejected, match="levels deep.*at most 25"):
        check_query(DEEP[construct], ["v"])


def test_the_bounds_leave_room_for_real_queries() -> None:
    nested = "SELECT " + "(" * 24 + "x" + ")" * 24 + " FROM v WHERE NOT x IS NOT NULL"
    assert check_query(nested, ["v"]).startswith("SELECT")
    in_list = "SELECT x FROM v WHERE x IN (" + ", ".join(map(str, range(2000))) + ")"
    assert "1999" in check_query(in_list, ["v"])
    with pytest.raises(QueryRejected, match="tokens; at most 5000"):
        check_query("SELECT x FROM v WHERE x IN (" + ", ".join(map(str, range(3000))) + ")", ["v"])


def test_recursion_anywhere_in_the_check_is_a_refusal(monkeypatch) -> None:
    """Should a construct recurse more than measured, RecursionError is still a refusal."""
    monkeypatch.setattr(sql_bounds, "check_tokens", lambda *bounds: None)
    with pytest.raises(QueryRejected, match="nested too deeply"):
        check_query(DEEP["parentheses"], ["v"])


@pytest.mark.parametrize("sql", ["FROM v |> WHERE x > 1", "SELECT * FROM v |> WHERE x > 1 |> SELECT x"])
def test_pipe_syntax_is_refused(sql: str) -> None:
    with pytest.raises(QueryRejected, match=r"pipe syntax \(\|>\) is not supported"):
        check_query(sql, ["v"])


@pytest.mark.parametrize(
    "word", ["user", "USER", "`user`", "current_path", "current_time", "system_user", "grouping__id"]
)
def test_bare_environment_words_are_refused(word: str) -> None:
    for sql in (f"SELECT {word} FROM v", f"SELECT x FROM v WHERE x = {word}", f"SELECT x FROM v ORDER BY {word}"):
        with pytest.raises(QueryRejected, match="qualify it with its view or alias"):
            check_query(sql, ["v"])


def test_columns_named_like_environment_words_are_read_qualified() -> None:
    assert check_query("SELECT v.user, t.current_path FROM v JOIN v AS t ON v.id = t.id", ["v"]).startswith(
        "SELECT v.user, t.current_path"
    )
    assert check_query("SELECT transform(a, user -> user + 1) FROM v", ["v"])  # a lambda's own variable
    assert check_query("SELECT current_date, current_timestamp FROM v", ["v"])  # allowed functions
    with pytest.raises(QueryRejected, match="function CURRENT_USER"):
        check_query("SELECT current_user FROM v", ["v"])


async def test_view_definitions_are_bounded_too(tmp_path) -> None:
    async with api_env(tmp_path) as env:
        admin = env.auth("admin")
        deep_where = VIEW + " AND " + "(" * 100 + "R.k = 1" + ")" * 100
        for sql, words in (
            (deep_where, "levels deep"),
            (VIEW + " AND " + "NOT " * 600 + "R.k = 1", "levels deep"),
            (VIEW + " AND R.k IN (" + ", ".join(map(str, range(6000))) + ")", "tokens"),
            ("FROM a.R |> WHERE k > 1", "pipe syntax"),
        ):
            r = await env.client.post("/v1/views", json={"sql": sql, "name": "deep"}, headers=admin)
            assert r.status_code == 422 and words in r.json()["detail"], r.text[:300]
        assert "deep" not in env.manager.views
        ok = VIEW + " AND " + "(" * 20 + "R.k = 1" + ")" * 20
        assert (await env.client.post("/v1/views", json={"sql": ok, "name": "fine"}, headers=admin)).status_code == 201


SQL_WORDS = [
    "SELECT",
    "FROM",
    "WHERE",
    "AND",
    "OR",
    "NOT",
    "(",
    ")",
    "[",
    "]",
    ",",
    ".",
    "*",
    "+",
    "-",
    "/",
    "=",
    "<",
    ">",
    "<=",
    ">=",
    "<>",
    "!=",
    "||",
    "|>",
    ";",
    ":",
    "?",
    "!",
    "~",
    "CASE",
    "WHEN",
    "THEN",
    "ELSE",
    "END",
    "AS",
    "ON",
    "JOIN",
    "LEFT",
    "UNION",
    "ALL",
    "WITH",
    "RECURSIVE",
    "GROUP",
    "BY",
    "HAVING",
    "ORDER",
    "LIMIT",
    "OFFSET",
    "IN",
    "BETWEEN",
    "LIKE",
    "IS",
    "NULL",
    "TRUE",
    "INTERVAL",
    "CAST",
    "ARRAY",
    "MAP",
    "STRUCT",
    "LATERAL",
    "VIEW",
    "EXPLODE",
    "PIVOT",
    "FOR",
    "TABLESAMPLE",
    "TRANSFORM",
    "USING",
    "->",
    "`q`",
    "'x'",
    '"y"',
    "${v}",
    "1",
    "2.5",
    "1e999",
    "v",
    "a.R",
    "R.k",
    "k",
    "user",
    "current_user",
    "x",
    "/*",
    "*/",
    "--",
    "\\n",
    "DISTINCT",
    "OVER",
    "PARTITION",
    "ROWS",
    "UNBOUNDED",
]


@settings(max_examples=400, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(
    st.one_of(
        st.lists(st.sampled_from(SQL_WORDS), max_size=60).map(" ".join),
        st.text(max_size=200),
        st.builds(
            lambda w, n: "SELECT " + w * n + "1 FROM v",
            st.sampled_from(["(", "NOT ", "- ", "abs(", "[", "CASE WHEN x THEN "]),
            st.integers(0, 400),
        ),
    )
)
def test_any_text_is_checked_or_refused_never_crashes(sql: str) -> None:
    """Whatever an analyst or an administrator sends, the check answers with SQL or a
    refusal naming the problem: never another exception (a 500)."""
    from warehouse.sql_views import ViewDefinitionError, parse_view

    try:
        assert isinstance(check_query(sql, ["v"]), str)
    except QueryRejected as refused:
        assert str(refused)
    try:
        parse_view(sql, lambda source, table: ("k", "v") if (source, table) == ("a", "R") else None, name="fuzz")
    except ViewDefinitionError as refused:
        assert str(refused)
