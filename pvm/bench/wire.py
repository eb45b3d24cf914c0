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
* an **update batch** (one update of N inserted rows, as the wrapper holds it): JSON as the
  wrapper sends it (``UpdateBatch.model_dump_json``) and the manager's ingest reads and
  validates it (``api.ingest.read_batch``); Arrow as the update stream
  (``contract.update_stream``), encoded as the wrapper does and read by the ingest
  (``api.ingest.read_stream``) into the same change dicts.

Each is timed ``--repeat`` times (the minimum counts: it is the least disturbed by the
machine); the ratio is Arrow's time over JSON's, so above 1 means JSON is cheaper. Bytes are
the encoded sizes. The rows decoded must equal the rows encoded, in both formats.

Then, for each ``--ship`` N, the whole shipped path: one update of N changes posted by the
wrapper's ``Shipper`` over HTTP to a manager (``pvm.local_deployment``, one SQLite source
with its wrapper process, no view) until it is acknowledged: encoding, the post, the parse,
the receiver's checks, digest and update log. As JSON (``--update-encoding json``) and as an
update stream, side by side, the least of ``--repeat`` each.

Then, for each ``--captured`` N, one source transaction of N rows captured and shipped by a
real wrapper process until acknowledged, with the memory both sides take
(``pvm.bench.wire_captured``).
"""

from __future__ import annotations

import argparse
import io
import os
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from pvm.bench.load import sizes
from pvm.bench.spark_deployment import write_figures

DEFAULT_ROWS = "1,10,100,1000,10000,100000"
DEFAULT_SHIP = "10000,100000"
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
    parser.add_argument(
        "--ship",
        default=DEFAULT_SHIP,
        help=f"changes per update shipped to a manager over HTTP, as JSON and as a stream; 'none' for none "
        f"(default: {DEFAULT_SHIP})",
    )
    parser.add_argument(
        "--captured",
        default="none",
        help="changes of one SQLite transaction that a wrapper process captures and ships until acknowledged, "
        "comma-separated, or 'none': seconds, and the RSS growth of the wrapper and the manager (default: none)",
    )
    parser.add_argument(
        "--wrapper-args",
        default="",
        help="--captured: more options of the wrapper process, e.g. '--part-bytes 2097152' (default: none)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here, and a PNG plot beside")


def run(args: argparse.Namespace) -> int:
    import asyncio

    from rich.console import Console

    from pvm.cli import CliError

    if args.repeat < 1:
        raise CliError("--repeat must be at least 1")
    console = Console(stderr=True)
    try:
        shipped_sizes = [] if args.ship == "none" else sizes(args.ship)
    except CliError:
        raise CliError(
            f"--ship takes comma-separated change counts (at least 1) or 'none', not {args.ship!r}"
        ) from None
    try:
        captured_sizes = [] if args.captured == "none" else sizes(args.captured)
    except CliError:
        raise CliError(
            f"--captured takes comma-separated change counts (at least 1) or 'none', not {args.captured!r}"
        ) from None
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
    if shipped_sizes:
        with console.status("shipping updates to a manager"):
            figures["shipped"] = asyncio.run(ship(shipped_sizes, args.repeat))
    if captured_sizes:
        from pvm.bench import wire_captured

        with console.status("capturing and shipping a large transaction"):
            figures["captured"] = asyncio.run(wire_captured.captured(captured_sizes, shlex.split(args.wrapper_args)))
        figures["wrapper_args"] = args.wrapper_args
    if shipped_sizes or captured_sizes:
        figures["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    report(figures)
    if captured_sizes:
        wire_captured.report(figures["captured"])
    write_figures(args.json, figures, plot)
    return 0 if all(r[m]["equal"] for r in runs for m in MESSAGES) else 1


def rows_of(n: int) -> list[list[Any]]:
    """N rows of wire values in ``ROW_SHAPE``, as a source's driver hands them out."""
    return [
        [i, i % 97, f"customer {i}", i * 0.25, f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}", f"{i}.50"] for i in range(n)
    ]


# -- subquery answers -----------------------------------------------------------------------
@dataclass(frozen=True)
class Coded:
    """A message encoded: its bytes, how long encoding took, and its decoder (which gives the
    rows back)."""

    data: bytes
    encode_s: float
    decode: Callable[[], list[list[Any]]]


def answer_json(rows: list[list[Any]]) -> Coded:
    from contract.schemas import SubqueryAnswer

    began = time.perf_counter()
    body = SubqueryAnswer.model_construct(watermark=7, rows=[[0, *r, 1] for r in rows], elapsed_ms=1.0)
    data = body.model_dump_json().encode()
    return Coded(
        data, time.perf_counter() - began, lambda: [r[1:-1] for r in SubqueryAnswer.model_validate_json(data).rows]
    )


def answer_arrow(rows: list[list[Any]]) -> Coded:
    began = time.perf_counter()
    names = ["_key", *(c for c, _ in ROW_SHAPE), "_count"]
    declared = ["BIGINT", *(t for _, t in ROW_SHAPE), "BIGINT"]
    data = _arrow_stream(names, declared, [[0, *r, 1] for r in rows])
    return Coded(data, time.perf_counter() - began, lambda: [r[1:-1] for r in _arrow_rows(data)])


