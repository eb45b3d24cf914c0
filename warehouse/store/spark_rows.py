"""Rows of Python values to the Arrow tables the Spark store writes, and back.

Typed view columns are stored in their Spark type; untyped ones as JSON text, so that reads
return exactly what was committed. The Arrow types are Spark's own for each column
(``to_arrow_type``), and a commit's Arrow table becomes the Parquet file Spark reads
(``spark_files.append_file``): only types whose Parquet form Spark reads back as the very
values written are accepted (``STORED_TYPES``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import (
    AtomicType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from contract.schemas import NAN, loads_wire_json
from contract.zset import Row
from warehouse.store.base import Effect, StoreError, Summed
from warehouse.store.spark_names import ORDER, WEIGHT

__all__ = ["STORED_TYPES", "RowCodec", "parse_type", "shown_codec", "table_schemas"]

STORED_TYPES: tuple[type[AtomicType], ...] = (
    BooleanType,
    ByteType,
    ShortType,
    IntegerType,
    LongType,
    FloatType,
    DoubleType,
    DecimalType,
    StringType,
    BinaryType,
    DateType,
    TimestampType,
    TimestampNTZType,
    DayTimeIntervalType,
)
"""The Spark types a view column may have: the store writes their values into Parquet itself
and Spark reads them back unchanged (``tests/spark/test_direct_append.py`` checks each).
Not among them: CHAR/VARCHAR and year-month intervals (no Arrow type), TIME (no Spark
table can hold it), VARIANT and the geospatial types (no Python value to commit)."""


class _Shaped(Protocol):
    """A view's record as far as its rows' shape goes (``spark_records.ViewMeta``)."""

    @property
    def columns(self) -> tuple[str, ...]: ...

    @property
    def types(self) -> tuple[str | None, ...] | None: ...

    @property
    def summed(self) -> Summed | None: ...


def _json_float(value: float) -> str:
    return float.__repr__(value) if math.isfinite(value) else json.dumps(value)


# What json.dumps(value, ensure_ascii=False) returns for the common exact types, without its
# per-call overhead (it dominated the cost of a grouped commit).
_JSON_ENCODERS: dict[type, Callable[[Any], str]] = {
    str: json.encoder.encode_basestring,
    int: int.__repr__,
    bool: lambda value: "true" if value else "false",
    float: _json_float,
}


def _json_scalar(value: Any) -> str | None:
    encode = _JSON_ENCODERS.get(type(value))
    if encode is not None:
        return encode(value)
    if value is None:
        return None
    if isinstance(value, (str, int, float)):  # subclasses
        return json.dumps(value, ensure_ascii=False)
    raise StoreError(f"cannot store {value!r} in an untyped column; give the view column types")


class RowCodec:
    """Rows of Python scalars to Arrow columns and back, so reads return what was committed.

    Typed columns are stored in their Spark type. Untyped columns (known by name only) store
    JSON text, which keeps 1, 1.0, "1" and True apart and round-trips them.
    """

    def __init__(self, columns: tuple[str, ...], types: tuple[str | None, ...] | None) -> None:
        self.columns = columns
        self.json_columns = [True] * len(columns) if types is None else [t is None for t in types]
        self.json = all(self.json_columns)
        spark_types = [StringType() if t is None else parse_type(t) for t in (types or (None,) * len(columns))]
        self._bool_columns = [isinstance(t, BooleanType) for t in spark_types]
        # every NaN read back is the one object Z-sets can cancel (contract.schemas.NAN)
        self._float_columns = [isinstance(t, (DoubleType, FloatType)) for t in spark_types]
        view_fields = [StructField(c, t) for c, t in zip(columns, spark_types)]
        self.base_schema = StructType([*view_fields, StructField(WEIGHT, LongType())])
        self.zlog_schema = StructType([*self.base_schema.fields, StructField(ORDER, LongType())])
        self._arrow_schema = pa.schema(
            [pa.field(f.name, to_arrow_type(f.dataType, timezone="UTC")) for f in self.zlog_schema]
        )

    def effects_table(self, effects: Sequence[Effect]) -> pa.Table:
        """The z-log rows of a group. An empty effect becomes one all-NULL row of weight 0,
        which sums to nothing but leaves the order in the z-log as committed."""
        rows: list[Row] = []
        weights: list[int] = []
        orders: list[int] = []
        empty = (None,) * len(self.columns)
        for effect in effects:
            if effect.delta.is_empty():
                rows.append(empty)
                weights.append(0)
                orders.append(effect.order)
            for row, weight in effect.delta.items():
                if len(row) != len(self.columns):
                    raise StoreError(f"row {row!r} does not have {len(self.columns)} columns")
                rows.append(row)
                weights.append(weight)
                orders.append(effect.order)
        values: list[Sequence[Any]] = list(zip(*rows))
        values = [
            [_json_scalar(v) for v in column] if as_json else [_as_bool(v) for v in column] if as_bool else column
            for column, as_json, as_bool in zip(values, self.json_columns, self._bool_columns)
        ]
        try:
            arrays = [pa.array(v, type=f.type) for v, f in zip(values, self._arrow_schema)]
            arrays += [pa.array(weights, pa.int64()), pa.array(orders, pa.int64())]
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as e:
            raise StoreError(f"values do not fit the view's column types: {e}") from e
        return pa.Table.from_arrays(arrays, schema=self._arrow_schema)

    def decode(self, table: pa.Table) -> Iterator[Row]:
        """Rows of a result whose first columns are the view's columns."""
        columns = [table.column(i).to_pylist() for i in range(len(self.columns))]
        columns = [
            [None if v is None else loads_wire_json(v) for v in c]
            if as_json
            else [NAN if v != v else v for v in c]
            if as_float
            else c
            for c, as_json, as_float in zip(columns, self.json_columns, self._float_columns)
        ]
        return zip(*columns)

    def decode_weighted(self, table: pa.Table) -> Iterator[tuple[Row, int]]:
        return zip(self.decode(table), table.column(WEIGHT).to_pylist())


def _as_bool(value: Any) -> Any:
    """Sources without a boolean type (SQLite, MySQL) hand out 0 and 1 for BOOLEAN columns."""
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    return value


def parse_type(type_name: str) -> DataType:
    try:
        parsed = DataType.fromDDL(type_name)
    except Exception as e:
        raise StoreError(f"unknown Spark SQL type {type_name!r}") from e
    if not isinstance(parsed, AtomicType):
        raise StoreError(f"column type {type_name!r} is not a scalar type")
    if not isinstance(parsed, STORED_TYPES):
        raise StoreError(
            f"column type {type_name!r} is not one the store holds: booleans, integers, floating-point "
            "and decimal numbers, strings, binary, dates, timestamps and day-time intervals"
        )
    return parsed


def table_schemas(columns: Sequence[str], types: Sequence[str | None] | None) -> tuple[StructType, StructType]:
    """The Spark schemas of a view's base and z-log tables."""
    codec = RowCodec(tuple(columns), None if types is None else tuple(types))
    return codec.base_schema, codec.zlog_schema


def shown_codec(meta: _Shaped, stored: RowCodec | None = None) -> RowCodec:
    """The codec of the rows readers see: the stored rows' (``stored`` if given), or an
    aggregate view's own columns."""
    if meta.summed is None:
        return stored or RowCodec(meta.columns, meta.types)
    return RowCodec(meta.summed.columns, meta.summed.types)
