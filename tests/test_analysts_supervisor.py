"""The manager's side of the analysts' query process, without starting one: what the process
is started with (no secret of the manager's, its own OS user), the concurrency limits, and
the records it is kept informed of. The process itself: tests/spark/test_analysts_*.py."""

from __future__ import annotations

import pwd
import subprocess
import threading

import pytest

from warehouse.analysts.engine import CONNECT_TOKEN_ENV, ORPHANED_EXIT
from warehouse.analysts.supervisor import AnalystProcess, AnalystsBusy, AnalystSettings


def test_the_process_gets_no_secret_of_the_manager(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PVM_TOKEN", "PVM_MANAGER_TOKEN", "PVM_CATALOG_URL", "PVM_SOURCE_URL", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "secret")
    seen: dict = {}

    def popen(command, **kwargs):
        seen.update(kwargs, command=command)
        raise OSError("not started in this test")

    monkeypatch.setattr(subprocess, "Popen", popen)
    process = AnalystProcess(AnalystSettings(work_dir=tmp_path, spark_conf={"spark.sql.shuffle.partitions": "2"}))
    with pytest.raises(OSError):
        process._spawn()
    env = seen["env"]
    assert "secret" not in env.values()
    assert env[CONNECT_TOKEN_ENV] == process.connect_token and len(process.connect_token) >= 32
    assert process.connect_token not in " ".join(seen["command"])  # never on the command line (ps)
    assert env["HOME"] == str(tmp_path) and env["PATH"]
    assert seen["start_new_session"] and seen["user"] is None and seen["group"] is None
    assert "--spark-conf" in seen["command"] and "spark.sql.shuffle.partitions=2" in seen["command"]


def test_the_process_runs_as_its_own_user(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    account = pwd.getpwnam("nobody")
    seen: dict = {}
    chowned: list = []
    monkeypatch.setattr(
        subprocess, "Popen", lambda command, **kwargs: seen.update(kwargs) or (_ for _ in ()).throw(OSError())
    )
    monkeypatch.setattr("os.chown", lambda path, uid, gid: chowned.append((str(path), uid, gid)))
    process = AnalystProcess(AnalystSettings(work_dir=tmp_path / "analysts", user="nobody"))
    monkeypatch.setattr(process, "_watch", lambda: None)
    monkeypatch.setattr(process, "_sender", lambda: None)
    process.start()  # its scratch space becomes the user's
    assert chowned == [(str(tmp_path / "analysts"), account.pw_uid, account.pw_gid)]
    with pytest.raises(OSError):
        process._spawn()
    assert seen["user"] == "nobody" and seen["group"] == account.pw_gid


def test_limits_count_queries_per_token_and_overall(tmp_path) -> None:
    process = AnalystProcess(AnalystSettings(work_dir=tmp_path, concurrency=3, per_principal=2))
    with process.admit("a"), process.admit("a"):
        with pytest.raises(AnalystsBusy, match="the most one token may run at once"), process.admit("a"):
            pass
        with process.admit("b"):
            with pytest.raises(AnalystsBusy, match="the most the service runs at once"), process.admit("c"):
                pass
            assert process.status()["running"] == 3
    assert process.status()["running"] == 0 and not process._admitted  # nothing kept per token
    with process.admit("c"):
        pass


def test_records_keep_the_newest_per_view(tmp_path) -> None:
    class Meta:
        def __init__(self, w: int) -> None:
            self.w = w

        def to_record(self) -> dict:
            return {"watermark": self.w}

    process = AnalystProcess(AnalystSettings(work_dir=tmp_path))
    for w in range(100):
        process.publish("v", Meta(w))
    process.publish("gone", Meta(1))
    process.publish("gone", None)
    assert process._records == {"v": {"watermark": 99}}
    assert process._pending == {"v": {"watermark": 99}, "gone": None}
    assert not process.shown()  # not ready: nothing has reached a process


def test_an_analyst_user_may_read_the_store_and_nothing_else(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pvm serve --analyst-user``: the store group-readable by that user's group, the data
    directory passable but not listable, the catalog's key and the admin token private."""
    import grp
    import os
    import stat

    from pvm.serve import ADMIN_TOKEN_FILE, secure_data_dir
    from warehouse.catalog.secrets import KEY_FILE
    from warehouse.store import file_access

    group = grp.getgrgid(pwd.getpwnam("nobody").pw_gid).gr_name
    data = tmp_path / "data"
    (data / "spark" / "views" / "v").mkdir(parents=True)
    (data / "spark" / "views" / "v" / "part-0.parquet").write_text("rows")
    (data / KEY_FILE).write_text("key")
    (data / ADMIN_TOKEN_FILE).write_text("token")
    monkeypatch.setattr(file_access, "_store_files", file_access.OWNER_ONLY)
    umask = os.umask(0o022)
    try:
        secure_data_dir(data, "nobody")
        assert file_access.spark_settings() == {"spark.hadoop.fs.permissions.umask-mode": "027"}
    finally:
        os.umask(umask)

    def mode(path):
        st = os.stat(path)
        return stat.S_IMODE(st.st_mode), grp.getgrgid(st.st_gid).gr_name

    assert mode(data) == (0o2710, group)
    assert mode(data / "spark" / "views" / "v") == (0o2750, group)
    assert mode(data / "spark" / "views" / "v" / "part-0.parquet") == (0o640, group)
    assert stat.S_IMODE(os.stat(data / KEY_FILE).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(data / ADMIN_TOKEN_FILE).st_mode) == 0o600


async def test_sql_is_checked_after_admission_on_the_analysts_own_threads(tmp_path, monkeypatch) -> None:
    """Checking analyst SQL parses it, which takes a while for a long statement: it must run
    neither on the event loop nor on the default pool that commits, publishes and token checks
    share, and a request over the limits must not cost a check at all."""
    process = AnalystProcess(AnalystSettings(work_dir=tmp_path, concurrency=1, per_principal=1))
    checked_on: list[str] = []

    def check(sql: str) -> str:
        checked_on.append(threading.current_thread().name)
        return sql

    async def answer(path: str, body: str, tag: str) -> dict:
        return {"columns": ["x"], "rows": [[1]], "truncated": False}

    monkeypatch.setattr(process, "_call", answer)
    result = await process.query("SELECT 1", 10, "a", check=check)
    assert result.rows == [[1]]
    assert checked_on and checked_on[0].startswith("analyst-check"), checked_on
    assert not checked_on[0].startswith("asyncio")  # not asyncio.to_thread's default pool

    with process.admit("b"), pytest.raises(AnalystsBusy):  # the one slot is taken: refused before any check
        await process.query("SELECT 2", 10, "a", check=check)
    assert len(checked_on) == 1
    process._checks.shutdown()


def test_relations_reach_the_query_process_with_their_values_and_weights() -> None:
    """A verification sends the relations as JSON: non-finite floats travel tagged, every NaN
    comes back as the one object Z-sets can cancel, and 1, 1.0, True and "1" stay apart."""
    from contract.schemas import NAN
    from contract.zset import ZSet
    from warehouse.analysts.messages import VerifyRelation, VerifyRequest, VerifyResult
    from warehouse.analysts.verification import relation_contents

    contents = ZSet({(1, float("nan")): 2, (1.0, float("inf")): -1, (True, None): 1, ("1", 2**63 - 1): 3})
    request = VerifyRequest(
        record={},
        as_of=7,
        sql="SELECT 1",
        relations=[
            VerifyRelation(name="r", label="s.r", columns=["a", "b"], rows=[[*r, w] for r, w in contents.items()])
        ],
        max_differences=5,
    )
    received = VerifyRequest.model_validate_json(request.model_dump_json())
    assert relation_contents(received.relations[0]) == ZSet(
        {(1, NAN): 2, (1.0, float("inf")): -1, (True, None): 1, ("1", 2**63 - 1): 3}
    )
    assert [type(r[0]) for r, _ in relation_contents(received.relations[0]).items()] == [int, float, bool, str]
    result = VerifyResult(
        expected_rows=1, stored_rows=0, missing=[([NAN], 1)], extra=[], missing_total=1, extra_total=0
    )
    assert VerifyResult.model_validate_json(result.model_dump_json()).missing[0][0][0] is NAN


async def test_a_token_whose_work_keeps_ending_the_process_is_suspended(tmp_path) -> None:
    """One statement can end the query process (exhaust its heap) however well it is checked,
    and a restart takes 20 s or so: sent again at every restart it would keep every analyst
    out. The tokens with work running at each death get a strike; from the second on they
    are refused for a while (429 with Retry-After), and the others go on."""
    from types import SimpleNamespace

    from api.analyst import analyst_status
    from warehouse.analysts.supervisor import AnalystsUnavailable, AnalystSuspended

    process = AnalystProcess(AnalystSettings(work_dir=tmp_path, concurrency=4, per_principal=2))
    process._ready.set()
    for pid in (101, 102):  # two processes die under mallory's query (no socket: it breaks off)
        process._process = SimpleNamespace(pid=pid)  # type: ignore[assignment]
        with pytest.raises(AnalystsUnavailable, match="ended while answering"):
            await process.query("SELECT 1", 10, "mallory")
        if pid == 101:  # the same death seen again (by the watcher): no second strike
            process._admitted["mallory"] = 1
            process._strike_running()
            del process._admitted["mallory"]
            assert process.suspensions.strikes("mallory") == 1
        process._ready.set()
    with pytest.raises(AnalystSuspended, match="refused for") as refused:
        await process.query("SELECT 1", 10, "mallory")
    assert analyst_status(refused.value) == 429 and 25 <= refused.value.retry_after <= 30
    assert process.suspensions.strikes("mallory") == 2
    with pytest.raises(AnalystsUnavailable):  # anyone else is still let in
        await process.query("SELECT 1", 10, "alice")
    process._checks.shutdown()


def test_the_process_ends_with_the_manager_that_started_it(tmp_path) -> None:
    """A manager killed with -9 cannot end its analysts' query process: the process ends
    itself, JVM and all, instead of every restart leaving one more behind."""
    import os
    import signal
    import sys
    import time

    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-m', 'api.analysts_worker', '--socket', sys.argv[1],"
            " '--work-dir', sys.argv[2], '--parent-pid', str(os.getpid())], start_new_session=True,"
            " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(120)\n",
            str(tmp_path / "q.sock"),
            str(tmp_path / "work"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    worker = int(parent.stdout.readline())

    def group_alive() -> bool:
        try:
            os.killpg(worker, 0)
        except ProcessLookupError:
            return False
        return True

    time.sleep(1.0)
    assert group_alive()  # the worker runs (it is starting its Spark)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(10)

    deadline = time.monotonic() + 20
    while group_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = group_alive()
    if alive:
        os.killpg(worker, signal.SIGKILL)
    assert not alive, "the orphaned query process (or its JVM) kept running"


def test_a_process_whose_manager_died_before_it_looked_exits_at_once(tmp_path) -> None:
    """The manager can die while the query process is still importing; by the time it looks,
    another process is its parent. Told the manager's pid, it exits before starting Spark."""
    import sys

    started = subprocess.run(
        [
            sys.executable,
            "-m",
            "api.analysts_worker",
            "--socket",
            str(tmp_path / "q.sock"),
            "--work-dir",
            str(tmp_path / "work"),
            "--parent-pid",
            "1",  # not this test, its parent: as if the manager had already gone
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == ORPHANED_EXIT, started.stderr
    assert "the manager that started this process is gone" in started.stderr
    assert not (tmp_path / "work" / "spark.log").exists()  # no JVM was started
