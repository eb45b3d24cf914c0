"""Who may read the view store's files (the Spark store's parquet tables): one choice, here.

Today only the service's own user: directories 0700, files 0600, like the catalog. A query
process running as another OS user that must read the store (and nothing else of the data
directory) gets it by changing ``STORE_FILES`` alone, e.g. to
``FileModes(dir_mode=0o750, file_mode=0o640, group="pvm-readers")``: ``pvm serve`` applies
it to what exists under ``<data-dir>/spark`` on start, the store creates its directories
with it, and Spark writes its files with the matching Hadoop umask (``spark_settings``).
That user must also be let through the data directory itself (0700 today, ``pvm serve``'s
``secure_data_dir``): 0710 with that group lets it pass without listing the directory.

>>> spark_settings(FileModes(dir_mode=0o750, file_mode=0o640))
{'spark.hadoop.fs.permissions.umask-mode': '027'}
"""

from __future__ import annotations

from warehouse.file_modes import FileModes

STORE_FILES = FileModes(dir_mode=0o700, file_mode=0o600)


def spark_settings(modes: FileModes = STORE_FILES) -> dict[str, str]:
    """The Spark settings that make the files Spark writes have ``modes``: Hadoop's local
    file system ignores the process's umask and sets 0755/0644 itself unless told its own
    umask (the bits neither the directory nor the file mode grants)."""
    umask = 0o777 & ~(modes.dir_mode | modes.file_mode)
    return {"spark.hadoop.fs.permissions.umask-mode": f"{umask:03o}"}
