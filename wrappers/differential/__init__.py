"""Snapshot differential algorithms: change capture for sources that offer only dumps.

Given two snapshots of a source's ``<key, rest>`` records, report the inserts, deletes and
updates between them (Labio & Garcia-Molina, "Efficient snapshot differential algorithms
for data warehousing"), deletes sent before inserts:

* ``sort_merge_diff`` and ``partitioned_hash_diff``: outer joins that keep the previous
  snapshot (sorted, or hash-partitioned) from the last differential, each optionally with
  record compression in the ``<K,b>`` or ``<K,b,p>`` format (``Compression``);
* ``window_diff``: one pass over both snapshots with bounded aging buffers; exact when
  matching records are physically close, otherwise some useless delete-insert pairs,
  which ``remove_useless_pairs`` (the optional second pass) can take out;
* ``snapshot_distance``: how far records moved between snapshots (eq. 3);
* ``RangeChecksumCopy``: Carnes's ID/RCS, a remote copy of a queryable table with one
  checksum per key range, so that only changed ranges are shipped and differenced.

Memory budgets are parameters (``MemoryBudget``); what does not fit goes to temporary files.
Bad input raises ``SnapshotError``.

>>> r = window_diff([((1,), ("a",)), ((2,), ("b",))], [((2,), ("B",)), ((3,), ("c",))])
>>> [(c.kind, c.key) for c in r.changes]
[('delete', (1,)), ('update', (2,)), ('insert', (3,))]
"""

from wrappers.differential.compression import K_B, K_B_P, Compression, checksum, expected_clean_runs, miss_probability
from wrappers.differential.csv_dumps import CsvSnapshot, write_csv
from wrappers.differential.distance import displacement_stats, snapshot_distance
from wrappers.differential.dumps import open_snapshot
from wrappers.differential.errors import SnapshotError
from wrappers.differential.memory_snapshots import MemorySnapshot, as_snapshot, from_rows
from wrappers.differential.messages import Change, ChangeConflict, ChangeList, DiffResult, DiffStats, apply_changes
from wrappers.differential.parquet_files import ParquetSnapshot, write_parquet
from wrappers.differential.partitioned_hash import HashState, diff_in_memory, hash_state, partitioned_hash_diff
from wrappers.differential.range_checksums import KeyRange, RangeChecksumCopy, RangeSum, plan_ranges, range_sum
from wrappers.differential.record_file_snapshot import RecordSnapshot, write_records
from wrappers.differential.record_schema import Schema, check_compatible
from wrappers.differential.second_pass import remove_useless_pairs, useless_pairs
from wrappers.differential.snapshot import Snapshot
from wrappers.differential.sort_merge import SortedState, sort_merge_diff, sorted_state
from wrappers.differential.spill import IOStats, MemoryBudget
from wrappers.differential.window import window_diff

__all__ = [
    "K_B",
    "K_B_P",
    "Change",
    "ChangeConflict",
    "ChangeList",
    "Compression",
    "CsvSnapshot",
    "DiffResult",
    "DiffStats",
    "HashState",
    "IOStats",
    "KeyRange",
    "MemoryBudget",
    "MemorySnapshot",
    "ParquetSnapshot",
    "RangeChecksumCopy",
    "RangeSum",
    "RecordSnapshot",
    "Schema",
    "Snapshot",
    "SnapshotError",
    "SortedState",
    "apply_changes",
    "as_snapshot",
    "check_compatible",
    "checksum",
    "diff_in_memory",
    "displacement_stats",
    "expected_clean_runs",
    "from_rows",
    "hash_state",
    "miss_probability",
    "open_snapshot",
    "partitioned_hash_diff",
    "plan_ranges",
    "range_sum",
    "remove_useless_pairs",
    "snapshot_distance",
    "sort_merge_diff",
    "sorted_state",
    "useless_pairs",
    "window_diff",
    "write_csv",
    "write_parquet",
    "write_records",
]
