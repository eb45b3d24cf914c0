"""``pvm bench wire``: JSON against Arrow IPC for the rows of subquery answers and updates.

Subquery answers and update batches travel as JSON (``contract.schemas``), the initial load's
relations as Arrow IPC streams (``contract.relation_snapshot``). Both formats carry rows that
the manager turns into Python values (a Z-set's rows), so what a format costs is the whole
trip: the sender encodes rows of wire values, the receiver decodes them back into rows. For
each ``--rows`` N, the same N rows (``ROW_SHAPE``: a key, an integer, a name, a price, a date
and a numeric, as the sources hand them out) make

* a **subquery answer** (``[key index, *values, count]`` rows): JSON as the wrapper sends it
  (``SubqueryAnswer.model_dump_json``) and the manager reads it
  (``SubqueryAnswer.model_validate_json``); Arrow as the snapshot stream's writer and reader
  do, the rows rebuilt from the columns (``to_pylist``);
* an **update batch** (one update of N inserted rows): JSON as the wrapper sends it
  (``dumps_wire_json``) and the manager's ingest reads and validates it
  (``api.ingest.read_batch``); Arrow as the same stream with a sign column, decoded into
  the same change dicts the ingest hands on.

Each is timed ``--repeat`` times (the minimum counts: it is the least disturbed by the
machine); the ratio is Arrow's time over JSON's, so above 1 means JSON is cheaper. Bytes are
the encoded sizes. The rows decoded must equal the rows encoded, in both formats.
"""

from __future__ import annotations

import argparse
import io
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pvm.bench.load import sizes
from pvm.bench.spark_deployment import write_figures

DEFAULT_ROWS = "1,10,100,1000,10000,100000"
ROW_SHAPE: tuple[tuple[str, str], ...] = (
    ("id", "INTEGER"),
    ("qty", "INTEGER"),
    ("name", "TEXT"),
    ("price", "REAL"),
    ("day", "DATE"),
    ("amount", "NUMERIC(12,2)"),
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rows", default=DEFAULT_ROWS, help=f"rows per message, comma-separated (default: {DEFAULT_ROWS})"
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="timings per format and size; the least counts (default: 5)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here, and a PNG plot beside")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pvm.cli import CliError

    if args.repeat < 1:
        raise CliError("--repeat must be at least 1")
    console = Console(stderr=True)
    runs = []
    for n in sizes(args.rows):
        with console.status(f"{n:,} rows: encoding and decoding"):
            runs.append(one_size(n, args.repeat))
    figures: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]},
        "row_shape": [list(c) for c in ROW_SHAPE],
        "repeat": args.repeat,
        "runs": runs,
    }
    report(figures)
    write_figures(args.json, figures, plot)
    return 0 if all(r[m]["equal"] for r in runs for m in MESSAGES) else 1


def rows_of(n: int) -> list[list[Any]]:
    """N rows of wire values in ``ROW_SHAPE``, as a source's driver hands them out."""
    return [
        [i, i % 97, f"customer {i}", i * 0.25, f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}", f"{i}.50"] for i in range(n)
    ]


# -- subquery answers -----------------------------------------------------------------------
def answer_json(rows: list[list[Any]]) -> tuple[bytes, Callable[[], list[list[Any]]]]:
    from contract.schemas import SubqueryAnswer

    body = SubqueryAnswer.model_construct(watermark=7, rows=[[0, *r, 1] for r in rows], elapsed_ms=1.0)
    data = body.model_dump_json().encode()
    return data, lambda: [r[1:-1] for r in SubqueryAnswer.model_validate_json(data).rows]


def answer_arrow(rows: list[list[Any]]) -> tuple[bytes, Callable[[], list[list[Any]]]]:
    names = ["_key", *(c for c, _ in ROW_SHAPE), "_count"]
    declared = ["BIGINT", *(t for _, t in ROW_SHAPE), "BIGINT"]
    data = _arrow_stream(names, declared, [[0, *r, 1] for r in rows])
    return data, lambda: [r[1:-1] for r in _arrow_rows(data)]


# -- update batches -------------------------------------------------------------------------
def update_json(rows: list[list[Any]]) -> tuple[bytes, Callable[[], list[list[Any]]]]:
    from api.ingest import read_batch
    from contract.schemas import dumps_wire_json

    names = [c for c, _ in ROW_SHAPE]
    changes = [{"relation": "orders", "sign": 1, "row": dict(zip(names, r, strict=True))} for r in rows]
    data = dumps_wire_json({"source": "shop", "updates": [{"seq": 1, "changes": changes}]}).encode()

    def decode() -> list[list[Any]]:
        (update,) = read_batch(data).updates
        return [[c["row"][name] for name in names] for c in update.changes]

    return data, decode


