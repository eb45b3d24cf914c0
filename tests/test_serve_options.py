"""``pvm serve`` options checked before anything starts (no Spark, no socket): the commit
interval, Spark Connect (off by default, refused off loopback without TLS), the analysts'
query process, and how long compacted table versions are kept for analysts' queries."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import pytest

import api.analyst
from pvm import serve
from pvm.cli import CliError, build_parser, main
from warehouse.log_pruning import DEFAULT_RETENTION_S, LogPruning
from warehouse.store.spark_connect import ConnectError, is_loopback, start_connect_server


def pvm(capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_spark_connect_is_off_unless_configured() -> None:
    assert build_parser(["serve"]).parse_args(["serve"]).connect_port == -1


@pytest.fixture(autouse=True)
def process_umask() -> Iterator[None]:
    """``pvm serve`` run in this process sets its umask; the tests after it keep theirs."""
    umask = os.umask(0o022)
    os.umask(umask)
    yield
    os.umask(umask)


@pytest.mark.parametrize(
    "hosts",
    [["--host", "0.0.0.0"], ["--connect-host", "10.1.2.3"], ["--host", "::"], ["--connect-host", "myhost.example"]],
)
def test_spark_connect_off_loopback_without_tls_is_refused(tmp_path, capsys, hosts: list[str]) -> None:
    data = tmp_path / "data"
    code, err = pvm(capsys, "serve", "--data-dir", str(data), "--port", "0", "--connect-port", "0", *hosts)
    assert code == 2, err
    assert "pvm: error: Spark Connect on" in err and "needs TLS" in err
    assert "--connect-tls-cert" in err and "--connect-host 127.0.0.1" in err
    assert not data.exists()  # refused before the catalog, the socket or Spark


@pytest.mark.parametrize(
    "argv",
    [
        ["--host", "0.0.0.0", "--connect-host", "127.0.0.1", "--connect-port", "0"],
        ["--host", "0.0.0.0"],  # Spark Connect off
        ["--connect-host", "localhost", "--connect-port", "0"],
        ["--connect-host", "::1", "--connect-port", "0"],
        ["--connect-port", "0"],  # on the default host, 127.0.0.1
    ],
)
def test_spark_connect_on_loopback_passes(argv: list[str]) -> None:
    serve.check_options(build_parser(["serve"]).parse_args(["serve", *argv]))


def test_spark_connect_off_loopback_with_tls_passes(tmp_path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("-"), key.write_text("-")
    tls = ["--connect-tls-cert", str(cert), "--connect-tls-key", str(key)]
    serve.check_options(build_parser(["serve"]).parse_args(["serve", "--host", "0.0.0.0", "--connect-port", "0", *tls]))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--connect-port", "0", "--store", "memory"], "--connect-port needs the Spark store"),
        (["--connect-port", "0", "--connect-tls-cert", "/nonexistent/cert.pem"], "go together"),
        (
            ["--connect-port", "0", "--connect-tls-cert", "/nonexistent/c", "--connect-tls-key", "/nonexistent/k"],
            "no such file",
        ),
        (["--analyst-concurrency", "0"], "at least 1"),
        (["--query-timeout", "0"], "--query-timeout"),
        (["--query-timeout", "nan"], "--query-timeout"),
        (["--max-result-bytes", "10"], "--max-result-bytes"),
        (["--analyst-user", "no-such-user-here"], "no such OS user"),
    ],
)
def test_bad_analyst_options_are_refused(tmp_path, capsys, argv: list[str], message: str) -> None:
    code, err = pvm(capsys, "serve", "--data-dir", str(tmp_path / "d"), *argv)
    assert code == 2 and message in err, err
    assert not (tmp_path / "d").exists()


def test_the_connect_server_itself_refuses_a_public_host_without_a_token() -> None:
    with pytest.raises(ConnectError, match="not loopback"):
        start_connect_server(None, "0.0.0.0", 0, None)  # type: ignore[arg-type]  (refused before Spark is touched)
    assert [is_loopback(h) for h in ("127.0.0.1", "127.8.9.1", "localhost", "::1", "[::1]")] == [True] * 5
    assert [is_loopback(h) for h in ("0.0.0.0", "::", "", "10.0.0.1", "localhost.evil.com")] == [False] * 5


@pytest.mark.parametrize("value", ["-1", "-0.5", "nan", "inf"])
def test_commit_linger_must_be_finite_and_not_negative(tmp_path, capsys, value: str) -> None:
    code, err = pvm(capsys, "serve", "--data-dir", str(tmp_path / "d"), "--store", "memory", f"--commit-linger={value}")
    assert code == 2 and "--commit-linger" in err, err


@pytest.mark.parametrize("value", ["0", "-3"])
@pytest.mark.parametrize("option", ["--seq-window", "--max-verifications", "--max-queued-changes", "--unit-part-rows"])
def test_counts_must_be_positive(tmp_path, capsys, value: str, option: str) -> None:
    code, err = pvm(capsys, "serve", "--data-dir", str(tmp_path / "d"), "--store", "memory", f"{option}={value}")
    assert code == 2 and option in err, err


def test_commit_linger_reaches_the_manager(tmp_path, capsys, monkeypatch) -> None:
    import warehouse.manager

    seen: dict = {}

    class Stop(Exception):
        pass

    def fake_manager(url, store, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(warehouse.manager, "Manager", fake_manager)
    with pytest.raises(Stop):
        main(
            [
                "serve",
                "--data-dir",
                str(tmp_path),
                "--store",
                "memory",
                "--port",
                "0",
                "--commit-linger",
                "0.25",
                "--commit-group-size",
                "7",
                "--seq-window",
                "50",
                "--max-queued-changes",
                "300",
                "--unit-part-rows",
                "2000",
                "--max-verifications",
                "2",
                "--change-log-warning-mb",
                "64",
                "--log-retention",
                "86400",
            ]
        )
    # the memory store: no analysts' query process
    assert seen == {
        "commit_group_size": 7,
        "commit_linger": 0.25,
        "catalog_key_file": tmp_path / "catalog.key",
        "stall_after_s": 60.0,
        "seq_window": 50,
        "max_queued_changes": 300,
        "unit_part_rows": 2000,
        "max_verifications": 2,
        "change_log_warning_bytes": 64 << 20,
        "log_pruning": LogPruning(retention_s=86400.0),
    }
    assert build_parser(["serve"]).parse_args(["serve"]).commit_linger == 0.0
    with pytest.raises(Stop):
        main(["serve", "--data-dir", str(tmp_path), "--store", "memory", "--keep-update-log"])
    assert seen["log_pruning"] is None  # the whole log kept
    with pytest.raises(Stop):
        main(["serve", "--data-dir", str(tmp_path), "--store", "memory"])
    assert seen["log_pruning"] == LogPruning(retention_s=DEFAULT_RETENTION_S)  # pruned by default


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_log_retention_must_be_finite_and_not_negative(tmp_path, capsys, value: str) -> None:
    code, err = pvm(capsys, "serve", "--data-dir", str(tmp_path / "d"), "--store", "memory", f"--log-retention={value}")
    assert code == 2 and "--log-retention" in err, err


def test_compacted_versions_outlive_the_query_timeout(monkeypatch) -> None:
    """Old table versions must stay until every query planned on them has finished or been
    ended; the retention follows the timeout (default or --query-timeout) and its grace."""
    parser = build_parser(["serve"])
    assert serve.retention_s(parser.parse_args(["serve"])) >= api.analyst.QUERY_TIMEOUT_S + 10
    monkeypatch.setattr(api.analyst, "QUERY_TIMEOUT_S", 900.0)
    assert serve.retention_s(parser.parse_args(["serve"])) >= 900.0
    assert serve.retention_s(parser.parse_args(["serve", "--query-timeout", "2000"])) >= 2000.0


@pytest.mark.parametrize("store", ["spark", "memory"])
@pytest.mark.parametrize("pair", ["spark.driver.memory", "driver.memory=4g", "spark.sql.shuffle.partitions=", "=x"])
def test_spark_conf_must_be_a_spark_setting_with_a_value(tmp_path, capsys, pair: str, store: str) -> None:
    code, err = pvm(capsys, "serve", "--data-dir", str(tmp_path / "d"), "--store", store, "--spark-conf", pair)
    assert code == 2 and "--spark-conf" in err and "spark.<setting>=<value>" in err, err
    assert not (tmp_path / "d").exists() and "PVM_TOKEN" not in err  # refused before anything


def test_spark_conf_reaches_the_session(tmp_path, monkeypatch) -> None:
    seen: dict = {}

    class Stop(Exception):
        pass

    def fake_open_store(kind, data_dir, master, url, spark_conf=None, retire_after_s=0.0, host=None, *more):
        seen.update(spark_conf)
        raise Stop

    monkeypatch.setattr(serve, "open_store", fake_open_store)
    with pytest.raises(Stop):
        main(
            [
                "serve",
                "--data-dir",
                str(tmp_path),
                "--port",
                "0",
                "--spark-conf",
                "spark.driver.extraJavaOptions=-XX:+UseParallelGC -Dx=a=b",
                "--spark-conf",
                "spark.sql.shuffle.partitions=8",
            ]
        )
    assert seen == {"spark.driver.extraJavaOptions": "-XX:+UseParallelGC -Dx=a=b", "spark.sql.shuffle.partitions": "8"}


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_sparks_driver_listens_on_the_services_host(tmp_path, monkeypatch, host: str) -> None:
    """The store's session binds the driver's ports to ``--host`` (``bind_settings``; the
    shared test session's sockets are checked in tests/spark/test_spark_exposure.py)."""
    from warehouse.store.spark_session import bind_settings

    seen: dict = {}

    class Stop(Exception):
        pass

    def fake_open_store(kind, data_dir, master, url, spark_conf=None, retire_after_s=0.0, host=None, *more):
        seen["host"] = host
        raise Stop

    monkeypatch.setattr(serve, "open_store", fake_open_store)
    with pytest.raises(Stop):
        main(["serve", "--data-dir", str(tmp_path), "--port", "0", "--connect-port", "-1", "--host", host])
    assert seen == {"host": host}
    assert bind_settings(host)["spark.driver.bindAddress"] == host


# -- Spark's shared secret, and the wait for executors -------------------------------------------


def test_the_spark_secret_is_never_a_spark_conf_value(tmp_path, capsys) -> None:
    code, err = pvm(capsys, "serve", "--data-dir", str(tmp_path / "d"), "--spark-conf", "spark.authenticate.secret=s3")
    assert code == 2 and "--spark-conf spark.authenticate.secret: a secret is not given" in err, err
    assert "--spark-auth-secret-file FILE or $PVM_SPARK_AUTH_SECRET" in err and "s3" not in err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--store", "memory", "--spark-auth-secret-file", "SECRET"], "--spark-auth-secret-file needs the Spark store"),
        (["--spark-auth-secret-file", "MISSING"], "--spark-auth-secret-file MISSING: cannot read it"),
        (["--spark-executor-timeout", "0"], "--spark-executor-timeout must be a positive number of seconds"),
        (["--spark-executor-timeout", "nan"], "--spark-executor-timeout must be a positive number of seconds"),
    ],
)
def test_bad_spark_cluster_options_are_refused(tmp_path, capsys, monkeypatch, argv: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "SECRET").write_text("s3cret\n")
    code, err = pvm(capsys, "serve", "--data-dir", str(tmp_path / "d"), *argv)
    assert code == 2 and message in err, err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("given", ["file", "environment", "configuration file"])
