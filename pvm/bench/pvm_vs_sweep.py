"""``pvm bench pvm-vs-sweep``: total maintenance time T(p) for p = 1 (SWEEP) and more.

The paper's setting (Fig. 21 and 23): m sources, each one relation ``R_i(A int, B int)``
of random rows, the chain view ``R1.A = R2.B, R2.A = R3.B, …``, n updates spread evenly
over the sources and all queued before maintenance starts. Values come from rows/5
distinct integers, so every join step finds about five partners: like the paper's runs,
no maintenance query comes back empty and ends its sweep early. Every subquery costs an
injected delay at the source, and each source answers q subqueries at a time. For each p
the same run measures T(p) from resuming maintenance to the last commit, and prints the
speedup T(1)/T(p) next to the cost model's prediction (eq. 15):
``T_PVM = ((n-1)/k + 1) t`` with ``k = min(p, m*q)``, so the model speedup is ``n / ((n-1)/k + 1)``.

With ``--commit-modes out_of_order,arrival`` (the default) every p is measured twice: PVM
commits each effect as soon as it is ready, PVM-CC (the paper's Fig. 17) holds it until
every earlier effect is committed. The table shows both T(p) and the mean time an effect
waits between being ready and being committed: what PVM-CC costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import tempfile
import time
from pathlib import Path

from pvm.cli import CliError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sources", type=int, default=4, help="m: sources, one relation each (default: 4)")
    parser.add_argument("--updates", type=int, default=60, help="n: updates queued before maintenance (default: 60)")
    parser.add_argument("--rows", type=int, default=5000, help="rows per relation (default: 5000)")
    parser.add_argument("--delay-ms", type=float, default=50.0, help="injected cost of every subquery (default: 50)")
    parser.add_argument(
        "--per-source-queries", type=int, default=1, help="q: subqueries a source answers at once (default: 1)"
    )
    parser.add_argument(
        "--parallelism", default="1,2,3,4,6,8,10", help="comma list of PPU sizes p (default: 1,2,3,4,6,8,10)"
    )
    parser.add_argument(
        "--commit-modes",
        default="out_of_order,arrival",
        help="comma list of commit modes to measure (default: out_of_order,arrival)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here; a PNG plot goes next to it")
    parser.add_argument("--seed", type=int, default=1)


def parse_parallelism(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise CliError(f"--parallelism must be a comma list of integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise CliError("--parallelism needs at least one value, each >= 1")
    return sorted(set(values) | {1})  # T(1) is the baseline of every speedup


def model_speedup(n: int, p: int, capacity: int) -> float:
    k = min(p, capacity)
    return n / ((n - 1) / k + 1)


def run(args: argparse.Namespace) -> int:
    if args.sources < 2 or args.updates < 2 or args.rows < 1 or args.delay_ms < 0 or args.per_source_queries < 1:
        raise CliError("need --sources >= 2, --updates >= 2, --rows >= 1, --delay-ms >= 0, --per-source-queries >= 1")
    ps = parse_parallelism(args.parallelism)
    requested = {m.strip() for m in args.commit_modes.split(",") if m.strip()}
    modes = [m for m in ("out_of_order", "arrival") if m in requested]  # the first one is the main curve
    if not modes or requested - set(modes):
        raise CliError("--commit-modes takes out_of_order and/or arrival")
    results = asyncio.run(measure(args, ps, modes))
    print_table(results, args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
        png = args.json.with_suffix(".png")
        plot(results, args, png)
        print(f"wrote {args.json} and {png}")
    return 0


def chain_view(name: str, m: int, p: int) -> str:
    rels = ", ".join(f"s{i}.R{i}" for i in range(1, m + 1))
    outs = ", ".join(f"R{i}.A AS a{i}" for i in range(1, m + 1))
    where = " AND ".join(f"R{i}.A = R{i + 1}.B" for i in range(1, m))
    return f"CREATE VIEW {name} AS SELECT {outs} FROM {rels} WHERE {where}"


async def measure(args: argparse.Namespace, ps: list[int], modes: list[str]) -> list[dict]:
    from rich.progress import Progress

    from pvm.local_deployment import LocalDeployment
    from warehouse.counters import SECONDS_BUCKETS, Histogram

    rng = random.Random(args.seed)
    m, n = args.sources, args.updates
    with tempfile.TemporaryDirectory(prefix="pvm-bench-") as tmp:
        data = Path(tmp)
        domain = max(1, args.rows // 5)
        paths = []
        for i in range(1, m + 1):
            path = data / f"s{i}.db"
            with sqlite3.connect(path) as db:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(f"CREATE TABLE R{i} (A INTEGER, B INTEGER)")
                # both join columns indexed, as a DBA would: SWEEP queries R_i by A (from its
                # right neighbour) and by B (from its left one)
                db.execute(f"CREATE INDEX R{i}_a ON R{i} (A)")
                db.execute(f"CREATE INDEX R{i}_b ON R{i} (B)")
                db.executemany(
                    f"INSERT INTO R{i} VALUES (?, ?)",
                    [(rng.randrange(domain), rng.randrange(domain)) for _ in range(args.rows)],
                )
            paths.append(path)
        seconds: dict[tuple[str, int], float] = {}
        waits: dict[tuple[str, int], float] = {}
        async with LocalDeployment(data) as deployment:
            for i, path in enumerate(paths, start=1):
                await deployment.add_sqlite_source(
                    f"s{i}",
                    path,
                    [f"R{i}"],
                    query_delay_ms=args.delay_ms,
                    max_concurrent_queries=args.per_source_queries,
                )
            manager = deployment.manager
            with Progress() as progress:
                task = progress.add_task("measuring T(p)", total=len(ps) * len(modes))
                for p in ps:
                    for mode in modes:
                        name = f"chain_p{p}_{mode}"
                        await manager.define_view(
                            chain_view(name, m, p), parallelism=p, batch_size=1, commit_mode=mode
                        )  # as the paper runs it
                        await manager.wait_idle(name, timeout=600)
                        maintainer = manager.view(name).maintainer
                        manager.pause_view(name)
                        await queue_updates(deployment, paths, n, rng, domain)
                        maintainer.counters.commit_wait = Histogram(SECONDS_BUCKETS)
                        started = time.perf_counter()
                        await manager.resume_view(name)
                        await manager.wait_idle(name, timeout=3600)
                        seconds[mode, p] = time.perf_counter() - started
                        if maintainer.failed:
                            raise CliError(f"maintenance failed: {maintainer.failed}")
                        if maintainer.counters.units_committed < n + 1:
                            raise CliError(
                                f"expected {n} updates maintained at p={p}, got {maintainer.counters.units_committed - 1}"
                            )
                        waits[mode, p] = maintainer.counters.commit_wait.total / n
                        await manager.drop_view(name)
                        progress.update(task, advance=1, description=f"T({p}) {mode} = {seconds[mode, p]:.2f} s")
    capacity = m * args.per_source_queries
    main = modes[0]
    results = []
    for p in ps:
        row = {
            "p": p,
            "seconds": round(seconds[main, p], 4),
            "speedup": round(seconds[main, 1] / seconds[main, p], 3),
            "model_speedup": round(model_speedup(n, p, capacity), 3),
            "commit_wait_ms": round(1000 * waits[main, p], 2),
        }
        if "arrival" in modes and main != "arrival":
            row["arrival_seconds"] = round(seconds["arrival", p], 4)
            row["arrival_commit_wait_ms"] = round(1000 * waits["arrival", p], 2)
        results.append(row)
    return results


async def queue_updates(deployment, paths: list[Path], n: int, rng: random.Random, domain: int) -> None:
    """n single-row inserts, round-robin over the sources, each shipped as its own update."""
    manager = deployment.manager
    for k in range(n):
        i = k % len(paths)
        source = f"s{i + 1}"
        before = manager.receiver.released_through(source)
        with sqlite3.connect(paths[i]) as db:
            db.execute(f"INSERT INTO R{i + 1} VALUES (?, ?)", (rng.randrange(domain), rng.randrange(domain)))
        deadline = time.monotonic() + 30
        while manager.receiver.released_through(source) == before:
            if time.monotonic() > deadline:
                raise CliError(f"source {source} did not ship its update")
            await asyncio.sleep(0.002)


def print_table(results: list[dict], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"PVM vs SWEEP: m={args.sources} sources, n={args.updates} updates, {args.delay_ms:g} ms/subquery, q={args.per_source_queries}"
    )
    arrival = "arrival_seconds" in results[0]
    columns = ["p", "T(p) s", "speedup T(1)/T(p)", "model (eq. 15)", "commit wait ms"]
    if arrival:
        columns += ["PVM-CC T(p) s", "PVM-CC commit wait ms"]
    for col in columns:
        table.add_column(col, justify="right")
    for r in results:
        cells = [
            str(r["p"]),
            f"{r['seconds']:.2f}",
            f"{r['speedup']:.2f}",
            f"{r['model_speedup']:.2f}",
            f"{r['commit_wait_ms']:.1f}",
        ]
        if arrival:
            cells += [f"{r['arrival_seconds']:.2f}", f"{r['arrival_commit_wait_ms']:.1f}"]
        table.add_row(*cells)
    Console().print(table)


def plot(results: list[dict], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ps = [r["p"] for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(ps, [r["seconds"] for r in results], "o-", label="measured")
    t1 = results[0]["seconds"]
    left.plot(ps, [t1 / r["model_speedup"] for r in results], "s--", label="cost model (eq. 15)")
    if "arrival_seconds" in results[0]:
        left.plot(ps, [r["arrival_seconds"] for r in results], "^:", label="PVM-CC (arrival-order commits)")
    left.set_xlabel("PPU size p")
    left.set_ylabel("total maintenance time T (s)")
    left.legend()
    right.plot(ps, [r["speedup"] for r in results], "o-", label="measured")
    right.plot(ps, [r["model_speedup"] for r in results], "s--", label="cost model")
    right.set_xlabel("PPU size p")
    right.set_ylabel("speedup over SWEEP (p = 1)")
    right.legend()
    fig.suptitle(f"m={args.sources}, n={args.updates}, {args.delay_ms:g} ms per subquery, q={args.per_source_queries}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
