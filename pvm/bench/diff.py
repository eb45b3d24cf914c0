"""``pvm bench diff``: the snapshot differential algorithms against reading both snapshots once.

Two synthetic snapshots are written as dump files (CSV by default): ``--records`` records
of ``--record-bytes`` bytes (a line of the dump, newline included), the second one with
``--change-rate`` of the records inserted and updated (half each, the paper's ``U + I`` of
Fig. 7) and as many deleted as inserted, so both have the same size, and reordered the
way the paper's generator does (section 5.2): records swapped with one on average
``--displacement`` positions away (uniformly 0 to twice that). Defaults scale the paper's
Fig. 7 to 1,000,000 records of 150 bytes: the memory budget is 1/8 of a snapshot (32 MB
for 256 MB), the window's aging buffers 8% of it (8 MB for 100 MB, Fig. 13), its input
buffers 16 KB.

In the same run, each algorithm is timed against the *floor*: reading both snapshots once
with the same reader (parsing every record), which no differential can beat. Every
algorithm runs ``--repeat`` times, each time right after a floor measurement; the best
wall-clock and CPU times are kept (the CPU ratio is the steadier one on a shared machine).
The outer-join algorithms start from the state a previous differential leaves (the old
snapshot sorted or bucketed, compressed as the variant needs); building it is timed
separately and not counted, as in the paper's IO analysis. Every algorithm's output is
checked against the changes the generator made (the window's after the second pass).
Bytes read count every byte: dumps, kept state, spill files and records fetched by
pointer. The dumps are read through the page cache, so the times are CPU-bound.

Then the shape of the paper's Fig. 16: the window algorithm's extra messages (beyond the
exact differential) against the size of its aging buffers, for a fixed pair at a fixed
distance (paper defaults scaled: ``disp_avg`` = 50,000 / 650,000 of the records, 20%
updates; record contents do not affect the message counts, so this pair is built in
memory with short records and the buffer sizes are reported in records and in MB of
``--record-bytes`` records).

``--json FILE`` writes every number; ``--plot FILE`` a PNG; ``--quick`` a small run for CI.

The snapshots are made by ``diff_workload``, measured by ``diff_runs`` and reported by
``diff_report``; this module is the command: its options and the run that ties them together.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from typing import Any

from pvm.bench.diff_report import goals, plot, table
from pvm.bench.diff_runs import BenchConfig, time_algorithms, window_sweep

__all__ = ["configure", "run"]

QUICK_RECORDS = 20_000


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``."""
    parser.add_argument(
        "--records", type=int, default=None, help="records per snapshot (default 1,000,000; --quick 20,000)"
    )
    parser.add_argument("--record-bytes", type=int, default=150, help="bytes per record in the dump (default 150)")
    parser.add_argument(
        "--change-rate", type=float, default=0.01, help="fraction of records inserted plus updated (default 0.01)"
    )
    parser.add_argument(
        "--displacement",
        type=int,
        default=None,
        help="average displacement of reordered records, in records (default records/1000)",
    )
    parser.add_argument(
        "--memory-bytes", type=int, default=None, help="memory budget in nominal bytes (default 1/8 of a snapshot)"
    )
    parser.add_argument(
        "--aging-records", type=int, default=None, help="window aging buffer size in records (default 8%% of records)"
    )
    parser.add_argument(
        "--input-records", type=int, default=None, help="window input buffer in records (default 16 KB of records)"
    )
    parser.add_argument("--bits", type=int, default=32, help="bits of the record checksum b (default 32)")
    parser.add_argument(
        "--format", dest="fmt", choices=("csv", "parquet"), default="csv", help="dump format (default csv)"
    )
    parser.add_argument(
        "--sweep-records", type=int, default=None, help="records of the Fig. 16 pair (default --records)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=2,
        help="time each algorithm (and the floor before it) this many times, keep the best",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--workdir", default=None, help="directory for the dumps and spill files (default: a temp dir)")
    parser.add_argument("--json", dest="json_path", default=None, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", default=None, metavar="FILE", help="write a PNG plot")
    parser.add_argument("--quick", action="store_true", help=f"a small run for CI ({QUICK_RECORDS:,} records)")


def _config(args: argparse.Namespace) -> BenchConfig:
    from pvm.cli import CliError

    records = args.records if args.records is not None else (QUICK_RECORDS if args.quick else 1_000_000)
    if records < 100:
        raise CliError("--records must be at least 100")
    rb = args.record_bytes
    if rb < 32:
        raise CliError("--record-bytes must be at least 32")
    if not 0.0 <= args.change_rate <= 0.5:
        raise CliError("--change-rate must be between 0 and 0.5")
    if not 1 <= args.bits <= 512:
        raise CliError("--bits must be between 1 and 512")
    if args.repeat < 1:
        raise CliError("--repeat must be at least 1")
    displacement = args.displacement if args.displacement is not None else max(1, records // 1000)
    if displacement < 0:
        raise CliError("--displacement must not be negative")
    memory = args.memory_bytes if args.memory_bytes is not None else max(4096, records * rb // 8)
    aging = args.aging_records if args.aging_records is not None else max(1, records * 8 // 100)
    inp = args.input_records if args.input_records is not None else max(1, 16 * 1024 // rb)
    if memory < 1 or aging < 1 or inp < 1:
        raise CliError("--memory-bytes, --aging-records and --input-records must be positive")
    sweep = args.sweep_records if args.sweep_records is not None else records
    if sweep < 100:
        raise CliError("--sweep-records must be at least 100")
    return BenchConfig(
        records=records,
        record_bytes=rb,
        change_rate=args.change_rate,
        displacement=displacement,
        memory_bytes=memory,
        aging_records=aging,
        input_records=inp,
        bits=args.bits,
        fmt=args.fmt,
        sweep_records=sweep,
        sweep_displacement=max(1, round(sweep * 50_000 / 650_000)),
        sweep_update_rate=0.2,
        repeat=args.repeat,
        seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table; write ``--json`` and ``--plot``."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from pvm.cli import CliError

    cfg = _config(args)
    if args.workdir is not None and not os.path.isdir(args.workdir):
        raise CliError(f"--workdir {args.workdir}: not a directory")
    for path in (args.json_path, args.plot):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise CliError(f"{path}: the directory does not exist")
    console = Console()
    if not console.is_terminal:
        console = Console(width=150)
    started = time.time()
    with (
        tempfile.TemporaryDirectory(prefix="pvm-bench-diff-", dir=args.workdir) as work,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        ) as progress,
    ):
        main = time_algorithms(cfg, work, progress)
        sweep = window_sweep(cfg, progress)
    report: dict[str, Any] = {
        "benchmark": "diff",
        "config": cfg.as_dict(),
        **main,
        "window_sweep": sweep,
    }
    report["goals"] = goals(main, sweep)
    report["environment"] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "wall_seconds": time.time() - started,
    }
    console.print(table(report))
    sw = sweep
    console.print(
        f"window extra messages vs aging buffer ({sw['records']:,} records, distance {sw['distance']:.3f}, "
        f"max displacement {sw['max_displacement']:,}): "
        + ", ".join(f"{p['aging_records']:,}->{p['extra_messages']:,}" for p in sw["points"])
    )
    for goal, ok in report["goals"].items():
        console.print(f"goal {goal}: {'met' if ok else 'NOT met'}")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, default=str)
    if args.plot:
        plot(args.plot, report)
    return 0
