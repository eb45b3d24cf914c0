"""``pvm serve`` options checked before anything starts (no Spark, no socket): the commit
interval, Spark Connect refused on a non-loopback interface without a token, and how long
compacted table versions are kept for analysts' queries."""

from __future__ import annotations

import pytest

import api.analyst
from pvm import serve
from pvm.cli import build_parser, main
from warehouse.store.spark_connect import ConnectError, is_loopback, start_connect_server


def pvm(capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.fixture(autouse=True)
def no_connect_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(serve.CONNECT_TOKEN_ENV, raising=False)


@pytest.mark.parametrize("hosts", [["--host", "0.0.0.0"], ["--connect-host", "10.1.2.3"], ["--host", "::"], ["--connect-host", "myhost.example"]])
def test_spark_connect_off_loopback_without_a_token_is_refused(tmp_path, capsys, hosts: list[str]) -> None:
    data = tmp_path / "data"
    code, err = pvm(capsys, "serve", "--data-dir", str(data), "--port", "0", *hosts)
    assert code == 2, err
    assert "pvm: error: Spark Connect would listen on" in err
    assert "PVM_CONNECT_TOKEN" in err and "--connect-host 127.0.0.1" in err and "--connect-port -1" in err
    assert not data.exists()  # refused before the catalog, the socket or Spark


@pytest.mark.parametrize(
    "argv, token",
    [
        (["--host", "0.0.0.0"], "secret"),  # a token is required from clients
        (["--host", "0.0.0.0", "--connect-host", "127.0.0.1"], None),
        (["--host", "0.0.0.0", "--connect-port", "-1"], None),  # no server at all
        (["--host", "0.0.0.0", "--store", "memory"], None),  # no Spark, no server
        (["--connect-host", "localhost"], None),
        (["--connect-host", "::1"], None),
        ([], None),  # the default: 127.0.0.1
    ],
)
def test_spark_connect_on_loopback_or_with_a_token_passes(monkeypatch, argv: list[str], token: str | None) -> None:
    if token:
        monkeypatch.setenv(serve.CONNECT_TOKEN_ENV, token)
    serve.check_options(build_parser(["serve"]).parse_args(["serve", *argv]))


def test_the_connect_server_itself_refuses_a_public_host_without_a_token() -> None:
    with pytest.raises(ConnectError, match="not the loopback interface"):
        start_connect_server(None, "0.0.0.0", 0, None)  # type: ignore[arg-type]  (refused before Spark is touched)
    assert [is_loopback(h) for h in ("127.0.0.1", "127.8.9.1", "localhost", "::1", "[::1]")] == [True] * 5
    assert [is_loopback(h) for h in ("0.0.0.0", "::", "", "10.0.0.1", "localhost.evil.com")] == [False] * 5


@pytest.mark.parametrize("value", ["-1", "-0.5", "nan", "inf"])
def test_commit_linger_must_be_finite_and_not_negative(tmp_path, capsys, value: str) -> None:
    code, err = pvm(capsys, "serve", "--data-dir", str(tmp_path / "d"), "--store", "memory", f"--commit-linger={value}")
    assert code == 2 and "--commit-linger" in err, err


@pytest.mark.parametrize("value", ["0", "-3"])
def test_seq_window_must_be_positive(tmp_path, capsys, value: str) -> None:
    code, err = pvm(capsys, "serve", "--data-dir", str(tmp_path / "d"), "--store", "memory", f"--seq-window={value}")
    assert code == 2 and "--seq-window" in err, err


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
        main(["serve", "--data-dir", str(tmp_path), "--store", "memory", "--port", "0",
              "--commit-linger", "0.25", "--commit-group-size", "7", "--seq-window", "50"])
    assert seen == {"commit_group_size": 7, "commit_linger": 0.25, "seq_window": 50}
    assert build_parser(["serve"]).parse_args(["serve"]).commit_linger == 0.0


def test_compacted_versions_outlive_the_query_timeout(monkeypatch) -> None:
    """Old table versions must stay until every REST query planned on them has finished or
    been cancelled; the retention follows the timeout rather than repeating its value."""
    assert serve.retention_s() >= api.analyst.QUERY_TIMEOUT_S
    monkeypatch.setattr(api.analyst, "QUERY_TIMEOUT_S", 900.0)
    assert serve.retention_s() >= 900.0


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

    def fake_open_store(kind, data_dir, master, url, spark_conf=None):
        seen.update(spark_conf)
        raise Stop

    monkeypatch.setattr(serve, "open_store", fake_open_store)
    with pytest.raises(Stop):
        main(["serve", "--data-dir", str(tmp_path), "--port", "0", "--connect-port", "-1",
              "--spark-conf", "spark.driver.extraJavaOptions=-XX:+UseParallelGC -Dx=a=b",
              "--spark-conf", "spark.sql.shuffle.partitions=8"])
    assert seen == {"spark.driver.extraJavaOptions": "-XX:+UseParallelGC -Dx=a=b", "spark.sql.shuffle.partitions": "8"}
