"""``pvm bench aggregate``: one source update maintained incrementally against a recompute.

For each ``--rows`` N, an aggregate view (GROUP BY region with COUNT, SUM, AVG, MIN and
MAX, ``pvm.bench.aggregate_view.VIEW_SQL``) whose select-project-join body has N rows is
created in the Spark store and loaded; then ``--updates`` single-row source updates, in
turn an inserted order, a deleted order holding its region's MAX, an order's amount
changed, and a deleted order holding its region's MIN (the deletes that make the store
find the region's next extreme in its per-group multiset). Per update, side by side:

* **incremental**: the service's path from the update's body effect ΔV (one or two body
  rows): the aggregate operator (``warehouse.aggregate.encode``), the Spark append to the
  view's z-log (``SparkStore.commit``) and the published W moved (``SparkStore.publish``),
  each step timed too;
* **recompute**: the view's GROUP BY over all N body rows as they now are, by Spark from
  scratch, written as the view's new state (Parquet).

After every update the view as readers see it at the published W (``read_rows``) must equal
the recompute's rows: the bench verifies what it times. Sizes run in one Spark session, so
the incremental times at every N are measured alike and plotted side by side.

Goal (measured, not tested): an update's incremental time does not grow with N; at the
largest N it is within twice that at the smallest.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from contract.zset import ZSet
from pvm.bench.aggregate_view import (
    BODY_TYPES,
    KINDS,
    VIEW_SQL,
    Body,
    Data,
    recompute_sql,
    summary,
    write_sources,
)
from pvm.bench.load import sizes
from pvm.bench.spark_deployment import measured, start_spark_store, write_figures
from pvm.cli import CliError
from warehouse.aggregate import encode, encode_sql, summed
from warehouse.store.base import Effect

DEFAULT_ROWS = "10000,100000,1000000"
GOALS = {"incremental_growth": 2.0}
BODY = "bench_aggregate_body"
ADDED = "bench_aggregate_added"
PARTS = ("encode", "commit", "publish")  # the steps of an incremental update, timed each


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rows",
        default=DEFAULT_ROWS,
        help=f"rows of the view's body (orders), comma-separated sizes (default: {DEFAULT_ROWS})",
    )
    parser.add_argument("--groups", type=int, default=1000, help="regions: the view's groups (default: 1000)")
    parser.add_argument(
        "--updates", type=int, default=12, help="single-row source updates timed per size (default: 12)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the sources, catalog and Spark files go (default: a temporary directory)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here, and a PNG plot beside")
    parser.add_argument("--seed", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    args.sizes = sizes(args.rows)
    if args.groups < 1 or args.updates < 1:
        raise CliError("--groups and --updates must be at least 1")
    if min(args.sizes) < 4 * args.groups:
        raise CliError(f"--rows: every size must be at least 4 × --groups ({4 * args.groups})")
    if args.updates > 4 * args.groups:
        raise CliError(f"--updates: at most 4 × --groups ({4 * args.groups}): each region's extremes go once")
    figures = measured(args, "pvm-bench-aggregate-", measure)
    report(figures)
    write_figures(args.json, figures, plot)
    if not all(r["verified"] for r in figures["runs"]):
        print("pvm: the incrementally maintained view differed from the recompute (see above)")
        return 1
    return 0


def measure(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    from rich.console import Console

    console = Console(stderr=True)
    store = start_spark_store(data_dir, console)
    runs = [one_size(args, n, data_dir / f"rows-{n}", store, console) for n in args.sizes]
    medians = [r["incremental_s"]["median"] for r in runs]
    return {
        "machine": {"cores": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]},
        "view": VIEW_SQL,
        "groups": args.groups,
        "runs": runs,
        "incremental_growth": round(medians[-1] / medians[0], 3),
        "goals": GOALS,
    }


def one_size(args: argparse.Namespace, n: int, run_dir: Path, store: Any, console: Any) -> dict[str, Any]:
    spark = store.spark
    s = summary()
    data = Data(n, args.groups)
    with console.status(f"{n:,} rows: generating the sources and the view's body"):
        body_rows = write_sources(
            spark, data, str(run_dir / "orders"), str(run_dir / "customers"), str(run_dir / "body")
        )
        spark.read.parquet(str(run_dir / "body")).createOrReplaceTempView(BODY)
    view = f"aggregate_bench_{n}"
    store.create(view, s.stored_names, s.stored_types(BODY_TYPES), summed(s, BODY_TYPES))
    try:
        with console.status(f"{n:,} rows: loading the view"):
            weighted = f"(SELECT region AS b0, amount AS b1, 1L AS _w FROM {BODY}) AS body"
            store.load(view, 1, encode_sql(s, weighted, s.stored_types(BODY_TYPES)))
            store.publish(view, 1)
            stored = store.zlog_stats(view).rows
        body = Body(data, random.Random(f"{args.seed}-{n}"))
        out = str(run_dir / "recomputed")
        with console.status(f"{n:,} rows: the initial state against a recompute"):
            _recompute(spark, body, out)
            initial = _compare(spark, store, view, out)
        updates = []
        for k in range(args.updates):
            update = body.next_update(KINDS[k % len(KINDS)])
            order = k + 2
            marks = [time.perf_counter()]
            rows = encode(s, update.delta)
            marks.append(time.perf_counter())
            store.commit(view, [Effect(order, rows)])
            marks.append(time.perf_counter())
            store.publish(view, order)
            marks.append(time.perf_counter())
            incremental = marks[-1] - marks[0]
            parts = {part: round(marks[i + 1] - marks[i], 6) for i, part in enumerate(PARTS)}
            with console.status(f"{n:,} rows, update {k + 1}: recomputing the view"):
                started = time.perf_counter()
                _recompute(spark, body, out)
                recompute = time.perf_counter() - started
                compared = _compare(spark, store, view, out)
            console.print(
                f"{n:,} rows, update {k + 1}/{args.updates} ({update.kind}, region {', '.join(update.groups)}): "
                f"incremental {incremental:.3f} s ({len(rows)} stored rows), recompute {recompute:.3f} s, "
                + ("equal" if compared["equal"] else f"[red]DIFFERENT[/red] {compared['differences']}")
            )
            updates.append(
                {
                    "kind": update.kind,
                    "order_id": update.order_id,
                    "groups": update.groups,
                    "stored_rows_written": len(rows),
                    "incremental_s": round(incremental, 4),
                    "incremental_parts_s": parts,
                    "recompute_s": round(recompute, 4),
                    **compared,
                }
            )
    finally:
        store.drop(view)
        for temporary in (BODY, ADDED):  # the session may outlive the bench (a test's does)
            spark.catalog.dropTempView(temporary)
    return _run_figures(n, body_rows, stored, initial, updates)


def _recompute(spark: Any, body: Body, out: str) -> None:
    """The view over the body as it now is, computed by Spark and written at ``out``."""
    added = spark.createDataFrame(list(body.added.values()), "region STRING, amount BIGINT")
    added.createOrReplaceTempView(ADDED)  # empty at first: every recompute runs one plan
    spark.sql(recompute_sql(BODY, sorted(body.deleted), ADDED)).write.mode("overwrite").parquet(out)


def _compare(spark: Any, store: Any, view: str, out: str) -> dict[str, Any]:
    """Whether the view readers see at the published W equals the recompute at ``out``;
    the first few rows each has that the other lacks."""
    recomputed = ZSet.from_rows(tuple(r) for r in spark.read.parquet(out).collect())
    shown = ZSet.from_rows(store.read_rows(view))
    missing, extra = recomputed - shown, shown - recomputed
    differences = {"missing": [list(r) for r in list(missing.positive().rows())[:3]]} if missing.positive() else {}
    if extra.positive():
        differences["extra"] = [list(r) for r in list(extra.positive().rows())[:3]]
    return {"equal": shown == recomputed, "view_rows": len(shown), "differences": differences}


def _seconds(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "mean": round(statistics.fmean(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def _run_figures(
    n: int, body_rows: int, stored: int, initial: dict[str, Any], updates: list[dict[str, Any]]
) -> dict[str, Any]:
    incremental = _seconds([u["incremental_s"] for u in updates])
    recompute = _seconds([u["recompute_s"] for u in updates])
    by_kind = {
        kind: {
            "incremental_s": statistics.median(u["incremental_s"] for u in updates if u["kind"] == kind),
            "recompute_s": statistics.median(u["recompute_s"] for u in updates if u["kind"] == kind),
        }
        for kind in KINDS
        if any(u["kind"] == kind for u in updates)
    }
    return {
        "rows": n,
        "body_rows": body_rows,
        "stored_rows_loaded": stored,
        "initial_equal": initial["equal"],
        "updates": updates,
        "incremental_s": incremental,
        "recompute_s": recompute,
        "ratio": round(recompute["median"] / incremental["median"], 1),
        "by_kind": by_kind,
        "verified": initial["equal"] and all(u["equal"] for u in updates),
    }


def report(figures: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"one source update, seconds: median (max); {figures['groups']:,} groups")
    for column in ("body rows", "stored rows", "incremental", "recompute", "ratio", "rows/update", "verified"):
        table.add_column(column, justify="right")
    for r in figures["runs"]:
        i, c = r["incremental_s"], r["recompute_s"]
        written = sorted({u["stored_rows_written"] for u in r["updates"]})
        table.add_row(
            f"{r['body_rows']:,}",
            f"{r['stored_rows_loaded']:,}",
            f"{i['median']:.3f} ({i['max']:.3f})",
            f"{c['median']:.3f} ({c['max']:.3f})",
            f"{r['ratio']:g}x",
            f"{written[0]}-{written[-1]}" if len(written) > 1 else str(written[0]),
            "[green]yes[/green]" if r["verified"] else "[red]NO[/red]",
        )
    console.print(table)
    for r in figures["runs"]:
        parts = {p: statistics.median(u["incremental_parts_s"][p] for u in r["updates"]) for p in PARTS}
        console.print(
            f"incremental at {r['body_rows']:,} rows, medians: "
            + ", ".join(f"{part} {seconds * 1000:.2f} ms" for part, seconds in parts.items())
        )
    runs = figures["runs"]
    growth = figures["incremental_growth"]
    met = growth <= GOALS["incremental_growth"]
    console.print(
        f"{'[green]met[/green]' if met else '[red]not met[/red]'}: incremental time at {runs[-1]['rows']:,} rows is "
        f"{growth:.2f}x that at {runs[0]['rows']:,} (goal: at most {GOALS['incremental_growth']:g}x)"
    )


def plot(figures: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = figures["runs"]
    n = [r["body_rows"] for r in runs]
    fig, (sizes_ax, updates_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, style, label in (("incremental_s", "o-", "incremental"), ("recompute_s", "s--", "recompute")):
        median = [r[key]["median"] for r in runs]
        spread = [
            [m - r[key]["min"] for m, r in zip(median, runs, strict=True)],
            [r[key]["max"] - m for m, r in zip(median, runs, strict=True)],
        ]
        sizes_ax.errorbar(n, median, yerr=spread, fmt=style, capsize=3, label=f"{label} (median, min-max)")
    sizes_ax.set(
        xscale="log", yscale="log", xlabel="rows of the view's body", ylabel="seconds per update", title="per size"
    )
    sizes_ax.legend()
    largest = runs[-1]
    x = range(1, len(largest["updates"]) + 1)
    updates_ax.plot(x, [u["incremental_s"] for u in largest["updates"]], "o", label="incremental")
    updates_ax.plot(x, [u["recompute_s"] for u in largest["updates"]], "s", label="recompute")
    updates_ax.set_xticks(list(x), [u["kind"] for u in largest["updates"]], rotation=60, fontsize=7)
    updates_ax.set(yscale="log", ylabel="seconds", title=f"each update at {largest['body_rows']:,} rows")
    updates_ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
