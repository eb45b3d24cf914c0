"""How much memory benchmarked processes hold, read from ``/proc`` (Linux).

>>> import os
>>> status_kib(os.getpid(), "VmRSS") > 0, status_kib(-1, "VmRSS")
(True, 0)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_MIB = 2**20


def status_kib(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` figure in KiB (``VmRSS``, ``VmHWM``); 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_mib(pid: int) -> float:
    return status_kib(pid, "VmRSS") * 1024 / _MIB


@contextmanager
def rss_peaks(pids: dict[str, int], every: float) -> Iterator[dict[str, dict[str, float]]]:
    """Per name, the process's RSS (MiB) when the block starts, its largest sample while the
    block runs (every ``every`` seconds, and once more at its end) and the growth between.

    >>> import os
    >>> with rss_peaks({"me": os.getpid()}, 0.01) as seen:
    ...     grown = b"x" * (64 * 2**20)  # written, so resident
    >>> seen["me"]["growth_mib"] >= 60
    True
    """
    out = {name: {"start_mib": rss_mib(pid)} for name, pid in pids.items()}
    for figures in out.values():
        figures["peak_mib"] = figures["start_mib"]
    stop = threading.Event()

    def sample() -> None:
        for name, pid in pids.items():
            out[name]["peak_mib"] = max(out[name]["peak_mib"], rss_mib(pid))

    def sampler() -> None:
        while not stop.wait(every):
            sample()

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()
        sample()
        for figures in out.values():
            figures["peak_mib"] = round(figures["peak_mib"], 1)
            figures["growth_mib"] = round(figures["peak_mib"] - figures["start_mib"], 1)
            figures["start_mib"] = round(figures["start_mib"], 1)
