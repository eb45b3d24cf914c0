"""Spark's startup lines stay off the terminal: a session started as ``pvm serve`` and
``pvm demo`` start theirs (``open_store``, in a process of its own, like theirs) writes
nothing to stderr, and its log lines are in ``<data-dir>/spark.log``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from pathlib import Path
from pvm.serve import open_store
data_dir = Path(sys.argv[1])
store = open_store("spark", data_dir, "local[1]", f"sqlite:///{data_dir / 'catalog.db'}")
assert store.spark.range(3).count() == 3
print("started")
"""


def test_spark_startup_writes_nothing_to_the_terminal(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"}
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(data_dir)], capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "started"
    noise = [line for line in done.stderr.splitlines() if line.strip()]
    assert noise == [], noise  # no "Using Spark's default log4j profile", "WARN Utils: …", "WARNING: …"
    assert (data_dir / "spark.log").exists()
    assert "log4j" not in done.stdout and "WARN" not in done.stdout
