"""``within_registration``: the start of a Spark session on a standalone master, bounded from
the moment its JVM runs (``warehouse.store.spark_cluster``; the real master's refusal is in
tests/spark/test_cluster_deployment.py)."""

from __future__ import annotations

import threading
import time

import pytest

from warehouse.store.spark_cluster import NotAccepted, within_registration


def test_what_the_start_returns_is_returned() -> None:
    assert within_registration(lambda: "session", lambda: True, 5) == "session"


def test_what_the_start_raises_is_raised() -> None:
    def fail() -> str:
        raise RuntimeError("All masters are unresponsive! Giving up.")

    with pytest.raises(RuntimeError, match="All masters are unresponsive"):
        within_registration(fail, lambda: True, 5)


def test_a_start_that_never_returns_ends_at_the_timeout() -> None:
    never = threading.Event()
    started = time.monotonic()
    with pytest.raises(NotAccepted, match="within 0.3 s"):
        within_registration(never.wait, lambda: True, 0.3, interval_s=0.02)
    assert 0.3 <= time.monotonic() - started < 3
    never.set()


def test_the_clock_starts_when_the_jvm_runs() -> None:
    """A JVM that takes its time to start is not counted against the master."""
    jvm_up_at = time.monotonic() + 0.5
    returned_at = jvm_up_at + 0.2

    def start() -> str:
        time.sleep(max(0.0, returned_at - time.monotonic()))
        return "session"

    assert within_registration(start, lambda: time.monotonic() >= jvm_up_at, 0.3, interval_s=0.02) == "session"
