"""``pvm bench diff``'s report: the goals it checks, the table it prints and its plot."""

from __future__ import annotations

from typing import Any

__all__ = ["goals", "plot", "table"]


def goals(main: dict[str, Any], sweep: dict[str, Any]) -> dict[str, bool]:
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


def plot(path: str, report: dict[str, Any]) -> None:
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


def table(report: dict[str, Any]) -> Any:
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