# -- update batches -------------------------------------------------------------------------
def update_of(rows: list[list[Any]], seq: int = 1) -> Any:
    """One update inserting ``rows``, as the wrapper holds it (its models, validated once)."""
    from contract.schemas import Change, Update

    names = [c for c, _ in ROW_SHAPE]
    changes = [Change(relation="orders", sign=1, row=dict(zip(names, r, strict=True))) for r in rows]
    return Update.model_construct(seq=seq, changes=changes, txid=None, captured_at=None, part=None)


def update_json(rows: list[list[Any]]) -> Coded:
    from api.ingest import read_batch
    from contract.schemas import UpdateBatch

    update = update_of(rows)
    began = time.perf_counter()
    data = UpdateBatch.model_construct(source="shop", updates=[update]).model_dump_json(
        exclude={"updates": {"__all__": {"part"}}}
    )
    return _coded(data.encode(), time.perf_counter() - began, read_batch)


def update_arrow(rows: list[list[Any]]) -> Coded:
    from api.ingest import read_stream
    from contract.update_stream import encode_update_batch

    update = update_of(rows)
    began = time.perf_counter()
    data = encode_update_batch("shop", [update])
    assert data is not None
    return _coded(data, time.perf_counter() - began, read_stream)


def _coded(data: bytes, encode_s: float, read: Callable[[bytes], Any]) -> Coded:
    names = [c for c, _ in ROW_SHAPE]

    def decode() -> list[list[Any]]:
        (update,) = read(data).updates
        return [[c["row"][name] for name in names] for c in update.changes]

    return Coded(data, encode_s, decode)


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


MESSAGES: dict[str, dict[str, Callable[[list[list[Any]]], Coded]]] = {
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
                coded = codec(rows)
                began = time.perf_counter()
                decoded = coded.decode()
                decode_s.append(time.perf_counter() - began)
                encode_s.append(coded.encode_s)
                data = coded.data
            equal = equal and decoded == rows
            figures[name] = {"bytes": len(data), "encode_s": min(encode_s), "decode_s": min(decode_s)}
            figures[name]["total_s"] = figures[name]["encode_s"] + figures[name]["decode_s"]
        figures["arrow_over_json"] = round(figures["arrow"]["total_s"] / figures["json"]["total_s"], 3)
        figures["equal"] = equal
        out[message] = figures
    return out


# -- the shipped path ---------------------------------------------------------------------------
SHIP_FORMATS = ("json", "stream")


async def ship(shipped_sizes: Sequence[int], repeat: int) -> list[dict[str, Any]]:
    """For each size, seconds from the wrapper's ``Shipper.send`` to the manager's
    acknowledgment of one update of that many changes, as JSON and as a stream, the least
    of ``repeat`` posts each (each its own seq); the body's bytes; the ratio."""
    import sqlite3
    import tempfile

    import httpx

    from pvm.local_deployment import LocalDeployment
    from wrappers.shipper import Shipper

    columns = ", ".join(f"{name} {declared}" for name, declared in ROW_SHAPE)
    out = []
    with tempfile.TemporaryDirectory(prefix="pvm-bench-wire-") as tmp:
        data_dir = Path(tmp)
        with sqlite3.connect(data_dir / "shop.db") as db:
            db.execute(f"CREATE TABLE orders ({columns})")
        async with LocalDeployment(data_dir) as deployment, httpx.AsyncClient(timeout=600) as client:
            await deployment.add_sqlite_source("shop", data_dir / "shop.db", ["orders"])
            token = await deployment.wrapper_token("shop")
            shippers = {
                "json": Shipper("shop", deployment.url, client, token, encoding="json"),
                "stream": Shipper("shop", deployment.url, client, token, arrow_from=1),
            }
            seq = 0
            for n in shipped_sizes:
                rows = rows_of(n)
                figures: dict[str, Any] = {"changes": n}
                for name, shipper in shippers.items():
                    seconds = []
                    for _ in range(repeat):
                        seq += 1
                        update = update_of(rows, seq)
                        began = time.perf_counter()
                        assert await shipper.send([update], last_seq=partial(int, seq)) == seq
                        seconds.append(time.perf_counter() - began)
                    body = await shipper.body([update])
                    figures[name] = {"seconds": min(seconds), "bytes": len(body.content), "stream": body.stream}
                figures["stream_over_json"] = round(figures["stream"]["seconds"] / figures["json"]["seconds"], 3)
                out.append(figures)
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
    if figures.get("shipped"):
        table = Table(title=f"one update shipped over HTTP until acknowledged, ms (least of {figures['repeat']})")
        for column in ("changes", "JSON ms", "stream ms", "stream/JSON", "JSON bytes", "stream bytes"):
            table.add_column(column, justify="right")
        for r in figures["shipped"]:
            table.add_row(
                f"{r['changes']:,}",
                f"{r['json']['seconds'] * 1000:.1f}",
                f"{r['stream']['seconds'] * 1000:.1f}",
                f"{r['stream_over_json']:g}x",
                f"{r['json']['bytes']:,}",
                f"{r['stream']['bytes']:,}",
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
