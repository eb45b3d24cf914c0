"""The request and response bodies of the manager's API, with the examples its docs show."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from contract.schemas import CAPTURE_METHODS, WRAPPER_URL_PATTERN, AnyValue, wrapper_url_problem
from warehouse.protocol import DEFAULT_BATCH_SIZE

NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class ErrorOut(BaseModel):
    detail: str = Field(description="what is wrong, for a person")
    errors: list[dict[str, Any]] | None = Field(default=None, description="validation errors: loc, msg, type")


class SourceIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "shop",
                    "wrapper_url": "http://127.0.0.1:8101",
                    "tables": ["orders"],
                    "manager_token": "…the wrapper's --manager-token…",
                }
            ]
        },
    )
    name: str = Field(min_length=1, max_length=64, pattern=NAME, examples=["shop"])
    wrapper_url: str = Field(
        min_length=8,
        max_length=500,
        pattern=WRAPPER_URL_PATTERN,
        description="the wrapper's HTTP address (`pvm wrapper run --port`), not the source database's URL",
        examples=["http://127.0.0.1:8101"],
    )
    capture: Literal[CAPTURE_METHODS] = Field(  # type: ignore[valid-type]
        default="trigger",
        description="the wrapper's capture method; refused (422) if the wrapper reports another one in its health",
        examples=["trigger"],
    )
    tables: list[str] | None = Field(
        default=None,
        max_length=1000,
        description="tables to use (default: every captured table)",
        examples=[["orders"]],
    )
    manager_token: str | None = Field(
        default=None,
        min_length=16,
        max_length=300,
        description="the secret the wrapper was started with (`--manager-token`, `PVM_MANAGER_TOKEN`); the manager "
        "sends it with every request to the wrapper. Omit it only for a wrapper that runs without one.",
    )

    @field_validator("wrapper_url", mode="before")
    @classmethod
    def _wrapper_address(cls, value: Any) -> Any:
        """Runs before the pattern (which stays in the schema for clients): a bare host:port or
        a database URL is refused saying what goes where, as ``pvm source add`` does, instead of
        quoting the pattern."""
        problem = wrapper_url_problem(value, "wrapper_url") if isinstance(value, str) else None
        if problem is not None:
            raise PydanticCustomError("wrapper_url", problem)
        return value


class WrapperHealth(BaseModel):
    reachable: bool
    error: str | None = None
    last_seq: int | None = Field(default=None, description="the last seq the wrapper assigned")
    acked_through: int | None = None
    pending: int | None = Field(default=None, description="captured updates not acknowledged yet")
    ok: bool | None = Field(default=None, description="the wrapper's own verdict: false while its capture is blocked")
    blocked: dict[str, Any] | None = Field(
        default=None, description="capture keeps failing: the error, since when (unix time)"
    )
    shipping_error: dict[str, Any] | None = Field(
        default=None,
        description="the wrapper's posts of updates keep failing: the last error, its HTTP status, since when "
        "(unix time), how many tries",
    )
    quarantine: dict[str, Any] | None = Field(
        default=None,
        description="captured rows left out because the views cannot take them: count, per relation, last reason",
    )
    held: dict[str, Any] | None = Field(
        default=None,
        description="changes the wrapper holds in memory while it captures and ships updates (now, and the most "
        "since it started), and its part limits",
    )


class UnfinishedUpdate(BaseModel):
    """The parts received so far of an update larger than one message (docs/api.md)."""

    seq: int
    parts: int
    changes: int


class SourceOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "shop",
                    "wrapper_url": "http://127.0.0.1:8101",
                    "capture": "trigger",
                    "relations": {"orders": ["id", "customer_id", "product_id", "qty"]},
                    "last_seq": 412,
                    "held": 0,
                    "health": {"reachable": True, "last_seq": 412, "acked_through": 412, "pending": 0},
                }
            ]
        }
    )
    name: str
    wrapper_url: str
    capture: str
    relations: dict[str, list[str]] = Field(description="captured tables and their columns")
    last_seq: int = Field(description="every update of the source with seq <= last_seq is received and durable")
    held: int = Field(
        default=0, description="updates received above a gap in seq: durable, released once the gap is filled"
    )
    waiting_for_seq: int | None = Field(default=None, description="while updates are held: the first missing seq")
    held_through: int | None = Field(default=None, description="while updates are held: the highest seq held")
    unfinished: UnfinishedUpdate | None = Field(
        default=None, description="an update whose parts are arriving: in memory until its last part"
    )
    health: WrapperHealth | None = Field(default=None, description="the wrapper's own report (shown for one source)")


class ViewIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "sql": "CREATE VIEW big_orders AS SELECT o.id, c.name, o.qty FROM shop.orders o, crm.customers c "
                    "WHERE o.customer_id = c.id AND o.qty > 3",
                    "parallelism": 4,
                    "commit_mode": "out_of_order",
                }
            ]
        },
    )
    sql: str = Field(
        min_length=1,
        max_length=100_000,
        description="`[CREATE VIEW name AS] SELECT … FROM src.table [alias], … WHERE …` (select-project-join)",
        examples=["SELECT o.id, c.name FROM shop.orders o, crm.customers c WHERE o.customer_id = c.id"],
    )
    name: str | None = Field(default=None, max_length=64, pattern=NAME, examples=["order_customers"])
    parallelism: int = Field(default=4, ge=1, le=256, description="PPU size p; 1 is SWEEP")
    batch_size: int = Field(
        default=DEFAULT_BATCH_SIZE,
        ge=1,
        le=10_000,
        description="at most this many queued updates of one source per unit. Below it the unit size is adaptive: one "
        "update per unit while a free PPU slot's share of the queue is below the source's measured crossover point, "
        "that share (maintained set-oriented) above it; 1 maintains one update per unit",
    )
    commit_mode: Literal["out_of_order", "arrival"] = Field(
        default="out_of_order",
        description="`out_of_order` (PVM) or `arrival` (PVM-CC: raw tables hold legal states only)",
    )


class ViewCountersOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    updates_received: int
    units_started: int
    units_maintained: int
    units_committed: int
    subqueries: int
    compensations: int
    compensations_from_log: int = Field(
        description="of the compensations, spilled queued updates read from the update log"
    )
    updates_read_back: int = Field(description="spilled queued updates read back into memory as maintenance caught up")
    unit_parts: int = Field(
        default=0, description="parts of large units swept and stored one at a time (docs/protocol.md, Units in parts)"
    )
    commit_groups: int
    peak_running: int
    retries: int = Field(description="steps repeated after a transient fault")


class BatchingOut(BaseModel):
    c1_s: float | None = Field(description="mean time to maintain a unit of one update of this source (C1)")
    set_fixed_s: float | None = Field(
        description="a set's cost line: its fixed part (null until sets of two sizes ran)"
    )
    set_per_update_s: float | None = Field(description="a set's cost line: its part per update")
    crossover: float | None = Field(
        description="Park's crossover point (eq. 4.3): queued updates per free PPU slot above which a unit takes a set; "
        "1 until measured, null when sets cost more per update than single units (none are made)"
    )


class RetryOut(BaseModel):
    steps: int = Field(description="steps being retried now: units (each keeps its PPU slot), the commit, a publish")
    attempts: int = Field(description="failed attempts of the step retried longest")
    error: str = Field(description="the latest error")
    since: float = Field(description="when the first of these faults happened (Unix time)")


class LoadOut(BaseModel):
    phase: str = Field(description="staging (the sources stream their relations) or joining (the engine's job)")
    relations: int = Field(description="relations of the view")
    relations_staged: int = Field(description="relations staged whole")
    rows_staged: int = Field(description="rows received so far, all relations")
    rows_expected: int | None = Field(
        default=None, description="the sources' estimates of their relations' rows, summed (null: not all sent one)"
    )
    percent: float = Field(
        description="of the staging: rows staged against rows_expected when known (below 100 until every "
        "relation is staged), else relations staged; 100 while joining"
    )
    eta_seconds: float | None = Field(
        default=None, description="seconds the staging should still take at the rate so far (null: unknown)"
    )
    seconds: float = Field(description="since the load started")


VIEW_EXAMPLE: dict[str, Any] = {
    "name": "big_orders",
    "state": "active",
    "error": None,
    "sql": "CREATE VIEW big_orders AS SELECT o.id, c.name, o.qty FROM shop.orders o, crm.customers c WHERE o.customer_id = c.id AND o.qty > 3",
    "parallelism": 4,
    "batch_size": 1000,
    "commit_mode": "out_of_order",
    "watermark": 318,
    "paused": False,
    "idle": False,
    "retrying": None,
    "load": None,
    "stalled": False,
    "no_progress_seconds": 0.12,
    "updates_queued": 3,
    "updates_spilled": 0,
    "queued_changes": 3,
    "units_running": 4,
    "units_waiting": 0,
    "units_retained": 1,
    "updates_pending": 7,
    "lag_updates": 9,
    "lag_seconds": 0.42,
    "batching": {
        "shop": {"c1_s": 0.021, "set_fixed_s": 0.024, "set_per_update_s": 0.0008, "crossover": 1.188},
        "crm": {"c1_s": 0.018, "set_fixed_s": None, "set_per_update_s": None, "crossover": 1.0},
    },
    "row_count": 1840,
    "row_count_as_of": 318,
    "counters": {
        "updates_received": 326,
        "units_started": 322,
        "units_maintained": 319,
        "units_committed": 318,
        "subqueries": 611,
        "compensations": 57,
        "compensations_from_log": 0,
        "updates_read_back": 0,
        "unit_parts": 0,
        "commit_groups": 240,
        "peak_running": 4,
        "retries": 0,
    },
}


class ViewOut(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [VIEW_EXAMPLE]})
    name: str
    state: str = Field(
        description="initializing (initial load running), active, or failed: a fault that needs a person (a source "
        "refusing subqueries, e.g. its schema no longer matches; a value the store cannot hold; a bug). Fix the cause, "
        "then resume the view. Transient faults do not fail a view: see `retrying`"
    )
    error: str | None = Field(description="why the view failed")
    sql: str
    parallelism: int
    batch_size: int
    commit_mode: str
    watermark: int = Field(description="visibility watermark W: reads default to the view as of W")
    frontier: dict[str, list[int]] | None = Field(
        default=None,
        description="per source, the seqs [lo, hi] the view as of W shows the source at: lo is the last of its "
        "updates maintained at or below W, and the updates after it up to hi change nothing the view reads "
        "(docs/protocol.md, 'Consistent reads across views'); null while the initial load runs",
    )
    paused: bool
    idle: bool
    retrying: RetryOut | None = Field(
        description="steps retried after a transient fault (a source unreachable past its client's retries, the store "
        "or the catalog failing), with backoff for as long as the fault lasts; null when none is"
    )
    load: LoadOut | None = Field(
        default=None,
        description="the initial load running in the store's engine (Spark): relation snapshots staged, then "
        "joined; null when none runs",
    )
    stalled: bool = Field(
        description="the watchdog: work pending and no progress for the manager's limit (60 s by default)"
    )
    no_progress_seconds: float = Field(
        description="how long the view has had work pending with no unit started, maintained or committed; 0 when it has "
        "none, or is paused or failed"
    )
    updates_queued: int = Field(
        description="updates received and in no unit yet (a paused or failed view keeps them in the catalog only)"
    )
    updates_spilled: int = Field(
        default=0,
        description="of the queued updates, those kept in the update log only: past the view's queue budget "
        "(`pvm serve --max-queued-changes`), or held by a paused or failed view; read back as maintenance catches up",
    )
    queued_changes: int = Field(
        default=0, description="changes (delta rows) of the queued updates held in memory: what the queue budget bounds"
    )
    units_running: int = Field(description="units in the PPU (its occupancy)")
    units_waiting: int = Field(
        description="numbered units waiting for a PPU slot: recovered after a restart, or stopped by a fault until resume"
    )
    units_retained: int = Field(description="units in the RPU")
    updates_pending: int = Field(description="updates queued or being maintained")
    lag_updates: int = Field(description="updates received but not visible at W yet")
    lag_seconds: float = Field(
        description="age of the oldest update not visible at W: received, but in no unit committed at or below W "
        "(queued, being maintained, or maintained above W); 0 when every received update is visible"
    )
    batching: dict[str, BatchingOut] = Field(
        default_factory=dict,
        description="per source, what its units cost (running means) and the unit size they imply (docs/protocol.md)",
    )
    row_count: int | None = Field(
        description="rows of the view as of row_count_as_of (W; a slow store recounts every few seconds)"
    )
    row_count_as_of: int | None
    counters: ViewCountersOut = Field(
        description="running totals since the manager started: like Prometheus counters, they restart from zero "
        "when the manager restarts"
    )


class CutOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"orders": {"order_details": 312, "revenue": 97}, "seqs": {"shop": 4410}}]}
    )

    orders: dict[str, int] = Field(
        description="per view, the order to read it as of (`GET /v1/views/{name}/rows?as_of=`): at most its W"
    )
    seqs: dict[str, int] = Field(description="per source, the seq whose state every view shows at its order")


class RowsOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "view": "big_orders",
                    "columns": ["id", "name", "qty"],
                    "watermark": 318,
                    "as_of": 318,
                    "total": 1840,
                    "offset": 0,
                    "rows": [[7, "customer-3", 4], [9, "customer-12", 5]],
                }
            ]
        }
    )
    view: str
    columns: list[str]
    watermark: int
    as_of: int | None = Field(description="the order the rows are as of; null for a latest read")
    total: int = Field(description="rows in the view (a row with weight n counts n times)")
    offset: int
    rows: list[list[AnyValue]] = Field(description='non-finite floats as {"$float": "NaN" | "Infinity" | "-Infinity"}')


class HealthOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"ok": True, "starting": False, "sources": 3, "views": 1, "problems": []},
                {"ok": True, "starting": True, "sources": 0, "views": 0, "problems": []},
            ]
        }
    )
    ok: bool
    starting: bool = Field(default=False, description="the view store and the manager are still starting")
    sources: int
    views: int
    problems: list[str] = Field(
        default_factory=list,
        description="what needs attention, one sentence each: the view store not answering, views failed, retrying or stalled",
    )


class ReadyOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"ready": True, "catalog": "ok", "store": "ok", "views": {"active": 2, "initializing": 1}}]
        }
    )
    ready: bool
    catalog: str
    store: str = Field(default="ok", description="the view store answers")
    views: dict[str, int] = Field(description="how many views are in each state (initializing, active, failed)")
    sources: list[str] = Field(
        default_factory=list,
        description="sources whose wrapper does not answer or whose capture is blocked: reported, but they do not "
        "make the manager unready (their views stay readable as of W; the fix is at the source)",
    )


class TokenIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"role": "wrapper", "source": "shop", "name": "shop wrapper on db-host-1"},
                {"role": "analyst", "name": "bi team"},
            ]
        },
    )
    role: Literal["admin", "analyst", "wrapper"]
    source: str | None = Field(default=None, max_length=64, pattern=NAME, description="for a wrapper token: its source")
    name: str | None = Field(default=None, max_length=200, description="a label to recognize the token by")


class TokenOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 3,
                    "role": "wrapper",
                    "source": "shop",
                    "name": "wrapper of shop",
                    "created_at": 1764400000.0,
                    "revoked_at": None,
                }
            ]
        }
    )
    id: int
    role: str
    source: str | None
    name: str
    created_at: float
    revoked_at: float | None


class TokenCreated(TokenOut):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 3,
                    "role": "wrapper",
                    "source": "shop",
                    "name": "wrapper of shop",
                    "created_at": 1764400000.0,
                    "revoked_at": None,
                    "token": "pvm_3_2mJ4b8x-Qv3…",
                }
            ]
        }
    )
    token: str = Field(description="the bearer token; shown only now")
