"""A smoke test of ``pvm bench capture`` with tiny sizes against the local PostgreSQL and
MariaDB: one run measures no capture, trigger capture and log capture side by side, its
JSON file has every figure and the ratios follow from them, and the plot is written; no
slot, publication or scratch schema is left on the servers."""

from __future__ import annotations

import json
import math
import statistics
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from pvm.bench import capture, capture_write
from pvm.bench.capture import MARIADB_URL, PG_URL
from pvm.cli import CliError
from pvm.cli import main as pvm_main

WRITE_COST_KEYS = {"seconds", "transactions_per_second", "ratio_to_none", "spread"}
WAL_KEYS = {"wal_bytes", "wal_bytes_per_transaction"}  # PostgreSQL only
BINLOG_KEYS = {"binary_log", "binlog_bytes", "binlog_bytes_per_transaction", "handler_prepares"}  # MariaDB only
RUN_KEYS = {
    "capture",
    "source_transactions_committed",
    "source_transactions_per_second",
    "marker_transactions",
    "writing_seconds",
    "converged_seconds_after_writers",
    "watermarks_checked_by_oracle",
    "oracle",
    "compensations",
    "subqueries",
    "freshness_seconds",
    "lags_seconds",
}
TINY = ["--transactions", "12", "--statements", "2", "--connections", "2", "--rows", "40"]


def positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@pytest.fixture
def scratch_names(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the scratch schemas and databases the benchmark makes, as it makes them."""
    names: list[str] = []
    make = capture.scratch_name

    def recorded() -> str:
        names.append(make())
        return names[-1]

    monkeypatch.setattr(capture, "scratch_name", recorded)
    return names


def leftovers(names: list[str]) -> list[str]:
    """What of the scratch ``names`` is still on the servers: schemas, databases, and log
    capture's slots and publications (named ``pvm_test_<schema>``)."""
    found: list[str] = []
    pg = sa.create_engine(PG_URL)
    with pg.connect() as conn:
        for query in (
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name = ANY(:slots)",
            "SELECT pubname FROM pg_publication WHERE pubname = ANY(:slots)",
            "SELECT nspname FROM pg_namespace WHERE nspname = ANY(:names)",
        ):
            params = {"slots": [f"pvm_test_{n}" for n in names], "names": names}
            found += [name for (name,) in conn.execute(sa.text(query), params)]
    pg.dispose()
    my = sa.create_engine(MARIADB_URL)
    with my.connect() as conn:
        databases = {name for (name,) in conn.exec_driver_sql("SHOW DATABASES")}
    my.dispose()
    return found + sorted(databases & set(names))


def check_write_cost(cost: dict, methods: list[str], rounds: int, *, wal: bool) -> None:
    assert set(cost) == WRITE_COST_KEYS | (WAL_KEYS if wal else BINLOG_KEYS)
    assert set(cost["seconds"]) == set(cost["transactions_per_second"]) == {"none", *methods}
    assert set(cost["ratio_to_none"]) == set(methods)
    spread = cost["spread"]
    for mode, seconds in cost["seconds"].items():
        assert len(seconds) == rounds and all(positive(s) for s in seconds), mode
        assert math.isclose(cost["transactions_per_second"][mode], 12 / statistics.median(seconds)), mode
        rates = spread["transactions_per_second"][mode]
        assert math.isclose(rates["min"], 12 / max(seconds)) and math.isclose(rates["max"], 12 / min(seconds)), mode
        assert rates["min"] <= rates["median"] <= rates["max"], mode
    for method in methods:
        expected = statistics.median(cost["seconds"][method]) / statistics.median(cost["seconds"]["none"])
        assert math.isclose(cost["ratio_to_none"][method], expected), method
        in_round = [m / n for m, n in zip(cost["seconds"][method], cost["seconds"]["none"])]
        ratios = spread["ratio_in_round"][method]
        assert math.isclose(ratios["min"], min(in_round)) and math.isclose(ratios["max"], max(in_round)), method
        assert math.isclose(ratios["median"], statistics.median(in_round)), method
    if wal:
        assert set(cost["wal_bytes"]) == set(cost["wal_bytes_per_transaction"]) == {"none", *methods}
        for mode, written in cost["wal_bytes"].items():
            assert len(written) == rounds and all(w > 0 for w in written), mode
            assert math.isclose(cost["wal_bytes_per_transaction"][mode], statistics.median(written) / 12), mode
    else:  # MariaDB: only the writers of log capture write the binary log, every run of them
        assert cost["binary_log"] == {mode: mode == "log" for mode in ("none", *methods)}
        for mode, written in cost["binlog_bytes"].items():
            prepares = cost["handler_prepares"][mode]
            assert len(written) == len(prepares) == rounds, mode
            if mode == "log":
                assert all(w > 0 for w in written) and all(p > 0 for p in prepares), (written, prepares)
            else:  # sql_log_bin = 0: nothing in the binary log, and every commit in one phase
                assert written == [0] * rounds and prepares == [0] * rounds, (mode, written, prepares)
            assert math.isclose(cost["binlog_bytes_per_transaction"][mode], statistics.median(written) / 12), mode


@pytest.mark.servers
def test_bench_capture_measures_both_methods_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scratch_names: list[str]
) -> None:
    out = tmp_path / "figures" / "capture.json"
    argv = [
        "bench", "capture", *TINY, "--rounds", "2", "--view-transactions", "12", "--marker-interval", "0.02",
        "--freshness-rounds", "2", "--json", str(out),
    ]  # fmt: skip
    assert pvm_main(argv) == 0
    printed = capsys.readouterr().out
    assert "trigger/none" in printed and "log/none" in printed and "freshness log/trigger" in printed
    assert "in a round" in printed and "WAL bytes per transaction" in printed
    assert (
        "writers without the binary log (sql_log_bin = 0): none, trigger; binary log bytes per transaction" in printed
    )
    assert "restarted while the writers ran: wrappers pg, my (SIGKILL), then the manager (1)" in printed
    assert f"wrote {out} and {out.with_suffix('.png')}" in printed
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")

    results = json.loads(out.read_text())
    assert set(results) == {"settings", "write_cost", "freshness"}
    assert results["settings"]["method"] == "both" and results["settings"]["rounds"] == "2"
    assert set(results["write_cost"]) == {"postgresql", "mariadb"}
    for name, cost in results["write_cost"].items():
        check_write_cost(cost, ["trigger", "log"], rounds=2, wal=name == "postgresql")

    fresh = results["freshness"]
    assert set(fresh) == {"runs", "by_round", "ratio_log_to_trigger", "ratio_log_to_trigger_by_round", "with_restarts"}
    assert set(fresh["runs"]) == {"trigger", "log"}
    # two rounds, the order alternating; each method's figures pool its markers of both
    assert "round 1: view over" in printed and "round 2: view over" in printed and "2 round(s) pooled" in printed
    assert printed.index("round 1: view over PostgreSQL + MariaDB + SQLite (PostgreSQL trigger") < printed.index(
        "round 1: view over PostgreSQL + MariaDB + SQLite (PostgreSQL log"
    )
    assert printed.index("round 2: view over PostgreSQL + MariaDB + SQLite (PostgreSQL log") < printed.index(
        "round 2: view over PostgreSQL + MariaDB + SQLite (PostgreSQL trigger"
    )
    assert "p50 in a round" in printed
    assert len(fresh["by_round"]) == len(fresh["ratio_log_to_trigger_by_round"]) == 2
    for method, run in fresh["runs"].items():
        rounds = [r[method] for r in fresh["by_round"]]
        assert set(rounds[0]) == RUN_KEYS, method
        assert run["marker_transactions"] == sum(r["marker_transactions"] for r in rounds), method
        for source, lags in run["lags_seconds"].items():
            assert lags == sorted(v for r in rounds for v in r["lags_seconds"].get(source, [])), (method, source)
            assert run["freshness_seconds"][source]["max"] == lags[-1], (method, source)
    crashed = fresh["with_restarts"]  # --crash is on by default: a third run, with restarts, not in the ratios
    assert set(crashed) == RUN_KEYS | {"restarts"} and crashed["capture"]["pg"] == crashed["capture"]["my"] == "log"
    assert crashed["restarts"]["wrappers"] == ["pg", "my"] and crashed["restarts"]["manager"] == 1
    assert crashed["oracle"] == "passed" and crashed["watermarks_checked_by_oracle"] >= 1
    for method, run in [*fresh["runs"].items(), ("log with restarts", crashed)]:
        assert set(run) == RUN_KEYS | ({"restarts"} if run is crashed else set()), method
        expected = "log" if run is crashed else method
        assert run["capture"] == {"pg": expected, "my": expected, "lite": "trigger"}
        assert run["oracle"] == "passed" and run["watermarks_checked_by_oracle"] >= 1, method
        assert run["source_transactions_committed"] >= 1 and run["marker_transactions"] >= 1, method
        assert positive(run["source_transactions_per_second"]) and positive(run["writing_seconds"]), method
        assert run["subqueries"] and set(run["subqueries"]) <= {"pg", "my", "lite"}, method
        assert all(sub["count"] >= 1 and positive(sub["mean_seconds"]) for sub in run["subqueries"].values()), method
        assert run["freshness_seconds"] and set(run["freshness_seconds"]) <= {"pg", "my", "lite"}, method
        for source, lag in run["freshness_seconds"].items():
            assert set(lag) == {"p50", "p95", "max"}, (method, source)
            assert all(positive(v) for v in lag.values()) and lag["p50"] <= lag["p95"] <= lag["max"], source
    trigger, log = (fresh["runs"][m]["freshness_seconds"] for m in ("trigger", "log"))
    assert set(fresh["ratio_log_to_trigger"]) == set(trigger) & set(log)
    for source, ratio in fresh["ratio_log_to_trigger"].items():
        assert math.isclose(ratio["p95"], log[source]["p95"] / trigger[source]["p95"]), source
    # write cost, a run per method and round, restarts
    assert len(scratch_names) == 6 and leftovers(scratch_names) == []


