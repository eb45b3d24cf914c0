"""Updates in parts, staged in the catalog.

The catalog's side on SQLite, PostgreSQL and MariaDB: parts are staged a row each, logged as
one seq with their last part (copied inside the database), read back whole or by name, cut
a read of the log, and go with their log entry when it is pruned.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from warehouse.catalog.db import (
    Catalog,
    LogEntry,
    LogRef,
    NewUpdate,
    PruneReach,
    RelationInfo,
    SeqConflict,
    StagedPart,
    StagedUpdate,
    content_digest,
)
from warehouse.catalog.models import LogPartRow, StagedPartRow

TABLES = {"a": {"R": ("k", "v TEXT")}, "b": {"S": ("k", "w")}}
VIEW = "SELECT R.k, R.v, S.w FROM a.R, b.S WHERE R.k = S.k"


# -- the catalog ----------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'catalog.db'}"
    elif request.param == "postgresql":
        url = request.getfixturevalue("postgresql_catalog")
    else:
        url = request.getfixturevalue("mariadb_catalog")
    cat = Catalog(url)
    cat.add_source("a", "http://a", "trigger", [RelationInfo("a", "R", ("k", "v"), ("INTEGER", "TEXT"), ())])
    yield cat
    cat.close()


@pytest.fixture
def mariadb_catalog() -> Iterator[str]:
    name = f"pvm_catalog_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine("mysql+pymysql://root@127.0.0.1:3306/test", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield f"mysql+pymysql://root@127.0.0.1:3306/{name}"
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE {name}")
        admin.dispose()


def changes(keys: range, v: object = "x") -> list[dict]:
    return [{"relation": "R", "sign": 1, "row": {"k": k, "v": v}} for k in keys]


def staged_rows(engine: sa.Engine) -> list[tuple[str, int, int, int]]:
    """(source, seq, part, changes) of every staged part."""
    with engine.connect() as conn:
        q = sa.select(StagedPartRow.source, StagedPartRow.seq, StagedPartRow.part, StagedPartRow.count)
        return sorted((s, q_, p, c) for s, q_, p, c in conn.execute(q.order_by(StagedPartRow.part)))


def log_parts(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(LogPartRow)).scalar_one())


def test_parts_are_staged_then_logged_as_one_seq(catalog: Catalog) -> None:
    # values whose JSON must come back as they went: 1.0 stays a float, NaN and -0.0 stay
    odd = [{"relation": "R", "sign": -1, "row": {"k": 1.0, "v": float("nan")}}, *changes(range(1), -0.0)]
    parts = [changes(range(3)), odd, changes(range(3, 5), "ü")]
    whole = [c for part in parts for c in part]
    catalog.append_updates("a", [NewUpdate(1, changes(range(1)), None, None, content_digest(changes(range(1))))])
    assert catalog.stage_part("a", StagedPart(2, 0, parts[0], "t1", 5.5))
    assert catalog.stage_part("a", StagedPart(2, 1, parts[1], "t1", 5.5))
    assert catalog.staged("a") == StagedUpdate(2, "t1", 5.5, 2, 5)
    assert content_digest(catalog.staged_part("a", 2, 1)) == content_digest(parts[1])  # NaN is not NaN: digests
    assert catalog.log_entries("a", 1) == []  # nothing logged before the last part

    ref = catalog.log_staged("a", StagedPart(2, 2, parts[2], "t1", 5.5), content_digest(whole))
    assert isinstance(ref, LogRef) and ref.seq == 2
    assert catalog.staged("a") is None and staged_rows(catalog.engine) == []
    assert log_parts(catalog.engine) == 3
    [entry] = catalog.log_entries("a", 1)
    assert (entry.id, entry.parts, len(entry.changes)) == (ref.id, 3, 7)
    assert content_digest(entry.changes) == content_digest(whole)  # the same content, value for value
    assert [type(e) for e in catalog.log_releases([entry.id - 1, entry.id])] == [LogEntry, LogRef]

    # resent whole: the same content is a duplicate, other content a conflict
    assert catalog.append_updates("a", [NewUpdate(2, whole, "t1", 5.5, content_digest(whole))]) == []
    with pytest.raises(SeqConflict):
        catalog.append_updates("a", [NewUpdate(2, whole[:-1], "t1", 5.5, content_digest(whole[:-1]))])
    # or in parts again: logged already, nothing staged
    assert not catalog.stage_part("a", StagedPart(2, 0, parts[0], "t1", 5.5))
    assert catalog.log_staged("a", StagedPart(2, 0, whole, "t1", 5.5), content_digest(whole)) is None
    assert staged_rows(catalog.engine) == []

    # a read of the log ends with an update logged from parts
    catalog.append_updates(
        "a", [NewUpdate(3, changes(range(9, 10)), None, None, content_digest(changes(range(9, 10))))]
    )
    assert [e.seq for e in catalog.log_range("a", 0, 3, 10)] == [1, 2]
    assert [e.seq for e in catalog.log_range("a", 2, 3, 10)] == [3]

    # pruned, its parts go with it
    pruned = catalog.prune(PruneReach({"a": 2}), before=float("inf"), most=10, keep_units=0)
    assert pruned.entries == 2 and log_parts(catalog.engine) == 0


def test_what_a_source_stages_is_one_update_and_never_left_behind(catalog: Catalog) -> None:
    catalog.stage_part("a", StagedPart(1, 0, changes(range(2)), None, None))
    catalog.stage_part("a", StagedPart(1, 1, changes(range(2, 4)), None, None))
    catalog.stage_part("a", StagedPart(1, 0, changes(range(1)), None, None))  # part 0: afresh
    assert staged_rows(catalog.engine) == [("a", 1, 0, 1)]
    catalog.stage_part("a", StagedPart(2, 0, changes(range(3)), None, None))  # another seq's part 0
    assert staged_rows(catalog.engine) == [("a", 2, 0, 3)]
    whole = changes(range(5))
    catalog.append_updates("a", [NewUpdate(2, whole, None, None, content_digest(whole))])  # logged whole meanwhile
    assert staged_rows(catalog.engine) == []
    catalog.stage_part("a", StagedPart(3, 0, changes(range(3)), None, None))
    catalog.append_updates("a", [NewUpdate(3, whole, None, None, content_digest(whole))])
    with pytest.raises(SeqConflict):  # seq 3 was logged meanwhile, with other content
        catalog.log_staged("a", StagedPart(3, 1, changes(range(3, 4)), None, None), content_digest(changes(range(4))))
    assert staged_rows(catalog.engine) == []
    catalog.stage_part("a", StagedPart(4, 0, changes(range(3)), None, None))
    catalog.remove_source("a")
    assert staged_rows(catalog.engine) == []
