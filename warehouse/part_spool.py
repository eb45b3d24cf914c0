"""A term's delta cut into parts on disk: for a unit whose updates keep their deltas in the
update log only (``ViewUpdate.logged``).

Such a delta is larger than anything a unit holds at once, so it is never summed in memory:
its rows are read from the log a part of the log at a time and appended, by their part
(``unit_parts.row_part``, the same hash as a delta cut in memory), to one file per part.
Sweeping part ``i`` then loads that file alone and sums its rows into a Z-set: rows that
cancel across the unit's updates meet in the same part, so each part is exactly the
in-memory cut's part ``i`` of the summed delta. Memory holds one part, and the rows
buffered before they are written (``FLUSH_ROWS`` in all).

The files are the spool's own, in a private temporary directory, removed when the unit is
done (``close``); they hold Python values (pickle), read back only by this process.

>>> import tempfile
>>> from pathlib import Path
>>> from contract.zset import ZSet
>>> from warehouse import unit_parts
>>> delta = ZSet({(i, "x"): 1 for i in range(10)})
>>> with tempfile.TemporaryDirectory() as d:
...     spool = Spool(Path(d), count=3)
...     spool.add(ZSet({(i, "x"): 1 for i in range(6)}))
...     spool.add(ZSet({(i, "x"): 1 for i in range(6, 10)}))
...     [spool.part(i) for i in range(3)] == unit_parts.cut(delta, 3)
True
"""

from __future__ import annotations

import pickle
from pathlib import Path

from contract.zset import Row, ZSet
from warehouse.unit_parts import row_part

FLUSH_ROWS = 10_000
"""Rows a spool buffers over all its parts before it appends them to their files."""


class Spool:
    """``count`` part files under ``directory``, appended to by ``add``, read by ``part``."""

    def __init__(self, directory: Path, count: int) -> None:
        self.directory = directory
        self.count = count
        self._buffered: dict[int, list[tuple[Row, int]]] = {}
        self._rows = 0

    def add(self, delta: ZSet) -> None:
        """Append ``delta``'s rows, each to its part."""
        for row, weight in delta.items():
            self._buffered.setdefault(row_part(row, self.count), []).append((row, weight))
            self._rows += 1
            if self._rows >= FLUSH_ROWS:
                self._flush()

    def part(self, index: int) -> ZSet:
        """Part ``index``: the sum of every row appended to it."""
        self._flush()
        out = ZSet()
        path = self._path(index)
        if not path.exists():
            return out
        with path.open("rb") as f:
            while True:
                try:
                    batch: list[tuple[Row, int]] = pickle.load(f)
                except EOFError:
                    return out
                for row, weight in batch:
                    out.add(row, weight)

    def _flush(self) -> None:
        for index, batch in self._buffered.items():
            with self._path(index).open("ab") as f:
                pickle.dump(batch, f, protocol=pickle.HIGHEST_PROTOCOL)
        self._buffered, self._rows = {}, 0

    def _path(self, index: int) -> Path:
        return self.directory / f"part-{index}.pickle"
