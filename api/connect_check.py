"""What an analyst's Spark Connect request may ask for: the role model of ``/v1/query``,
applied to Spark Connect's plans (protobuf messages of ``pyspark.sql.connect.proto``).

An analyst reads views; nothing else. Every message of a request's plan is checked against
an allow-list of message types, so a kind of request Spark adds later is refused until
someone allows it here:

* relations: reading a view by name (``spark.table("v")``, or ``spark.table("pvm_consistent.v")``
  for the view at the cut over all views), SQL that ``check_query`` accepts
  (and what runs is the SQL it regenerates), and the DataFrame operators over them: project,
  filter, join, aggregate, sort, limit, set operations, sample, statistics, ``show``, … Reading
  files or other data sources, hints, Python or Scala code (UDFs, UDTFs, ``mapInPandas``,
  ``applyInPandas``), cached or checkpointed relations and ML are refused;
* expressions: columns, literals, casts, aliases, windows, lambdas, and functions of
  ``ALLOWED_FUNCTIONS`` (the REST allow-list) or Connect's operators; SQL expression strings
  (``selectExpr``, ``F.expr``, ``filter("…")``) pass the same check as a query's SELECT list;
* commands: ``spark.sql(…)`` of a checked query only: no writes, no DDL, no temporary views,
  no streaming, no registering functions or data sources;
* catalog calls that only read (list databases, tables, columns, functions; exists; current
  database);
* ``AnalyzePlan`` (schema, explain, …) of an allowed plan, but not persist/unpersist.

``check_execute``, ``check_analyze`` and ``check_config`` raise ``Refused`` naming what is not
allowed; ``check_execute`` and ``check_analyze`` rewrite the SQL they check in place.

>>> from pyspark.sql.connect.proto import base_pb2
>>> plan = base_pb2.Plan()
>>> plan.root.sql.query = "select id from v"
>>> check_plan(plan, ["v"])
>>> plan.root.sql.query
'SELECT id FROM v'
>>> plan.root.read.data_source.format = "text"
>>> check_plan(plan, ["v"])
Traceback (most recent call last):
...
api.connect_check.Refused: reading data sources or files (Read.DataSource) is not allowed: analysts read views
>>> plan.root.read.named_table.unparsed_identifier = "pvm_consistent.v"  # v at the cut over all views
>>> check_plan(plan, ["v"])
>>> plan.root.read.named_table.unparsed_identifier = "pvm_consistent.__pvm_state"
>>> check_plan(plan, ["v"])
Traceback (most recent call last):
...
api.connect_check.Refused: unknown view 'pvm_consistent.__pvm_state': analysts may read only views (v)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterator

import sqlglot
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from pyspark.sql.connect.proto import base_pb2
from sqlglot import exp
from sqlglot.errors import SqlglotError

from api.analyst import ALLOWED_FUNCTIONS, QueryRejected, check_query
from warehouse.store.base import CONSISTENT_DB


class Refused(Exception):
    """A Connect request outside what analysts may do; the message says what."""


# The operators Spark Connect's DataFrame API sends as function calls (Column.__eq__ is "==",
# & is "and", …): the same operations the SQL check allows as syntax.
OPERATORS = frozenset(
    [
        "==",
        "<=>",
        "<",
        "<=",
        ">",
        ">=",
        "!=",
        "!",
        "+",
        "-",
        "*",
        "/",
        "%",
        "&",
        "|",
        "^",
        "~",
        "and",
        "or",
        "not",
        "negative",
        "isnull",
        "isnotnull",
        "isnan",
        "in",
        "like",
        "ilike",
        "rlike",
        "startswith",
        "endswith",
        "contains",
        "substr",
        "when",
        "otherwise",
        "between",
        "try_add",
        "try_subtract",
        "try_multiply",
        "try_divide",
        "bitwise_not",
        "eqnullsafe",
    ]
)

_PREFIX = "spark.connect."

# Message types an analyst's plan may contain, besides literals and data types (any).
_ALLOWED = frozenset(
    _PREFIX + name
    for name in [
        "Plan",
        "Relation",
        "RelationCommon",
        "Origin",
        "PythonOrigin",
        "JvmOrigin",
        "StackTraceElement",
        "Read",
        "Read.NamedTable",
        "Project",
        "Filter",
        "Join",
        "Join.JoinDataType",
        "SetOperation",
        "Sort",
        "Limit",
        "Offset",
        "Tail",
        "Aggregate",
        "Aggregate.Pivot",
        "Aggregate.GroupingSets",
        "SQL",
        "LocalRelation",
        "Sample",
        "Deduplicate",
        "Range",
        "SubqueryAlias",
        "Repartition",
        "RepartitionByExpression",
        "ToDF",
        "WithColumnsRenamed",
        "WithColumnsRenamed.Rename",
        "ShowString",
        "HtmlString",
        "Drop",
        "WithColumns",
        "Unpivot",
        "Unpivot.Values",
        "ToSchema",
        "NAFill",
        "NADrop",
        "NAReplace",
        "NAReplace.Replacement",
        "StatSummary",
        "StatDescribe",
        "StatCrosstab",
        "StatCov",
        "StatCorr",
        "StatApproxQuantile",
        "StatFreqItems",
        "StatSampleBy",
        "StatSampleBy.Fraction",
        "WithRelations",
        "AsOfJoin",
        "LateralJoin",
        "Transpose",
        "Expression",
        "Expression.UnresolvedAttribute",
        "Expression.UnresolvedFunction",
        "Expression.ExpressionString",
        "Expression.UnresolvedStar",
        "Expression.Alias",
        "Expression.Cast",
        "Expression.UnresolvedRegex",
        "Expression.SortOrder",
        "Expression.LambdaFunction",
        "Expression.Window",
        "Expression.Window.WindowFrame",
        "Expression.Window.WindowFrame.FrameBoundary",
        "Expression.UnresolvedExtractValue",
        "Expression.UpdateFields",
        "Expression.UnresolvedNamedLambdaVariable",
        "ExpressionCommon",
        "CallFunction",
        "NamedArgumentExpression",
        "SubqueryExpression",
        "SubqueryExpression.TableArgOptions",
        "Command",
        "SqlCommand",
        "Catalog",
        "CurrentDatabase",
        "ListDatabases",
        "ListTables",
        "ListFunctions",
        "ListColumns",
        "GetDatabase",
        "GetTable",
        "GetFunction",
        "DatabaseExists",
        "TableExists",
        "FunctionExists",
        "CurrentCatalog",
        "ListCatalogs",
        "ListViews",
    ]
)

_ALWAYS = (_PREFIX + "Expression.Literal", _PREFIX + "DataType")

_LABELS = {
    "Read.DataSource": "reading data sources or files",
    "Hint": "query hints",
    "CommonInlineUserDefinedFunction": "user-defined functions (Python, Scala, Java code)",
    "CommonInlineUserDefinedTableFunction": "user-defined table functions",
    "CommonInlineUserDefinedDataSource": "user-defined data sources",
    "MapPartitions": "mapInPandas / mapInArrow (Python code)",
    "GroupMap": "applyInPandas (Python code)",
    "CoGroupMap": "cogroup applyInPandas (Python code)",
    "ApplyInPandasWithState": "applyInPandasWithState (Python code)",
    "TypedAggregateExpression": "typed aggregates (Scala code)",
    "CachedLocalRelation": "cached local relations (uploaded artifacts)",
    "ChunkedCachedLocalRelation": "cached local relations (uploaded artifacts)",
    "CachedRemoteRelation": "cached remote relations",
    "WriteOperation": "writing (DataFrame.write)",
    "WriteOperationV2": "writing (DataFrame.writeTo)",
    "CreateDataFrameViewCommand": "creating views (createOrReplaceTempView)",
    "MergeIntoTableCommand": "MERGE INTO",
    "Plan.CompressedOperation": "compressed plans",
}


def check_plan(plan: Message, views: Collection[str]) -> None:
    """Refused unless every message of ``plan`` is one an analyst may send; SQL in it is
    replaced by what ``check_query`` regenerated."""
    _Walk({v.lower() for v in views}, views).message(plan)


def check_execute(request: base_pb2.ExecutePlanRequest, views: Collection[str]) -> None:
    check_plan(request.plan, views)
    check_one_cut(request.plan)


# Relations Spark Connect's server builds without analyzing their inputs on their own: reads
# under them are resolved by the analysis of whatever encloses them. Every other relation
# (``withColumn``, ``groupBy(…).agg``, ``drop``, ``na``, ``sample``, statistics, SQL, and, to
# be safe, ``select``) is taken to analyze its input in an analysis of its own
# (``SparkConnectPlanner``).
_ONE_ANALYSIS = frozenset(
    [
        "read",
        "filter",
        "join",
        "set_op",
        "sort",
        "limit",
        "offset",
        "tail",
        "subquery_alias",
        "repartition",
        "repartition_by_expression",
        "deduplicate",
        "to_df",
        "range",
        "local_relation",
    ]
)


def check_one_cut(plan: Message) -> None:
    """Refused when ``plan`` reads ``pvm_consistent`` views in parts the server analyzes
    separately: each analysis resolves the consistent state once, so parts analyzed apart
    could read two cuts (docs/protocol.md, 'Consistent reads across views').

    >>> from pyspark.sql.connect.proto import base_pb2
    >>> plan = base_pb2.Plan()
    >>> join = plan.root.join
    >>> join.left.read.named_table.unparsed_identifier = "pvm_consistent.a"
    >>> join.right.read.named_table.unparsed_identifier = "pvm_consistent.b"
    >>> check_one_cut(plan)  # a.join(b): one analysis
    >>> join.right.with_columns.input.read.named_table.unparsed_identifier = "pvm_consistent.b"
    >>> check_one_cut(plan)  # a.join(b.withColumn(…)): b in an analysis of its own
    Traceback (most recent call last):
    ...
    api.connect_check.Refused: this request reads views of pvm_consistent in parts Spark Connect analyzes one by one (an operator such as withColumn, select, groupBy or drop applied to one of them before they are joined), which could read them at two cuts: join them first, or read them in one spark.sql statement
    """
    units: set[int] = set()
    _units(plan, 0, units, itertools.count(1))
    if len(units) > 1:
        raise Refused(
            f"this request reads views of {CONSISTENT_DB} in parts Spark Connect analyzes one by one (an operator "
            "such as withColumn, select, groupBy or drop applied to one of them before they are joined), which could "
            "read them at two cuts: join them first, or read them in one spark.sql statement"
        )


def _units(message: Message, unit: int, units: set[int], numbers: Iterator[int]) -> None:
    """Collect in ``units`` the analyses (numbered from ``numbers`` as they start; 0: the
    request's own) that resolve a ``pvm_consistent`` name in ``message``."""
    name = message.DESCRIPTOR.full_name
    if name == _PREFIX + "Relation":
        kind = message.WhichOneof("rel_type")
        if kind is not None and kind not in _ONE_ANALYSIS:
            unit = next(numbers)
    elif name == _PREFIX + "Read.NamedTable":
        if message.unparsed_identifier.strip("`").lower().startswith(CONSISTENT_DB):
            units.add(unit)
    elif name in (_PREFIX + "SQL", _PREFIX + "SqlCommand"):
        if CONSISTENT_DB in (message.query if name == _PREFIX + "SQL" else message.sql).lower():
            units.add(next(numbers))  # a statement is analyzed whole, on its own
    for field, value in message.ListFields():
        if field.type != FieldDescriptor.TYPE_MESSAGE or field.message_type.GetOptions().map_entry:
            continue
        for item in value if field.is_repeated else [value]:
            _units(item, unit, units, numbers)


def check_analyze(request: base_pb2.AnalyzePlanRequest, views: Collection[str]) -> None:
    kind = request.WhichOneof("analyze")
    if kind in ("persist", "unpersist", "get_storage_level", "input_files"):
        raise Refused(f"{kind} is not allowed: analysts read views")
    walk = _Walk({v.lower() for v in views}, views)
    for _, value in request.ListFields():
        if isinstance(value, Message) and value.DESCRIPTOR.full_name.startswith(_PREFIX + "AnalyzePlanRequest."):
            for field, inner in value.ListFields():
                if field.message_type is not None and field.message_type.full_name == _PREFIX + "Plan":
                    walk.message(inner)


# Session settings an analyst's client may change: how results are shown and sent.
SETTABLE = frozenset(
    [
        "spark.sql.session.timeZone",
        "spark.sql.repl.eagerEval.enabled",
        "spark.sql.repl.eagerEval.maxNumRows",
        "spark.sql.repl.eagerEval.truncate",
        "spark.sql.execution.pandas.convertToArrowArraySafely",
        "spark.sql.execution.arrow.pyspark.enabled",
        "spark.sql.pyspark.inferNestedDictAsStruct.enabled",
        "spark.sql.timestampType",
        "spark.sql.pyspark.legacy.inferArrayTypeFromFirstElement.enabled",
    ]
)


def check_config(request: base_pb2.ConfigRequest) -> None:
    kind = request.operation.WhichOneof("op_type")
    if kind == "set":
        for pair in request.operation.set.pairs:
            if pair.key not in SETTABLE:
                raise Refused(f"setting {pair.key} is not allowed: analysts may set only {', '.join(sorted(SETTABLE))}")
    elif kind == "unset":
        raise Refused("unsetting settings is not allowed")


class _Walk:
    def __init__(self, lowered: set[str], views: Collection[str]) -> None:
        self.lowered = lowered
        self.views = views
        self.special: dict[str, Callable[[Message], None]] = {
            _PREFIX + "SQL": self._sql,
            _PREFIX + "SqlCommand": self._sql_command,
            _PREFIX + "Read.NamedTable": self._named_table,
            _PREFIX + "Expression.UnresolvedFunction": self._function,
            _PREFIX + "CallFunction": self._function,
            _PREFIX + "Expression.ExpressionString": self._expression_string,
        }

    def message(self, message: Message) -> None:
        name = message.DESCRIPTOR.full_name
        if message.DESCRIPTOR.GetOptions().map_entry:
            pass
        elif name not in _ALLOWED and not name.startswith(_ALWAYS):
            short = name.removeprefix(_PREFIX)
            label = _LABELS.get(short, short)
            raise Refused(f"{label} ({short}) is not allowed: analysts read views")
        check = self.special.get(name)
        if check is not None:
            check(message)
        for field, value in message.ListFields():
            if field.type != FieldDescriptor.TYPE_MESSAGE:
                continue
            if field.message_type.GetOptions().map_entry:
                for key in value:
                    if isinstance(value[key], Message):
                        self.message(value[key])
            elif field.is_repeated:
                for item in value:
                    self.message(item)
            else:
                self.message(value)

    def _checked(self, sql: str) -> str:
        try:
            return check_query(sql, self.views)
        except QueryRejected as exc:
            raise Refused(str(exc)) from None

    def _sql(self, message: Message) -> None:
        message.query = self._checked(message.query)

    def _sql_command(self, message: Message) -> None:
        if message.sql:
            message.sql = self._checked(message.sql)

    def _named_table(self, message: Message) -> None:
        name = message.unparsed_identifier
        parts = [part.strip("`").lower() for part in name.split(".")]
        if len(parts) == 2 and parts[0] == CONSISTENT_DB and parts[1] in self.lowered:
            pass  # spark.table("pvm_consistent.v"): the view at the cut over all views
        elif name.strip("`").lower() not in self.lowered:
            shown = ", ".join(sorted(self.views)) or "none yet"
            raise Refused(f"unknown view {name!r}: analysts may read only views ({shown})")
        if message.options:
            raise Refused("options on a table read are not allowed")

    def _function(self, message: Message) -> None:
        name = message.function_name
        if getattr(message, "is_user_defined_function", False):
            raise Refused(f"user-defined function {name} is not allowed")
        if name.lower() not in ALLOWED_FUNCTIONS and name.lower() not in OPERATORS:
            raise Refused(f"function {name} is not allowed in analyst queries")

    def _expression_string(self, message: Message) -> None:
        text = message.expression
        try:
            tree = sqlglot.parse_one(f"SELECT {text}", dialect="spark")
        except (SqlglotError, RecursionError):
            raise Refused(f"could not parse the expression {text[:200]!r}") from None
        if (
            not isinstance(tree, exp.Select)
            or len(tree.expressions) != 1
            or any(v for k, v in tree.args.items() if k != "expressions")
        ):
            raise Refused(f"{text[:200]!r} is not one expression")
        checked = self._checked(f"SELECT {text}")
        message.expression = sqlglot.parse_one(checked, dialect="spark").expressions[0].sql(dialect="spark")
