"""``pvm demo`` as a new user runs it, made small: real wrapper processes over SQLite
sources, the manager's HTTP API, the in-memory store, a few dozen transactions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_small_demo_verifies_and_says_what_to_try_next(tmp_path):
    command = [
        sys.executable,
        "-m",
        "pvm",
        "demo",
        "--store",
        "memory",
        "--transactions",
        "30",
        "--rate",
        "300",
        "--data-dir",
        str(tmp_path / "demo"),
    ]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "maintaining order_details" in out  # the live display
    assert "first rows of" in out
    for view in ("order_details", "region_sales"):  # the join and the aggregate over it
        assert f"verified: view {view} equals its recomputation from the live sources" in out
    assert "MISMATCH" not in out and "view region_sales: first rows of" in out
    explore = out[out.index("keep exploring") :]
    assert "pvm demo --serve" in explore and "pvm query" in explore and "/docs" in explore
    assert (tmp_path / "demo" / "catalog.db").exists()
