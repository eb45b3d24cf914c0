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
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

__all__ = ["BenchConfig", "configure", "make_pair", "make_sweep_pair", "run"]

QUICK_RECORDS = 20_000


@dataclass
class BenchConfig:
    """The benchmark's parameters after defaults are applied."""

    records: int
    record_bytes: int
    change_rate: float
    displacement: int
    memory_bytes: int
    aging_records: int
    input_records: int
    bits: int
    fmt: str
    sweep_records: int
    sweep_displacement: int
    sweep_update_rate: float
    repeat: int
    seed: int

    def as_dict(self) -> dict[str, Any]:
        """For the JSON report."""
        return dict(self.__dict__)


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


# -- synthetic snapshots --------------------------------------------------------------------
_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ      "


def _swap_nearby(items: list[Any], disp_avg: int, rng: random.Random) -> None:
    """The paper's reordering: each record is swapped with one ``d`` positions away, ``d``
    uniform in ``[0, 2 * disp_avg]``; a record moves at most once, so no record moves more
    than ``2 * disp_avg``."""
    if disp_avg <= 0:
        return
    n = len(items)
    moved = bytearray(n)
    hi = 2 * disp_avg
    randint = rng.randint
    for j in range(n):
        if moved[j]:
            continue
        t = j + randint(0, hi)
        if t >= n or moved[t] or t == j:
            continue
        items[j], items[t] = items[t], items[j]
        moved[j] = moved[t] = 1