@pytest.mark.servers
def test_bench_capture_restricted_to_one_method(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scratch_names: list[str]
) -> None:
    out = tmp_path / "capture-log.json"
    argv = ["bench", "capture", "--method", "log", *TINY, "--rounds", "1", "--skip-freshness", "--json", str(out)]
    assert pvm_main(argv) == 0
    printed = capsys.readouterr().out
    assert "log/none" in printed and "trigger/none" not in printed
    results = json.loads(out.read_text())
    assert results["settings"]["method"] == "log" and set(results) == {"settings", "write_cost"}
    for name, cost in results["write_cost"].items():
        check_write_cost(cost, ["log"], rounds=1, wal=name == "postgresql")
    assert len(scratch_names) == 1 and leftovers(scratch_names) == []


@pytest.mark.servers
def test_a_mariadb_user_that_must_write_the_binary_log_is_told_what_to_grant() -> None:
    """The writers of "none" and "trigger" turn the binary log off for their sessions, which
    needs BINLOG ADMIN (SUPER before MariaDB 10.5.2): without it the benchmark stops at once."""
    user = f"pvm_t_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(MARIADB_URL)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE USER '{user}'@'127.0.0.1'")
        conn.exec_driver_sql(f"GRANT SELECT ON test.* TO '{user}'@'127.0.0.1'")
    try:
        with pytest.raises(CliError, match=r"cannot write without the binary log .*needs the BINLOG ADMIN privilege"):
            capture_write.check_binlog_control(f"mysql+pymysql://{user}@127.0.0.1:3306/test")
        capture_write.check_binlog_control(MARIADB_URL)  # the development server's root may
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP USER '{user}'@'127.0.0.1'")
        admin.dispose()


def test_bench_capture_refuses_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        pvm_main(["bench", "capture", "--method", "wal"])
    assert exit_.value.code == 2
    assert "argument --method: invalid choice: 'wal' (choose from" in capsys.readouterr().err
    assert pvm_main(["bench", "capture", "--skip-write-cost", "--skip-freshness"]) == 2
    assert "leave nothing to measure" in capsys.readouterr().err
    assert pvm_main(["bench", "capture", "--marker-interval", "0"]) == 2
    assert "--marker-interval must be > 0" in capsys.readouterr().err
    assert pvm_main(["bench", "capture", "--freshness-rounds", "0"]) == 2
    assert "--freshness-rounds must be >= 1" in capsys.readouterr().err