def update_arrow(rows: list[list[Any]]) -> tuple[bytes, Callable[[], list[list[Any]]]]:
    names = [c for c, _ in ROW_SHAPE]
    data = _arrow_stream(["_sign", *names], ["BIGINT", *(t for _, t in ROW_SHAPE)], [[1, *r] for r in rows])

    def decode() -> list[list[Any]]:
        # the changes as the manager's ingest hands them on (``read_batch``): a dict each
        changes = [
            {"relation": "orders", "sign": r[0], "row": dict(zip(names, r[1:], strict=True))} for r in _arrow_rows(data)
        ]
        return [[c["row"][name] for name in names] for c in changes]

    return data, decode


def _arrow_stream(names: Sequence[str], declared: Sequence[str], rows: list[list[Any]]) -> bytes:
    from contract.relation_snapshot import ROWS_PER_BATCH, SnapshotWriter, snapshot_schema

    sink = io.BytesIO()
    writer = SnapshotWriter(sink, snapshot_schema(names, declared, watermark=7))
    for start in range(0, len(rows), ROWS_PER_BATCH):
        writer.write_rows(rows[start : start + ROWS_PER_BATCH])
    writer.close()
    return sink.getvalue()


def _arrow_rows(data: bytes) -> list[list[Any]]:
    """The stream's rows as wire values: columns of the exact JSON text parsed back."""
    import json

    from contract.relation_snapshot import JSON_KEY, SnapshotReader

    reader = SnapshotReader(io.BytesIO(data))
    parsed = [bool(f.metadata and JSON_KEY in f.metadata) for f in reader.schema]
    rows: list[list[Any]] = []
    for batch in reader.batches():
        columns = [
            [None if v is None else json.loads(v) for v in c.to_pylist()] if as_json else c.to_pylist()
            for c, as_json in zip(batch.columns, parsed, strict=True)
        ]
        rows.extend(map(list, zip(*columns, strict=True)))
    return rows


MESSAGES: dict[str, dict[str, Callable[[list[list[Any]]], tuple[bytes, Callable[[], list[list[Any]]]]]]] = {
    "answer": {"json": answer_json, "arrow": answer_arrow},
    "update": {"json": update_json, "arrow": update_arrow},
}


def one_size(n: int, repeat: int) -> dict[str, Any]:
    rows = rows_of(n)
    out: dict[str, Any] = {"rows": n}
    for message, formats in MESSAGES.items():
        figures: dict[str, Any] = {}
        equal = True
        for name, codec in formats.items():
            encode_s, decode_s = [], []
            for _ in range(repeat):
                began = time.perf_counter()
                data, decode = codec(rows)
                encoded = time.perf_counter()
                decoded = decode()
                decode_s.append(time.perf_counter() - encoded)
                encode_s.append(encoded - began)
            equal = equal and decoded == rows
            figures[name] = {"bytes": len(data), "encode_s": min(encode_s), "decode_s": min(decode_s)}
            figures[name]["total_s"] = figures[name]["encode_s"] + figures[name]["decode_s"]
        figures["arrow_over_json"] = round(figures["arrow"]["total_s"] / figures["json"]["total_s"], 3)
        figures["equal"] = equal
        out[message] = figures
    return out


def report(figures: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for message in MESSAGES:
        table = Table(title=f"{message}: encode + decode, ms (least of {figures['repeat']}); bytes")
        for column in ("rows", "JSON ms", "Arrow ms", "Arrow/JSON", "JSON bytes", "Arrow bytes", "equal"):
            table.add_column(column, justify="right")
        for r in figures["runs"]:
            m = r[message]
            table.add_row(
                f"{r['rows']:,}",
                f"{m['json']['total_s'] * 1000:.3f}",
                f"{m['arrow']['total_s'] * 1000:.3f}",
                f"{m['arrow_over_json']:g}x",
                f"{m['json']['bytes']:,}",
                f"{m['arrow']['bytes']:,}",
                "[green]yes[/green]" if m["equal"] else "[red]NO[/red]",
            )
        console.print(table)


def plot(figures: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = figures["runs"]
    n = [r["rows"] for r in runs]
    fig, axes = plt.subplots(1, len(MESSAGES), figsize=(11, 4.2))
    for ax, message in zip(axes, MESSAGES, strict=True):
        for fmt, style in (("json", "o-"), ("arrow", "s--")):
            ax.plot(n, [r[message][fmt]["total_s"] * 1000 for r in runs], style, label=f"{fmt}: encode + decode")
        ax.set(xscale="log", yscale="log", xlabel="rows per message", ylabel="ms", title=message)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
