"""The manager process's memory: long-lived objects kept out of the garbage collector's full
passes, and Arrow's buffers taken from the C library's allocator.

CPython's cyclic collector walks every tracked object of the oldest generation on each full
(generation 2) collection, and holds the GIL meanwhile: the manager's event loop, its catalog
thread and its receiving thread all stop. After startup most of those objects live as long as
the process (modules, the Spark gateway, SQLAlchemy's metadata, the web application), some
240,000 of them once the views are loaded; a full pass over them took 0.3-1.2 s on the shared
machine, about one every 11 s under the workload benchmark, and every unit, post and publish in
flight waited for it (docs/benchmarks.md, "Where a source transaction's freshness goes").
Frozen, they stay out of every collection; the objects made later (queued updates, effects,
answers) are collected as before.

Arrow's own default allocator (mimalloc, in the wheels) keeps memory it freed for reuse: in
the workload benchmark the manager's resident set moved by tens of MiB as commits, update
streams and answers came and went, and crept up through a 25-minute run (docs/benchmarks.md,
"The memory after the first minute"). Through the C library's allocator the same run reached
its working set in about ten minutes and stayed there, unchanged to the MiB.
"""

from __future__ import annotations

import gc
import os

ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def freeze_long_lived() -> int:
    """Collect the garbage there is, then move every object still alive into the collector's
    permanent generation, which no collection walks; returns how many objects it holds.

    Call once, when startup is over: what is frozen is never collected as a cycle again, so a
    cycle of frozen objects that dies later stays in memory (objects freed by their reference
    count are freed as usual). Startup's objects are made once, so this bounds that cost.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def arrow_from_the_c_allocator() -> str:
    """Have Arrow allocate its buffers with the C library's allocator (the ``system`` pool),
    unless ``ARROW_DEFAULT_MEMORY_POOL`` chose a pool; returns the pool's backend in use.
    Call before Arrow allocates anything that lives on: a buffer is freed by the pool that
    made it, whatever the default is by then."""
    import pyarrow as pa

    if ARROW_POOL_VARIABLE not in os.environ:
        pa.set_memory_pool(pa.system_memory_pool())
    return str(pa.default_memory_pool().backend_name)
