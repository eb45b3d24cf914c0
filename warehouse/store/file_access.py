"""Who may read the view store's files (the Spark store's parquet tables): one choice, here.

By default only the service's own user: directories 0700, files 0600, like the catalog.
``pvm serve --analyst-user NAME`` runs the analysts' query process as another OS user, which
must read the store (and nothing else of the data directory): ``share_with_group`` makes the
store group-readable by that user's group (directories 0750 with the set-group-ID bit, files
0640). ``pvm serve`` applies the choice to what exists under ``<data-dir>/spark`` on start,
the store creates its directories with it, and Spark writes its files with the matching
Hadoop umask (``spark_settings``). The data directory itself then lets that group pass
without listing it (0710, ``pvm serve``'s ``secure_data_dir``).

Call ``share_with_group`` before anything reads the choice (before the Spark session starts).

>>> spark_settings(FileModes(dir_mode=0o750, file_mode=0o640))
{'spark.hadoop.fs.permissions.umask-mode': '027'}
"""

from __future__ import annotations

from contract.file_modes import FileModes

OWNER_ONLY = FileModes(dir_mode=0o700, file_mode=0o600)

_store_files = OWNER_ONLY


def store_files() -> FileModes:
    """The modes (and group) of the store's files in this process."""
    return _store_files


def share_with_group(group: str) -> FileModes:
    """Let ``group`` read the store's files (not write them); returns the new choice."""
    global _store_files
    _store_files = FileModes(dir_mode=0o750, file_mode=0o640, group=group)
    return _store_files


def spark_settings(modes: FileModes | None = None) -> dict[str, str]:
    """The Spark settings that make the files Spark writes have ``modes`` (default: this
    process's choice): Hadoop's local file system ignores the process's umask and sets
    0755/0644 itself unless told its own umask (the bits neither the directory nor the file
    mode grants)."""
    modes = modes or _store_files
    umask = 0o777 & ~(modes.dir_mode | modes.file_mode)
    return {"spark.hadoop.fs.permissions.umask-mode": f"{umask:03o}"}
