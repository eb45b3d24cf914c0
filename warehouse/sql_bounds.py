"""Bounds on SQL text, checked on its tokens before sqlglot parses it.

sqlglot's parser and generator recurse for every level of nesting: up to ~24 Python frames
for a parenthesis or a function call, ~19 for a CASE, ~9 for a NOT (measured with sqlglot
30), so a statement nested a few dozen levels deep ends in RecursionError, and how deep is
too deep depends on the caller's own stack. Parsing also costs tens of microseconds per token,
on the caller's thread (the event loop, for the API's requests). So a statement is refused,
naming the bound, when

* it has more than ``max_tokens`` tokens, or
* it nests deeper than ``max_nesting``: an open parenthesis, bracket or CASE counts one level
  until it is closed, and so does each operator of a run after the first (``NOT NOT x``,
  ``a - -1``);
  at 25 levels sqlglot uses at most ~600 frames, well within Python's 1,000 whatever the
  caller's depth,

and RecursionError from anything sqlglot does is turned into the same refusal, in case some
construct recurses more than measured. Pipe syntax (``FROM v |> WHERE …``) is refused too:
sqlglot rewrites it into common table expressions, so what runs would not read like what
was sent.

>>> parse("SELECT a FROM t WHERE NOT b")[0].sql()
'SELECT a FROM t WHERE NOT b'
>>> parse("SELECT " + "(" * 30 + "1" + ")" * 30)
Traceback (most recent call last):
...
warehouse.sql_bounds.SqlTooComplex: the statement nests 30 levels deep (parentheses, brackets, CASE, runs of NOT or signs); at most 25 are allowed
>>> parse("FROM t |> WHERE a > 1")
Traceback (most recent call last):
...
warehouse.sql_bounds.SqlTooComplex: pipe syntax (|>) is not supported: write the query as a SELECT
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect, DialectType
from sqlglot.tokens import Token, TokenType

MAX_TOKENS = 10_000
MAX_NESTING = 25

_OPEN = frozenset({TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.CASE})
_CLOSE = frozenset({TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.END})
_PREFIX = frozenset(  # the names vary between sqlglot versions (TILDA, TILDE)
    getattr(TokenType, name)
    for name in ("NOT", "DASH", "PLUS", "TILDE", "TILDA", "EXCLAMATION")
    if hasattr(TokenType, name)
)
_PIPE = getattr(TokenType, "PIPE_GT", None)  # sqlglot before 26 does not read pipe syntax at all


class SqlTooComplex(ValueError):
    """A statement over a bound (size, nesting) or in a syntax that is not taken; the message
    names it."""


def parse(
    sql: str, dialect: DialectType = None, max_tokens: int = MAX_TOKENS, max_nesting: int = MAX_NESTING
) -> list[exp.Expr | None]:
    """``sqlglot.parse(sql, dialect)`` within the bounds; SqlTooComplex otherwise. sqlglot's
    own errors (SqlglotError) pass through."""
    dialect = Dialect.get_or_raise(dialect)
    try:
        tokens = dialect.tokenize(sql)
        check_tokens(tokens, max_tokens, max_nesting)
        return dialect.parser().parse(tokens, sql)
    except RecursionError:
        raise too_deep() from None


def check_tokens(tokens: list[Token], max_tokens: int = MAX_TOKENS, max_nesting: int = MAX_NESTING) -> None:
    if len(tokens) > max_tokens:
        raise SqlTooComplex(f"the statement has {len(tokens)} tokens; at most {max_tokens} are allowed")
    open_levels = run = deepest = 0
    previous: TokenType | None = None
    for token in tokens:
        kind = token.token_type
        if kind is _PIPE:
            raise SqlTooComplex("pipe syntax (|>) is not supported: write the query as a SELECT")
        run = run + 1 if kind in _PREFIX and previous in _PREFIX else 0  # prefix operators after the first
        if kind in _OPEN:
            open_levels += 1
        elif kind in _CLOSE:
            open_levels = max(0, open_levels - 1)
        deepest = max(deepest, open_levels + run)
        previous = kind
    if deepest > max_nesting:
        raise SqlTooComplex(
            f"the statement nests {deepest} levels deep (parentheses, brackets, CASE, runs of NOT or signs); "
            f"at most {max_nesting} are allowed"
        )


def too_deep() -> SqlTooComplex:
    return SqlTooComplex(f"the statement is nested too deeply to process (at most {MAX_NESTING} levels)")


__all__ = ["MAX_NESTING", "MAX_TOKENS", "SqlTooComplex", "check_tokens", "parse", "too_deep"]
