"""``deploy/spark-cluster.sh``: a standalone master and a worker from the pip-installed
PySpark, on loopback, run a job and a view store's commit and read, and leave no process
behind once stopped.

The session on the cluster runs in a child process: the suite's own session (``local[2]``)
lives in this one, and a process has one SparkContext, whose master is fixed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.spark.cluster_support import cluster, free_port, process_groups

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "spark-cluster.sh"

JOB = """
import json, sys
from pathlib import Path
from contract.zset import ZSet
from warehouse.store.base import Effect
from warehouse.store.spark import SparkStore
from warehouse.store.spark_session import get_spark

master, work = sys.argv[1], Path(sys.argv[2])
spark = get_spark(
    master=master,
    warehouse_dir=work / "warehouse",
    conf={"spark.executor.memory": "512m", "spark.cores.max": "1"},
    log_dir=work,
)
total = spark.range(1000).selectExpr("sum(id)").collect()[0][0]
store = SparkStore(spark, work / "store")
store.create("v", ["id", "name"], ["BIGINT", "STRING"])
store.commit("v", [Effect(1, ZSet({(1, "a"): 1, (2, "b"): 2})), Effect(2, ZSet({(1, "a"): -1}))])
store.publish("v", 2)
described = spark.sql(f"DESCRIBE FORMATTED {SparkStore.zlog_table('v')}").collect()
print(json.dumps({
    "master": spark.sparkContext.master,
    "total": total,
    "rows": sorted(store.read_rows("v")),
    "executors": spark.sparkContext._jsc.sc().getExecutorIds().size(),
    "location": next(row.data_type for row in described if row.col_name == "Location"),
}))
spark.stop()
"""


def test_a_master_and_a_worker_run_a_job_and_the_store(tmp_path: Path) -> None:
    run_dir = tmp_path / "cluster"
    port, webui, worker_webui = free_port(), free_port(), free_port()
    options = ["--host", "127.0.0.1", "--master-port", str(port), "--master-webui-port", str(webui)]
    options += ["--worker-webui-port", str(worker_webui), "--workers", "1", "--worker-memory", "1g"]
    options += ["--timeout", "50"]
    try:
        started = cluster("start", run_dir, *options)
        assert started.returncode == 0, started.stderr
        assert f"spark://127.0.0.1:{port} with 1 workers" in started.stdout
        status = cluster("status", run_dir)
        assert status.returncode == 0 and "master: running" in status.stdout and "worker-1: running" in status.stdout
        daemons = [int((run_dir / f"{name}.pid").read_text()) for name in ("master", "worker-1")]

        master = f"spark://127.0.0.1:{port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        job = subprocess.run(
            [sys.executable, "-c", JOB, master, str(tmp_path / "job")],
            capture_output=True,
            text=True,
            timeout=150,
            env=env,
            cwd=tmp_path,
        )
        assert job.returncode == 0, job.stderr[-3000:] + (tmp_path / "job" / "spark.log").read_text()[-3000:]
        result = json.loads(job.stdout.strip().splitlines()[-1])
        assert result["master"] == master and result["total"] == 499500
        assert result["rows"] == [[2, "b"], [2, "b"]]
        assert result["executors"] >= 1
        # the z-log is on the local file system, written by the worker's executor
        store = tmp_path / "job" / "store"
        assert result["location"].startswith(f"file:{store}/views/v/zlog/")
        assert list((store / "views" / "v" / "zlog").rglob("*.parquet"))
        # the executor ran under the worker: its application's directory is in the work dir
        assert any(path.name.startswith("app-") for path in (run_dir / "work-1").iterdir())
    finally:
        stopped = cluster("stop", run_dir)
    assert stopped.returncode == 0, stopped.stderr
    assert not list(run_dir.glob("*.pid"))
    left = {pgid: pids for pgid, pids in process_groups().items() if pgid in daemons}
    assert not left, f"processes left after stop: {left}"
    status = cluster("status", run_dir)
    assert status.returncode == 3 and "master: stopped" in status.stdout


def test_bad_options_are_refused(tmp_path: Path) -> None:
    wrong = cluster("start", tmp_path, "--master-port", "seventy")
    assert wrong.returncode == 1 and "not a number: 'seventy'" in wrong.stderr
    unknown = cluster("start", tmp_path, "--master", "x")
    assert unknown.returncode == 1 and "unknown option --master" in unknown.stderr
    assert cluster("restart", tmp_path).returncode == 2
    assert not list(tmp_path.glob("*.pid"))


def alive_workers(webui: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui}/json/", timeout=2) as answer:
            return int(json.load(answer).get("aliveworkers", 0))
    except OSError:
        return 0


def test_the_daemons_run_in_the_foreground_from_the_environment(tmp_path: Path) -> None:
    """What the systemd units run: ``master`` and ``worker`` with their settings from the
    environment (the units' /etc/pvm/spark.env), each ended by SIGTERM."""
    port, webui, worker_webui = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "PVM_PYTHON": sys.executable,
        "SPARK_CLUSTER_HOST": "127.0.0.1",
        "SPARK_MASTER_PORT": str(port),
        "SPARK_MASTER_WEBUI_PORT": str(webui),
        "SPARK_MASTER_URL": f"spark://127.0.0.1:{port}",
        "SPARK_WORKER_CORES": "1",
        "SPARK_WORKER_MEMORY": "512m",
        "SPARK_WORKER_WEBUI_PORT": str(worker_webui),
        "SPARK_CLUSTER_DIR": str(tmp_path / "run"),
    }
    daemons = []
    try:
        for role in ("master", "worker"):
            with open(tmp_path / f"{role}.log", "wb") as log:  # the daemon keeps its own copy
                daemons.append(subprocess.Popen([str(SCRIPT), role], env=env, stdout=log, stderr=log, cwd=tmp_path))
        deadline = time.monotonic() + 60
        while alive_workers(webui) < 1:
            assert all(daemon.poll() is None for daemon in daemons), (tmp_path / "worker.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the worker did not register"
            time.sleep(0.5)
        assert (tmp_path / "run" / "work-1").is_dir()
    finally:
        for daemon in reversed(daemons):
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
    # the JVM exits 143 on SIGTERM: the units take it as a clean stop (SuccessExitStatus=143)
    assert [daemon.returncode for daemon in daemons] == [143, 143]


def test_a_start_that_fails_stops_what_it_started(tmp_path: Path) -> None:
    run_dir = tmp_path / "cluster"
    options = ["--master-port", str(free_port()), "--master-webui-port", str(free_port())]
    options += ["--worker-webui-port", str(free_port()), "--worker-memory", "lots", "--timeout", "50"]
    started = cluster("start", run_dir, *options)
    assert started.returncode == 1 and "worker-1 ended; see" in started.stderr
    assert "Worker" in (run_dir / "worker-1.log").read_text()  # the worker's own complaint
    assert not list(run_dir.glob("*.pid"))
    assert cluster("status", run_dir).returncode == 3


def test_a_secret_that_cannot_be_read_or_written_is_refused(tmp_path: Path) -> None:
    """Before any daemon starts: a missing secret file, and a secret a Java properties file
    would have to escape."""
    missing = cluster("start", tmp_path / "a", "--auth-secret-file", str(tmp_path / "none"))
    assert missing.returncode == 1 and f"--auth-secret-file {tmp_path / 'none'}: cannot read it" in missing.stderr
    (tmp_path / "spaced").write_text("two words\n")
    spaced = cluster("start", tmp_path / "b", "--auth-secret-file", str(tmp_path / "spaced"))
    assert spaced.returncode == 1 and "the Spark secret may hold letters, digits" in spaced.stderr
    assert "two words" not in spaced.stderr
    (tmp_path / "empty").write_text("\n")
    empty = cluster("start", tmp_path / "c", "--auth-secret-file", str(tmp_path / "empty"))
    assert empty.returncode == 1 and "its first line is empty" in empty.stderr
    assert not list(tmp_path.glob("*/*.pid"))