def make_pair(
    records: int, record_bytes: int, change_rate: float, displacement: int, seed: int
) -> tuple[list[tuple[tuple[str], tuple[str, ...]]], list[tuple[tuple[str], tuple[str, ...]]], dict[str, int]]:
    """Two snapshots of ``(key, rest)`` records whose dump lines are ``record_bytes`` long,
    and the counts of the changes made (``insert``, ``delete``, ``update``).

    >>> f1, f2, expected = make_pair(1000, 80, 0.02, 5, seed=1)
    >>> len(f1), len(f2), expected
    (1000, 1000, {'insert': 10, 'delete': 10, 'update': 10})
    >>> len(",".join(f1[0][0] + f1[0][1])) + 1
    80
    """
    rng = random.Random(seed)
    width = len(str(2 * records))
    # key, name, address, balance, note: 4 separators and a newline
    body = record_bytes - width - 5
    bal = 10 if body >= 40 else 2
    name = max(1, min(20, (body - bal) // 4))
    addr = max(1, (body - bal - name) // 2)
    note = body - bal - name - addr
    if note < 1:
        raise ValueError(f"record_bytes={record_bytes} is too small")
    pool = "".join(rng.choice(_ALPHABET) for _ in range(1 << 16))
    span = len(pool) - (name + addr + note) - 1

    def rest(i: int) -> tuple[str, ...]:
        o = rng.randrange(span)
        return (
            pool[o : o + name],
            pool[o + name : o + name + addr],
            f"{i % 10**bal:0{bal}d}",
            pool[o + 7 : o + 7 + note],
        )

    ids = list(range(records))
    rng.shuffle(ids)  # physical order is not key order
    f1 = [((f"{i:0{width}d}",), rest(i)) for i in ids]

    n_ins = round(records * change_rate / 2)
    n_upd = round(records * change_rate / 2)
    n_del = n_ins
    picks = rng.sample(range(records), n_upd + n_del)
    updated = set(picks[:n_upd])
    deleted = set(picks[n_upd:])
    insert_at = {}
    for j, pos in enumerate(rng.sample(range(records), n_ins)):
        k = records + j
        insert_at[pos] = ((f"{k:0{width}d}",), rest(k))
    f2 = []
    for pos, (key, r) in enumerate(f1):
        if pos in insert_at:
            f2.append(insert_at[pos])
        if pos in deleted:
            continue
        if pos in updated:
            new = list(r)
            new[2] = f"{(int(r[2]) + 1) % 10**bal:0{bal}d}"
            new[3] = r[3][::-1] if r[3][::-1] != r[3] else "x" * len(r[3])
            if tuple(new) == r:
                new[2] = "y" * bal
            f2.append((key, tuple(new)))
        else:
            f2.append((key, r))
    _swap_nearby(f2, displacement, rng)
    return f1, f2, {"insert": n_ins, "delete": n_del, "update": n_upd}


def make_sweep_pair(records: int, disp_avg: int, update_rate: float, seed: int) -> tuple[list[Any], list[Any], int]:
    """The Fig. 14/16 generator: the first snapshot in key order, the second a copy with
    records swapped ``disp_avg`` away on average and ``update_rate`` of them updated; no
    inserts or deletes. Returns both and the number of updates.

    >>> f1, f2, u = make_sweep_pair(100, 5, 0.2, seed=3)
    >>> sorted(k for k, _ in f1) == sorted(k for k, _ in f2), u
    (True, 20)
    """
    rng = random.Random(seed)
    f1 = [((i,), (i,)) for i in range(records)]
    f2 = list(f1)
    _swap_nearby(f2, disp_avg, rng)
    n_upd = round(records * update_rate)
    for pos in rng.sample(range(records), n_upd):
        k, r = f2[pos]
        f2[pos] = (k, (r[0] + records,))
    return f1, f2, n_upd


# -- running --------------------------------------------------------------------------------
def _measure(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall-clock and CPU seconds of one call, after a collection (so garbage from the
    previous run is not collected during this one)."""
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def read_both(snaps: tuple[Any, Any]) -> Any:
    """The floor: read every record of both snapshots once, with the algorithms' reader."""
    from wrappers.differential.spill import IOStats, paused_gc

    stats = IOStats()
    with paused_gc():  # as the algorithms run
        for s in snaps:
            deque(s.scan(stats), maxlen=0)
    return stats


ALGORITHMS = (
    ("window", "W"),
    ("partitioned_hash_kb", "PHC1"),
    ("partitioned_hash_kbp", "PHC2"),
    ("partitioned_hash", "PH"),
    ("sort_merge_kb", "SMC1"),
    ("sort_merge_kbp", "SMC2"),
    ("sort_merge", "SM"),
)


def _run_main(cfg: BenchConfig, work: str, progress: Any) -> dict[str, Any]:
    from wrappers.differential.compression import Compression
    from wrappers.differential.csv_dumps import write_csv
    from wrappers.differential.dumps import open_snapshot
    from wrappers.differential.parquet_files import write_parquet
    from wrappers.differential.partitioned_hash import hash_state, partitioned_hash_diff
    from wrappers.differential.record_schema import Schema
    from wrappers.differential.second_pass import remove_useless_pairs, useless_pairs
    from wrappers.differential.sort_merge import sort_merge_diff, sorted_state
    from wrappers.differential.spill import IOStats, MemoryBudget
    from wrappers.differential.window import window_diff

    task = progress.add_task("generating snapshots", total=None)
    f1, f2, expected = make_pair(cfg.records, cfg.record_bytes, cfg.change_rate, cfg.displacement, cfg.seed)
    schema = Schema(("id", "name", "address", "balance", "note"), ("id",))
    ext = "csv" if cfg.fmt == "csv" else "parquet"
    p1, p2 = os.path.join(work, f"f1.{ext}"), os.path.join(work, f"f2.{ext}")
    progress.update(task, description="writing the dumps")
    writer = write_csv if cfg.fmt == "csv" else write_parquet
    writer(p1, schema, f1)
    writer(p2, schema, f2)
    del f1, f2
    s1, s2 = open_snapshot(p1, key="id"), open_snapshot(p2, key="id")
    spill = os.path.join(work, "spill")
    os.makedirs(spill, exist_ok=True)
    budget = MemoryBudget(bytes=cfg.memory_bytes)
    kb = Compression(cfg.bits)
    kbp = Compression(cfg.bits, pointer=True)
    expected_messages = sum(expected.values())

    # the state each outer join keeps from the previous differential (not timed in the ratio)
    builders: dict[str, Callable[[], Any]] = {
        "hash": lambda: hash_state(s1, budget=budget, spill_dir=spill),
        "hash_kb": lambda: hash_state(s1, compression=kb, budget=budget, spill_dir=spill),
        "sorted": lambda: sorted_state(s1, budget=budget, spill_dir=spill),
        "sorted_kb": lambda: sorted_state(s1, compression=kb, budget=budget, spill_dir=spill),
    }
    uses = {
        "partitioned_hash": "hash",
        "partitioned_hash_kb": "hash_kb",
        "partitioned_hash_kbp": "hash_kb",
        "sort_merge": "sorted",
        "sort_merge_kb": "sorted_kb",
        "sort_merge_kbp": "sorted_kb",
    }
    states: dict[str, tuple[Any, float]] = {}
    for name, build in builders.items():
        progress.update(task, description=f"previous state: {name}")
        wall, _, state = _measure(build)
        states[name] = (state, wall)

    def st(name: str) -> Any:
        return states[uses[name]][0]

    plans: dict[str, Callable[[IOStats], Any]] = {
        "window": lambda io: window_diff(
            s1,
            s2,
            input_records=cfg.input_records,
            aging_records=cfg.aging_records,
            budget=budget,
            spill_dir=spill,
            stats=io,
        ),
        "partitioned_hash": lambda io: partitioned_hash_diff(
            st("partitioned_hash"), s2, budget=budget, spill_dir=spill, stats=io
        ),
        "partitioned_hash_kb": lambda io: partitioned_hash_diff(
            st("partitioned_hash_kb"), s2, compression=kb, budget=budget, spill_dir=spill, stats=io
        ),
        "partitioned_hash_kbp": lambda io: partitioned_hash_diff(
            st("partitioned_hash_kbp"), s2, compression=kbp, budget=budget, spill_dir=spill, stats=io
        ),
        "sort_merge": lambda io: sort_merge_diff(st("sort_merge"), s2, budget=budget, spill_dir=spill, stats=io),
        "sort_merge_kb": lambda io: sort_merge_diff(
            st("sort_merge_kb"), s2, compression=kb, budget=budget, spill_dir=spill, stats=io
        ),
        "sort_merge_kbp": lambda io: sort_merge_diff(
            st("sort_merge_kbp"), s2, compression=kbp, budget=budget, spill_dir=spill, stats=io
        ),
    }

    # Each algorithm runs right after a floor measurement, ``repeat`` times: on a busy
    # machine neighbouring runs see similar load; the best of each is kept.
    progress.remove_task(task)
    task = progress.add_task("differentials", total=cfg.repeat * len(ALGORITHMS))
    floor_wall: list[float] = []
    floor_cpu: list[float] = []
    floor_bytes = 0
    runs: dict[str, dict[str, Any]] = {name: {"wall": [], "cpu": []} for name, _ in ALGORITHMS}
    for rep in range(cfg.repeat):
        for name, short in ALGORITHMS:
            progress.update(task, description=f"floor, then {short} (round {rep + 1}/{cfg.repeat})")
            wall, cpu, io = _measure(lambda: read_both((s1, s2)))
            floor_wall.append(wall)
            floor_cpu.append(cpu)
            floor_bytes = io.bytes_read
            io = IOStats()
            wall, cpu, result = _measure(partial(plans[name], io))
            r = runs[name]
            r["wall"].append(wall)
            r["cpu"].append(cpu)
            r["io"] = io
            r["counts"] = result.changes.counts()
            r["messages"] = len(result.changes)
            r["stats"] = result.stats.as_dict()
            if name == "window":
                r["after_second_pass"] = remove_useless_pairs(result.changes, budget=budget, spill_dir=spill).counts()
                r["useless_pairs"] = len(useless_pairs(result.changes))
            del result
            progress.advance(task)
    progress.remove_task(task)

    fw, fc = min(floor_wall), min(floor_cpu)
    results: dict[str, Any] = {}
    for name, short in ALGORITHMS:
        r = runs[name]
        counts = r["counts"]
        entry = {
            "label": short,
            "seconds": min(r["wall"]),
            "cpu_seconds": min(r["cpu"]),
            "ratio_to_floor": min(r["wall"]) / fw,
            "cpu_ratio_to_floor": min(r["cpu"]) / fc,
            "runs_seconds": r["wall"],
            "runs_cpu_seconds": r["cpu"],
            "bytes_read": r["io"].bytes_read,
            "bytes_written": r["io"].bytes_written,
            "changes": counts,
            "messages": r["messages"],
            "extra_messages": r["messages"] - expected_messages,
            "correct": counts == expected,
            "stats": r["stats"],
        }
        if name in uses:
            state, built = states[uses[name]]
            entry["previous_state"] = {"kind": uses[name], "build_seconds": built, "bytes": state.nbytes}
        if name == "window":
            entry["useless_pairs"] = r["useless_pairs"]
            entry["changes_after_second_pass"] = r["after_second_pass"]
            entry["correct"] = r["after_second_pass"] == expected
        results[name] = entry
    return {
        "files": {"old_bytes": os.path.getsize(p1), "new_bytes": os.path.getsize(p2), "format": cfg.fmt},
        "expected_changes": expected,
        "floor": {
            "seconds": fw,
            "cpu_seconds": fc,
            "runs_seconds": floor_wall,
            "runs_cpu_seconds": floor_cpu,
            "bytes_read": floor_bytes,
        },
        "algorithms": results,
    }


def _run_sweep(cfg: BenchConfig, progress: Any) -> dict[str, Any]:
    from wrappers.differential.distance import displacement_stats, keys_of
    from wrappers.differential.second_pass import useless_pairs
    from wrappers.differential.window import window_diff

    f1, f2, n_upd = make_sweep_pair(cfg.sweep_records, cfg.sweep_displacement, cfg.sweep_update_rate, cfg.seed)
    disp = displacement_stats(keys_of(f1), keys_of(f2))
    cover = disp.maximum + 2 * cfg.input_records
    fractions = (0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.25)
    sizes = sorted({max(1, round(cover * f)) for f in fractions})
    task = progress.add_task("Fig. 16: window extra messages", total=len(sizes))
    points = []
    for size in sizes:
        r = window_diff(f1, f2, input_records=cfg.input_records, aging_records=size)
        changes = list(r.changes)
        points.append(
            {
                "aging_records": size,
                "aging_mb": size * cfg.record_bytes / 2**20,
                "messages": len(changes),
                "extra_messages": len(changes) - n_upd,
                "useless_pairs": len(useless_pairs(changes)),
                "covers_displacement": size >= cover,
            }
        )
        progress.advance(task)
    return {
        "records": cfg.sweep_records,
        "disp_avg_parameter": cfg.sweep_displacement,
        "updates": n_upd,
        "distance": disp.distance,
        "average_displacement": disp.average,
        "max_displacement": disp.maximum,
        "input_records": cfg.input_records,
        "aging_needed_records": cover,
        "aging_needed_mb": cover * cfg.record_bytes / 2**20,
        "no_extra_messages_from_aging_records": _zero_from(points),
        "points": points,
    }


def _zero_from(points: list[dict[str, Any]]) -> int | None:
    """The smallest aging buffer from which on no size had extra messages.

    >>> _zero_from([{"aging_records": 1, "extra_messages": 5}, {"aging_records": 2, "extra_messages": 0}])
    2
    """
    best = None
    for p in sorted(points, key=lambda p: p["aging_records"], reverse=True):
        if p["extra_messages"]:
            break
        best = p["aging_records"]
    return best


def _goals(main: dict[str, Any], sweep: dict[str, Any]) -> dict[str, bool]:
    algs = main["algorithms"]
    phc = ("partitioned_hash_kb", "partitioned_hash_kbp")
    covered = [p for p in sweep["points"] if p["covers_displacement"]]
    return {
        "window_within_1_5x_floor": algs["window"]["ratio_to_floor"] <= 1.5,
        "window_within_1_5x_floor_cpu": algs["window"]["cpu_ratio_to_floor"] <= 1.5,
        "compressed_partitioned_hash_within_2x_floor": min(algs[n]["ratio_to_floor"] for n in phc) <= 2.0,
        "compressed_partitioned_hash_within_2x_floor_cpu": min(algs[n]["cpu_ratio_to_floor"] for n in phc) <= 2.0,
        "no_extra_messages_once_aging_covers_displacement": bool(covered)
        and all(p["extra_messages"] == 0 for p in covered),
        "all_outputs_correct": all(a["correct"] for a in algs.values()),
    }


def _plot(path: str, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algs = report["algorithms"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [a["label"] for a in algs.values()]
    ratios = [a["ratio_to_floor"] for a in algs.values()]
    colors = [
        "tab:green" if a["label"] == "W" else "tab:blue" if a["label"].startswith("PH") else "tab:gray"
        for a in algs.values()
    ]
    ax1.bar(labels, ratios, color=colors)
    ax1.axhline(1.0, color="black", lw=1, label="floor: read both snapshots once")
    ax1.axhline(1.5, color="tab:green", ls="--", lw=1, label="window goal 1.5x")
    ax1.axhline(2.0, color="tab:blue", ls="--", lw=1, label="compressed hash goal 2x")
    cfg = report["config"]
    ax1.set_title(f"time / floor, {cfg['records']:,} records of {cfg['record_bytes']} B, {cfg['change_rate']:.0%} U+I")
    ax1.set_ylabel("time relative to reading both snapshots")
    for i, r in enumerate(ratios):
        ax1.text(i, r, f"{r:.2f}", ha="center", va="bottom", fontsize=8)
    ax1.legend(fontsize=8)
    sw = report["window_sweep"]
    xs = [p["aging_mb"] for p in sw["points"]]
    ys = [p["extra_messages"] for p in sw["points"]]
    ax2.plot(xs, ys, marker="o")
    ax2.axvline(sw["aging_needed_mb"], color="tab:red", ls=":", label="max displacement + 2 input buffers")
    ax2.set_xlabel(f"aging buffer size (MB of {cfg['record_bytes']}-byte records)")
    ax2.set_ylabel("extra messages")
    ax2.set_title(f"window, {sw['records']:,} records, distance {sw['distance']:.3f} (cf. Fig. 16)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table(report: dict[str, Any]) -> Any:
    from rich.table import Table

    cfg = report["config"]
    t = Table(
        title=f"snapshot differentials, {cfg['records']:,} records of {cfg['record_bytes']} B, "
        f"{cfg['change_rate']:.1%} inserted+updated (best of {cfg['repeat']})"
    )
    columns = (
        "algorithm",
        "wall s",
        "x floor",
        "cpu s",
        "x floor (cpu)",
        "MB read",
        "MB written",
        "ins/del/upd",
        "extra",
        "ok",
    )
    for col in columns:
        t.add_column(col, justify="left" if col in ("algorithm", "ok") else "right")
    fl = report["floor"]
    t.add_row(
        "floor: read F1 and F2",
        f"{fl['seconds']:.2f}",
        "1.00",
        f"{fl['cpu_seconds']:.2f}",
        "1.00",
        f"{fl['bytes_read'] / 2**20:.1f}",
        "0.0",
        "",
        "",
        "",
    )
    for name, a in report["algorithms"].items():
        c = a["changes"]
        t.add_row(
            f"{a['label']} {name}",
            f"{a['seconds']:.2f}",
            f"{a['ratio_to_floor']:.2f}",
            f"{a['cpu_seconds']:.2f}",
            f"{a['cpu_ratio_to_floor']:.2f}",
            f"{a['bytes_read'] / 2**20:.1f}",
            f"{a['bytes_written'] / 2**20:.1f}",
            f"{c['insert']}/{c['delete']}/{c['update']}",
            str(a["extra_messages"]),
            "yes" if a["correct"] else "NO",
        )
    return t


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
        main = _run_main(cfg, work, progress)
        sweep = _run_sweep(cfg, progress)
    report: dict[str, Any] = {
        "benchmark": "diff",
        "config": cfg.as_dict(),
        **main,
        "window_sweep": sweep,
    }
    report["goals"] = _goals(main, sweep)
    report["environment"] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "wall_seconds": time.time() - started,
    }
    console.print(_table(report))
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
        _plot(args.plot, report)
    return 0
