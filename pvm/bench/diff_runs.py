"""Running ``pvm bench diff``'s measurements: every algorithm against the floor, and the
window algorithm's extra messages against the size of its aging buffers.

Both return plain dicts, the report's numbers.
"""

from __future__ import annotations

import gc
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from pvm.bench.diff_workload import make_pair, make_sweep_pair

__all__ = ["ALGORITHMS", "BenchConfig", "read_both", "time_algorithms", "window_sweep"]


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


def time_algorithms(cfg: BenchConfig, work: str, progress: Any) -> dict[str, Any]:
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


def window_sweep(cfg: BenchConfig, progress: Any) -> dict[str, Any]:
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
