"""SQLAlchemy models of the catalog. The schema is created and evolved by Alembic
(``migrations/``); these models must match the newest migration."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Double, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


# Times are seconds since the epoch, in ``Double``: a bare ``Float`` is single precision on
# MariaDB and MySQL, 128 s apart at today's epoch (migration 0006).


class SourceRow(Base):
    __tablename__ = "sources"
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    wrapper_url: Mapped[str] = mapped_column(String(500))
    capture: Mapped[str] = mapped_column(String(50), default="trigger")
    created_at: Mapped[float] = mapped_column(Double)
    # the token sent to the wrapper, sealed with the catalog's key file (warehouse.catalog.secrets)
    sealed_manager_token: Mapped[str | None] = mapped_column(Text, nullable=True)
    # every logged update with seq <= it was pruned (a resend of one is a duplicate)
    pruned_through: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class RelationRow(Base):
    __tablename__ = "relations"
    source: Mapped[str] = mapped_column(ForeignKey("sources.name", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    columns: Mapped[list[str]] = mapped_column(JSON)
    types: Mapped[list[str]] = mapped_column(JSON)
    primary_key: Mapped[list[str]] = mapped_column(JSON)


class ViewRow(Base):
    __tablename__ = "views"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    sql: Mapped[str] = mapped_column(Text)
    parallelism: Mapped[int] = mapped_column(Integer)
    batch_size: Mapped[int] = mapped_column(Integer, default=1)
    commit_mode: Mapped[str] = mapped_column(String(20))
    state: Mapped[str] = mapped_column(String(20))
    bases: Mapped[dict[str, int]] = mapped_column(JSON)  # source -> last seq before the view
    watermark: Mapped[int] = mapped_column(BigInteger, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Double)
    # unit records through folded_order were pruned; the view as of it reflects folded_seqs
    folded_order: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    folded_seqs: Mapped[dict[str, int] | None] = mapped_column(JSON, nullable=True)


class LogRow(Base):
    """The durable update message queue: every accepted source update, once."""

    __tablename__ = "update_log"
    __table_args__ = (UniqueConstraint("source", "seq", name="uq_update_log_source_seq"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(100), index=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    changes: Mapped[list[Any]] = mapped_column(JSON)
    txid: Mapped[str | None] = mapped_column(String(100), nullable=True)
    captured_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    received_at: Mapped[float] = mapped_column(Double)
    digest: Mapped[str | None] = mapped_column(String(64), nullable=True)  # of the changes; None: logged before 0003
    # 0: ``changes`` holds the update; n: it was logged from n parts, its changes are in
    # ``update_log_parts`` (``changes`` is empty)
    parts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class LogPartRow(Base):
    """One part of an update logged from its parts (``LogRow.parts``), in part order."""

    __tablename__ = "update_log_parts"
    log_id: Mapped[int] = mapped_column(ForeignKey("update_log.id", ondelete="CASCADE"), primary_key=True)
    part: Mapped[int] = mapped_column(Integer, primary_key=True)
    changes: Mapped[list[Any]] = mapped_column(JSON)


class StagedPartRow(Base):
    """A part of an update whose last part has not arrived yet: checked, durable, not logged.
    A source stages one update at a time (its part 0 drops whatever the source staged)."""

    __tablename__ = "staged_parts"
    source: Mapped[str] = mapped_column(String(100), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    part: Mapped[int] = mapped_column(Integer, primary_key=True)
    txid: Mapped[str | None] = mapped_column(String(100), nullable=True)
    captured_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    changes: Mapped[list[Any]] = mapped_column(JSON)
    count: Mapped[int] = mapped_column(Integer)  # how many changes the part carries


class UnitRow(Base):
    """A maintenance unit of a view: its order number and the log entries it maintains."""

    __tablename__ = "units"
    view: Mapped[str] = mapped_column(ForeignKey("views.name", ondelete="CASCADE"), primary_key=True)
    order_no: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    log_ids: Mapped[list[int]] = mapped_column(JSON)  # empty list: the initial load
    committed: Mapped[bool] = mapped_column(default=False)
    started_at: Mapped[float] = mapped_column(Double)
    committed_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    # the seqs the unit holds: one source's, first to last (None: the initial load)
    source: Mapped[str | None] = mapped_column(String(100), nullable=True)
    first_seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class StoreTableRow(Base):
    """Where a view store keeps a view (table locations, compaction state)."""

    __tablename__ = "store_tables"
    view: Mapped[str] = mapped_column(String(64), primary_key=True)
    record: Mapped[dict[str, Any]] = mapped_column(JSON)


class TokenRow(Base):
    """A bearer token of the API: its role, the source a wrapper token is bound to, and a
    salted hash of its secret (``api.auth``); revoked tokens stay listed."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    role: Mapped[str] = mapped_column(String(20))
    source: Mapped[str | None] = mapped_column(String(100), nullable=True)
    name: Mapped[str] = mapped_column(String(200))
    hash: Mapped[str] = mapped_column(String(300))
    created_at: Mapped[float] = mapped_column(Double)
    revoked_at: Mapped[float | None] = mapped_column(Double, nullable=True)