def test_the_spark_secret_reaches_the_store_from_a_file_or_the_environment(tmp_path, monkeypatch, given: str) -> None:
    seen: list = []

    class Stop(Exception):
        pass

    def fake_open_store(*args):
        seen.extend(args[-2:])
        raise Stop

    monkeypatch.setattr(serve, "open_store", fake_open_store)
    monkeypatch.delenv("PVM_SPARK_AUTH_SECRET", raising=False)
    (tmp_path / "secret").write_text("s3cret\nnot this line\n")
    argv = ["serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "--spark-executor-timeout", "7.5"]
    if given == "file":
        argv += ["--spark-auth-secret-file", str(tmp_path / "secret")]
    elif given == "environment":
        monkeypatch.setenv("PVM_SPARK_AUTH_SECRET", "s3cret")
    else:
        (tmp_path / "manager.toml").write_text(f'spark_auth_secret_file = "{tmp_path / "secret"}"\n')
        argv += ["--config", str(tmp_path / "manager.toml")]
    with pytest.raises(Stop):
        main(argv)
    assert seen == ["s3cret", 7.5]


def test_the_spark_secret_is_not_read_from_a_configuration_file_in_clear(tmp_path, capsys) -> None:
    (tmp_path / "manager.toml").write_text('spark_auth_secret = "s3cret"\n')
    code, err = pvm(capsys, "serve", "--config", str(tmp_path / "manager.toml"))
    assert code == 2 and "unknown key 'spark_auth_secret' (did you mean 'spark_auth_secret_file'?)" in err, err


# -- --spark-master ------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when it returns: nothing listens there


def test_a_spark_master_that_does_not_answer_stops_the_start_at_once(tmp_path, capsys) -> None:
    data, master = tmp_path / "data", f"spark://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    code, err = pvm(capsys, "serve", "--data-dir", str(data), "--port", "0", "--spark-master", master)
    assert code == 2 and time.monotonic() - started < 10, err
    assert f"pvm: error: --spark-master {master}: no Spark master answers" in err and "refused" in err
    assert not data.exists()  # refused before the catalog, the socket or Spark


@pytest.mark.parametrize("master", ["spark://nohost", "spark://h:port", "spark://h:7077/x", "spark://:7077"])
def test_a_malformed_spark_master_is_refused(tmp_path, capsys, master: str) -> None:
    code, err = pvm(capsys, "serve", "--data-dir", str(tmp_path / "data"), "--port", "0", "--spark-master", master)
    assert code == 2 and f"--spark-master {master}: expected spark://HOST:PORT" in err


def test_one_answering_master_of_several_is_enough() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        serve.check_spark_master(f"spark://127.0.0.1:{closed_port()},127.0.0.1:{port}")
    serve.check_spark_master("local[2]")  # other masters are Spark's to judge
    serve.check_spark_master(None)


def test_a_session_that_fails_on_the_master_names_it(tmp_path, monkeypatch) -> None:
    """A port that accepts connections but is no master: Spark gives up after a minute with
    only "Cannot call methods on a stopped SparkContext"."""
    import warehouse.store.spark_session

    def fail(*args, **kwargs):
        raise RuntimeError("Cannot call methods on a stopped SparkContext.\nThis stopped SparkContext …")

    monkeypatch.setattr(warehouse.store.spark_session, "get_spark", fail)
    with pytest.raises(CliError) as refused:
        serve.open_store("spark", tmp_path, "spark://10.9.9.9:7077", "sqlite:///:memory:")
    message = str(refused.value)
    assert message.startswith("--spark-master spark://10.9.9.9:7077: Spark did not start on this master")
    assert "stopped SparkContext." in message and str(tmp_path / "spark.log") in message
