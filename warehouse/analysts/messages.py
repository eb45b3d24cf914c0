"""What the manager and the analysts' query process say to each other (HTTP over a Unix
socket in the data directory, JSON bodies)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from contract.schemas import AnyValue


class PinnedView(BaseModel):
    """A view read as of ``as_of`` from the files ``record`` names, not as published."""

    record: dict[str, Any]
    as_of: int


class Published(BaseModel):
    """Store records to show: a view's record (``ViewMeta.to_record()``) or None when the
    view was dropped. ``reset``: these are all the views; drop any other. ``consistent``: a
    consistent cut over every view that has one, to show in the consistent database in place
    of the one shown (``PublishedViews.show_consistent``); None: it did not change."""

    views: dict[str, dict[str, Any] | None]
    reset: bool = False
    consistent: dict[str, PinnedView] | None = None


class QueryRequest(BaseModel):
    sql: str = Field(description="checked Spark SQL over the views")
    limit: int = Field(ge=1)
    views: dict[str, PinnedView] = Field(
        default_factory=dict,
        description="views the query reads at these orders (a consistent cut) instead of as published",
    )
    tag: str = Field(description="the job tag the query runs under, for cancellation")
    max_bytes: int = Field(ge=1, description="rows beyond this size of the answer are cut (truncated)")


class QueryResult(BaseModel):
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool


class RowsRequest(BaseModel):
    """A page of one view's rows as of ``as_of`` (None: every committed effect), read from
    the files ``record`` names, sorted by every column."""

    record: dict[str, Any]
    as_of: int | None
    offset: int = Field(ge=0)
    limit: int = Field(ge=0, description="0: the total only")
    tag: str
    max_bytes: int = Field(ge=1)


class RowsResult(BaseModel):
    columns: list[str]
    rows: list[list[Any]]
    total: int = Field(description="rows in the view (a row of weight n counts n times)")
    truncated: bool = Field(default=False, description="the page was cut at max_bytes")


class VerifyRelation(BaseModel):
    """One relation of a view in the state the view claims to reflect (``warehouse/verify.py``
    brings it there), as a temporary view of the recomputation."""

    name: str = Field(description="the temporary view the view's SELECT reads it as")
    label: str = Field(description="source.table, for notes")
    columns: list[str]
    rows: list[list[AnyValue]] = Field(description="the row's values, then its weight")


class VerifyRequest(BaseModel):
    """Recompute a view from its relations and compare it with the view as of ``as_of``,
    read from the files ``record`` names: the query process does both, so the stored view
    is never read under the store's lock, nor whole into the manager."""

    record: dict[str, Any]
    as_of: int = Field(ge=0, description="the view's watermark W the relations were brought to")
    sql: str = Field(
        description="the view's SELECT over the relations' temporary views, in Spark SQL; with staged, the "
        "view's stored rows then _w, computed from the relations' staged files (engine_load.load_sql)"
    )
    relations: list[VerifyRelation]
    staged: bool = Field(default=False, description="the relations are files sql reads, not rows of this message")
    max_differences: int = Field(ge=0, description="rows listed at most, per kind")
    tag: str = ""


class VerifyResult(BaseModel):
    expected_rows: int = Field(description="rows of the recomputation (with multiplicities)")
    stored_rows: int = Field(description="positive rows of the stored view as of W (with multiplicities)")
    missing: list[tuple[list[AnyValue], int]] = Field(description="in the recomputation, not (as often) stored")
    extra: list[tuple[list[AnyValue], int]] = Field(description="stored, not (as often) in the recomputation")
    missing_total: int
    extra_total: int
    notes: list[str] = Field(default_factory=list)


class Cancel(BaseModel):
    tag: str


class WorkerHealth(BaseModel):
    ready: bool
    running: list[str] = Field(description="tags of the queries running now")
    zombie_tasks: int = Field(default=0, description="tasks of cancelled jobs still running")
    views: int
    connect_port: int | None = None
