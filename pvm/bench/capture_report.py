"""``pvm bench capture``'s report: the lines it prints as each part ends, and its plot."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["GOALS", "plot", "print_freshness_ratios", "print_freshness_run", "print_write_cost"]

# Issue 15's goals: log capture costs the writers at most 1.05 times their time without
# capture, and keeps the view at least as fresh as trigger capture at the same rate.
GOALS = {"log_write_cost_ratio": 1.05, "log_to_trigger_freshness_ratio": 1.0}
SOURCES = {"pg": "PostgreSQL", "my": "MariaDB", "lite": "SQLite"}


def print_write_cost(costs: dict[str, dict[str, Any]]) -> None:
    """Per server: throughput at the median run (slowest-fastest run), the median time ratio
    to no capture (the spread of that ratio within a round), WAL written per transaction
    (PostgreSQL), and what the writers wrote to the binary log (MariaDB)."""
    for name, cost in costs.items():
        spread = cost["spread"]
        rates = ", ".join(
            f"{mode} {tps:.0f} tx/s ({spread['transactions_per_second'][mode]['min']:.0f}-"
            f"{spread['transactions_per_second'][mode]['max']:.0f})"
            for mode, tps in cost["transactions_per_second"].items()
        )
        ratios = ", ".join(
            f"{method}/none {ratio:.3f} (in a round {spread['ratio_in_round'][method]['min']:.3f}-"
            f"{spread['ratio_in_round'][method]['max']:.3f}, median {spread['ratio_in_round'][method]['median']:.3f})"
            + (f" (goal <= {GOALS['log_write_cost_ratio']})" if method == "log" else "")
            for method, ratio in cost["ratio_to_none"].items()
        )
        print(f"{name:10s} write cost: {rates}; time ratio {ratios}")
        if "wal_bytes_per_transaction" in cost:
            written = ", ".join(f"{mode} {b:.0f}" for mode, b in cost["wal_bytes_per_transaction"].items())
            print(f"{'':10s} WAL bytes per transaction (median run): {written}")
        if "binlog_bytes_per_transaction" in cost:
            without = ", ".join(mode for mode, on in cost["binary_log"].items() if not on) or "none"
            written = ", ".join(f"{mode} {b:.0f}" for mode, b in cost["binlog_bytes_per_transaction"].items())
            prepares = ", ".join(f"{mode} {sum(runs)}" for mode, runs in cost["handler_prepares"].items())
            print(
                f"{'':10s} writers without the binary log (sql_log_bin = 0): {without}; binary log bytes per "
                f"transaction (median run): {written}; two-phase commit prepares (all runs): {prepares}"
            )


def print_freshness_run(method: str, run: dict[str, Any], label: str = "") -> None:
    methods = ", ".join(f"{SOURCES[s]} {m}" for s, m in run["capture"].items())
    print(
        f"{label}view over PostgreSQL + MariaDB + SQLite ({methods}): {run['source_transactions_committed']} random "
        f"({run['source_transactions_per_second']:.0f} tx/s) and {run['marker_transactions']} marker transactions "
        f"in {run['writing_seconds']:.1f} s; converged {run['converged_seconds_after_writers']:.2f} s after the "
        f"writers; oracle {run['oracle']} at {run['watermarks_checked_by_oracle']} watermarks"
    )
    for source, lag in run["freshness_seconds"].items():
        print(f"  freshness {source:4s}: p50 {lag['p50']:.3f} s, p95 {lag['p95']:.3f} s, max {lag['max']:.3f} s")
    subqueries = ", ".join(
        f"{source} {sub['count']} x {1000 * sub['mean_seconds']:.1f} ms" for source, sub in run["subqueries"].items()
    )
    print(f"  subqueries (number x mean time): {subqueries}")
    restarts = run.get("restarts")
    if restarts is not None:
        print(
            f"  restarted while the writers ran: wrappers {', '.join(restarts['wrappers'])} (SIGKILL), then the "
            f"manager ({restarts['manager']}); the writers went on until the manager was back"
        )


def print_freshness_ratios(
    ratios: dict[str, dict[str, float]], by_round: Sequence[dict[str, dict[str, float]]] = ()
) -> None:
    """The pooled ratios, and the spread of the p50 ratio over the rounds."""
    goal = GOALS["log_to_trigger_freshness_ratio"]
    for source, ratio in ratios.items():
        note = "  (SQLite: triggers in both runs)" if source == "lite" else f"  (goal <= {goal:.2f})"
        rounds = sorted(r[source]["p50"] for r in by_round if source in r)
        spread = (
            f"; p50 in a round {rounds[0]:.2f}-{rounds[-1]:.2f}, median {statistics.median(rounds):.2f}"
            if len(rounds) > 1
            else ""
        )
        print(
            f"  freshness log/trigger {source:4s}: p50 {ratio['p50']:.2f}, p95 {ratio['p95']:.2f}, "
            f"max {ratio['max']:.2f}{spread}{note}"
        )


def plot(results: dict[str, Any], png: Path) -> None:
    """Left: each method's write time over none's, per server, with the range of that ratio
    within a round. Right: freshness p50 and p95 per source, per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [part for part in ("write_cost", "freshness") if part in results]
    fig, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 4.5), squeeze=False)
    for ax, part in zip(axes[0], parts):
        if part == "write_cost":
            _plot_write_cost(ax, results["write_cost"])
        else:
            _plot_freshness(ax, results["freshness"]["runs"])
    fig.suptitle("pvm bench capture")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _plot_write_cost(ax: Any, costs: dict[str, dict[str, Any]]) -> None:
    servers = list(costs)
    methods = list(next(iter(costs.values()))["ratio_to_none"])
    width = 0.8 / len(methods)
    for k, method in enumerate(methods):
        xs = [i + (k - (len(methods) - 1) / 2) * width for i in range(len(servers))]
        ratios = [costs[s]["ratio_to_none"][method] for s in servers]
        in_round = [costs[s]["spread"]["ratio_in_round"][method] for s in servers]
        spread = [
            [max(0.0, r - i["min"]) for r, i in zip(ratios, in_round)],
            [max(0.0, i["max"] - r) for r, i in zip(ratios, in_round)],
        ]
        ax.bar(xs, ratios, width, yerr=spread, capsize=3, label=f"{method} capture", color=f"C{k}")
        for x, r in zip(xs, ratios):
            ax.text(x, r, f"{r:.2f}", ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="black", lw=1, label="no capture")
    if "log" in methods:
        ax.axhline(GOALS["log_write_cost_ratio"], color="C1", ls="--", lw=1, label="log capture goal")
    ax.set_xticks(range(len(servers)), servers)
    ax.set_ylabel("writers' time / time without capture (median; bars: range in a round)")
    ax.set_title("write cost")
    ax.legend(fontsize=8)


def _plot_freshness(ax: Any, runs: dict[str, dict[str, Any]]) -> None:
    sources = [s for s in SOURCES if all(s in run["freshness_seconds"] for run in runs.values())]
    bars = [(method, q) for method in runs for q in ("p50", "p95")]
    width = 0.8 / len(bars)
    for k, (method, q) in enumerate(bars):
        xs = [i + (k - (len(bars) - 1) / 2) * width for i in range(len(sources))]
        values = [runs[method]["freshness_seconds"][s][q] for s in sources]
        color = f"C{list(runs).index(method)}"
        ax.bar(xs, values, width, label=f"{method} capture {q}", color=color, alpha=1.0 if q == "p50" else 0.5)
    ax.set_xticks(range(len(sources)), [f"{SOURCES[s]}" for s in sources])
    ax.set_ylabel("marker commit to visible as of W (s)")
    ax.set_title("freshness (SQLite: triggers in every run)")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.3)  # room for the legend above the bars
    ax.legend(fontsize=8, ncol=2, loc="upper left")
