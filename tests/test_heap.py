"""The manager's long-lived objects leave the collector's generations, and Arrow allocates
from the C library (pvm/heap.py)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator

import pytest

from pvm.heap import ARROW_POOL_VARIABLE, freeze_long_lived


@pytest.fixture
def unfreeze_after() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test process collects as usual


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_freezing_keeps_live_objects_out_of_collections_and_drops_garbage(unfreeze_after: None) -> None:
    kept = Node()
    garbage = Node()
    gone = weakref.ref(garbage)
    del garbage  # unreachable, but alive until a collection finds the cycle

    frozen = freeze_long_lived()

    assert frozen == gc.get_freeze_count() > 0
    ids = {id(o) for generation in (0, 1, 2) for o in gc.get_objects(generation)}
    assert id(kept) not in ids  # no collection walks it any more
    assert gone() is None  # collected before freezing, not frozen
    # objects made afterwards are collected as before
    later = Node()
    assert id(later) in {id(o) for o in gc.get_objects(0)}


@pytest.mark.parametrize(("chosen", "backend"), [(None, "system"), ("jemalloc", "jemalloc")])
def test_arrow_allocates_from_the_c_library_unless_a_pool_is_chosen(chosen: str | None, backend: str) -> None:
    """In a process of its own: the pool is the process's default from then on."""
    env = {k: v for k, v in os.environ.items() if k != ARROW_POOL_VARIABLE}
    if chosen is not None:
        env[ARROW_POOL_VARIABLE] = chosen
    code = "from pvm.heap import arrow_from_the_c_allocator as use; import pyarrow as pa; print(use(), pa.array([1]).buffers()[1] is not None)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [backend, "True"]
