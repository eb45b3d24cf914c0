"""The ``pvm`` commands of administrators and analysts, against a live manager: the first
admin token made on the catalog, sources, views with a progress display, tables, and API
errors printed as ``pvm: error: <message>`` with a non-zero exit status."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from pvm.cli import main
from tests.api_support import VIEW, LiveManager, serve_in_thread


def pvm(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tokens_on_the_catalog_without_a_manager(tmp_path, capsys):
    code, out, err = pvm(capsys, "token", "create", "--role", "admin", "--data-dir", str(tmp_path))
    assert code == 0 and out.startswith("pvm_1_") and "shown only now" in err
    code, out, _ = pvm(
        capsys, "token", "create", "--role", "wrapper", "--source", "shop", "--data-dir", str(tmp_path), "--json"
    )
    assert code == 0 and json.loads(out)["source"] == "shop"
    code, _, err = pvm(capsys, "token", "create", "--role", "wrapper", "--data-dir", str(tmp_path))
    assert code == 2 and "pvm: error:" in err and "--source" in err
    assert pvm(capsys, "token", "revoke", "1", "--data-dir", str(tmp_path))[0] == 0
    code, out, _ = pvm(capsys, "token", "list", "--data-dir", str(tmp_path), "--json")
    tokens = json.loads(out)
    assert [(t["id"], t["role"], t["revoked_at"] is not None) for t in tokens] == [
        (1, "admin", True),
        (2, "wrapper", False),
    ]
    code, _, err = pvm(capsys, "token", "revoke", "7", "--data-dir", str(tmp_path))
    assert code == 2 and "unknown token 7" in err


def test_administrator_and_analyst_session(tmp_path, capsys):
    with LiveManager(tmp_path) as live:
        admin = ["--manager", live.url, "--token", live.tokens["admin"]]
        analyst = ["--manager", live.url, "--token", live.tokens["analyst"]]
        for name, table in (("a", "R"), ("b", "S")):
            code, _, err = pvm(
                capsys, "source", "add", name, "--wrapper-url", f"http://{name}.invalid", "--tables", table, *admin
            )
            assert code == 0, err
        live.sources["a"].load("R", [(1, "x"), (2, "y")])
        live.sources["b"].load("S", [(1, 10), (2, 20), (2, 21)])

        code, _, err = pvm(
            capsys, "view", "define", "--sql", VIEW, "--name", "v", "--parallelism", "2", "--wait", *admin
        )
        assert code == 0 and "view v defined: active" in err, err
        code, out, _ = pvm(capsys, "view", "list", *analyst)
        assert code == 0 and "active" in out and "v" in out
        code, out, _ = pvm(capsys, "view", "show", "v", *analyst, "--json")
        assert code == 0 and json.loads(out)["row_count"] == 3
        code, out, _ = pvm(capsys, "view", "show", "v", *analyst)
        assert code == 0 and "sources as of W (seq)" in out and "a 0, b 0" in out
        code, out, _ = pvm(capsys, "view", "rows", "v", "--limit", "2", *analyst)
        assert code == 0 and "rows 1-2 of 3" in out and "10" in out
        code, out, _ = pvm(capsys, "view", "rows", "v", *analyst, "--json")
        assert json.loads(out)["rows"] == [[1, "x", 10], [2, "y", 20], [2, "y", 21]]
        code, out, _ = pvm(capsys, "source", "list", *analyst)
        assert code == 0 and "a.invalid" in out
        code, out, _ = pvm(capsys, "source", "show", "b", *analyst)
        assert code == 0 and "table S" in out

        # refusals come back as the API's message
        code, _, err = pvm(capsys, "view", "drop", "v", *analyst)
        assert code == 2 and err.startswith("pvm: error: ") and "admin role" in err
        code, _, err = pvm(capsys, "view", "list", "--manager", live.url, "--token", "")
        assert code == 2 and "no token given" in err
        code, _, err = pvm(capsys, "view", "define", "--sql", "CREATE VIEW s AS SELECT SUM(R.v) FROM a.R", *admin)
        assert code == 2 and err.startswith("pvm: error: ") and "needs a numeric column" in err
        code, _, err = pvm(capsys, "view", "show", "nope", *analyst)
        assert code == 2 and "unknown view 'nope'" in err

        code, out, _ = pvm(capsys, "token", "create", "--role", "analyst", *admin)
        assert code == 0 and out.startswith("pvm_")
        assert pvm(capsys, "view", "drop", "v", *admin)[0] == 0
        assert "v" not in live.manager.views

    code, _, err = pvm(capsys, "view", "list", "--manager", live.url, "--token", "x", "--timeout", "2")
    assert code == 2 and "cannot reach the manager" in err


def test_serve_makes_a_first_admin_token_once(tmp_path, capsys):
    from api.auth import parse_token
    from pvm.serve import announce_first_admin_token

    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    announce_first_admin_token(url, tmp_path)
    err = capsys.readouterr().err
    token_file = tmp_path / "admin-token"
    token = token_file.read_text().strip()
    assert parse_token(token) is not None and token not in err and "pvm_" not in err
    assert str(token_file) in err and oct(token_file.stat().st_mode & 0o777) == "0o600"
    announce_first_admin_token(url, tmp_path)
    assert capsys.readouterr().err == "" and token_file.read_text().strip() == token


def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_pause_resume_and_query(tmp_path, capsys):
    with LiveManager(tmp_path) as live:
        admin = ["--manager", live.url, "--token", live.tokens["admin"]]
        analyst = ["--manager", live.url, "--token", live.tokens["analyst"]]
        for name, table in (("a", "R"), ("b", "S")):
            assert (
                pvm(capsys, "source", "add", name, "--url", f"http://{name}.invalid", "--tables", table, *admin)[0] == 0
            )
        live.sources["a"].load("R", [(1, "x")])
        live.sources["b"].load("S", [(1, 10), (2, 20)])
        code, _, err = pvm(capsys, "view", "define", "--sql", VIEW, "--name", "v", "--wait", *admin)
        assert code == 0, err

        def show() -> dict:
            code, out, err = pvm(capsys, "view", "show", "v", "--json", *analyst)
            assert code == 0, err
            return json.loads(out)

        code, _, err = pvm(capsys, "view", "pause", "v", *admin)
        assert code == 0 and "view v: paused" in err
        assert show()["paused"] and live.manager.view("v").maintainer.paused
        # while paused, an update is received and queued, not maintained
        watermark = show()["watermark"]
        update = {"seq": 1, "changes": [{"relation": "R", "sign": 1, "row": {"k": 2, "v": "y"}}]}
        r = httpx.post(f"{live.url}/v1/updates", json={"source": "a", "updates": [update]}, headers=live.auth("admin"))
        assert r.status_code == 200 and r.json()["through"] == 1
        time.sleep(0.3)
        status = show()
        assert (status["updates_queued"], status["watermark"], status["paused"]) == (1, watermark, True)

        code, out, _ = pvm(capsys, "view", "resume", "v", "--json", *admin)
        assert code == 0 and json.loads(out)["paused"] is False
        wait_for(lambda: (s := show())["updates_queued"] == 0 and s["idle"])
        assert show()["watermark"] == watermark + 1
        code, out, _ = pvm(capsys, "view", "rows", "v", "--json", *analyst)
        assert json.loads(out)["rows"] == [[1, "x", 10], [2, "y", 20]]
        code, _, err = pvm(capsys, "view", "resume", "v", *admin)  # resuming a running view is harmless
        assert code == 0 and "view v: maintaining" in err

        # refusals: the analyst may not pause, unknown views are named
        code, _, err = pvm(capsys, "view", "pause", "v", *analyst)
        assert code == 2 and "admin role" in err and not show()["paused"]
        code, _, err = pvm(capsys, "view", "resume", "nope", *admin)
        assert code == 2 and "unknown view 'nope'" in err

        # analyst SQL runs on the Spark store only: this manager keeps its views in memory (501)
        code, out, err = pvm(capsys, "query", "SELECT k, count(*) FROM v GROUP BY k", *analyst)
        assert code == 2 and out == ""
        assert err.startswith("pvm: error: ") and len(err.strip().splitlines()) == 1
        assert "Spark view store" in err and "--store spark" in err
        code, _, err = pvm(capsys, "query", "  ", *analyst)
        assert code == 2 and "the query is empty" in err


class FakeWrapper:
    """A wrapper's HTTP API (schema and health) on a loopback port, reporting ``method`` as
    its capture method: enough for the manager to register it. ``shipping_error``: what
    its health reports of failing posts (None: they get through)."""

    def __init__(self, method: str) -> None:
        from fastapi import FastAPI

        from api.wrapper_app import Health, Held

        app = FastAPI()
        self.shipping_error: dict | None = None

        @app.get("/v1/schema")
        def schema() -> dict:
            columns = [{"name": "k", "type": "INTEGER"}, {"name": "v", "type": "TEXT"}]
            return {"source": "c", "tables": {"T": {"columns": columns, "primary_key": ["k"]}}}

        @app.get("/v1/health")
        def health() -> dict:
            report = Health(
                ok=True,
                source="c",
                last_seq=0,
                shipped_through=0,
                acked_through=0,
                pending=0,
                capture={"method": method},
                shipping_error=self.shipping_error,
                held=Held(
                    capturing=0, capturing_peak=0, shipping=0, shipping_peak=0, part_changes=100_000, part_bytes=1 << 23
                ),
            )
            return report.model_dump()

        self.app = app

    def __enter__(self) -> FakeWrapper:
        self.url, self._stop = serve_in_thread(self.app)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_source_add_checks_the_wrapper(tmp_path, capsys):
    from warehouse.sources import HttpSourceClient

    with LiveManager(tmp_path) as live, FakeWrapper("timestamp") as wrapper:
        admin = ["--manager", live.url, "--token", live.tokens["admin"]]
        simulated = live.manager.connect
        # real HTTP to loopback wrappers, retried for 1 s (not 15) when unreachable
        live.manager.connect = lambda name, url: (
            HttpSourceClient(name, url, retry_seconds=1.0)
            if url.startswith("http://127.0.0.1")
            else simulated(name, url)
        )

        def registered() -> list[str]:
            code, out, _ = pvm(capsys, "source", "list", "--json", *admin)
            assert code == 0
            return [s["name"] for s in json.loads(out)]

        # a capture method no wrapper has: a usage error, nothing sent
        with pytest.raises(SystemExit) as exit_info:
            pvm(capsys, "source", "add", "c", "--url", wrapper.url, "--capture", "binlog", *admin)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and "invalid choice: 'binlog'" in err and "timestamp" in err
        # the database's URL where the wrapper's address belongs
        code, _, err = pvm(capsys, "source", "add", "c", "--url", "sqlite:///shop.db", *admin)
        assert code == 2 and "wrapper's HTTP address" in err and "pvm wrapper run --url" in err
        # nobody listens there
        unreachable = closed_port_url()
        code, _, err = pvm(capsys, "source", "add", "c", "--url", unreachable, "--capture", "timestamp", *admin)
        assert (
            code == 2
            and err.startswith("pvm: error: ")
            and f"could not read the schema of source 'c' at {unreachable}" in err
        )
        # a table the wrapper does not capture
        code, _, err = pvm(
            capsys, "source", "add", "c", "--url", wrapper.url, "--capture", "timestamp", "--tables", "T,nope", *admin
        )
        assert code == 2 and "no captured table(s) nope" in err and "captures: T" in err
        # the wrapper runs timestamp capture, not the default trigger capture: both are named
        code, _, err = pvm(capsys, "source", "add", "c", "--url", wrapper.url, *admin)
        assert code == 2 and "capture 'trigger' was given" in err and "reports capture method 'timestamp'" in err
        assert registered() == [] and "c" not in live.manager.clients  # nothing registered

        code, out, err = pvm(
            capsys, "source", "add", "c", "--wrapper-url", wrapper.url, "--capture", "timestamp", "--json", *admin
        )
        assert code == 0, err
        assert json.loads(out)["capture"] == "timestamp" and json.loads(out)["relations"] == {"T": ["k", "v"]}
        assert registered() == ["c"]
        code, out, _ = pvm(capsys, "source", "show", "c", *admin)
        assert code == 0 and "timestamp" in out and "reachable" in out and "shipping failing" not in out
        # the wrapper's posts refused for good: shown, with how long and how often
        refused = {"error": "HTTP 413: update too large", "status": 413, "since": time.time() - 90, "attempts": 12}
        wrapper.shipping_error = refused
        code, out, _ = pvm(capsys, "source", "show", "c", *admin)
        assert code == 0 and "shipping failing" in out and "HTTP 413: update too large" in out, out
        assert "12 attempts in 9" in out, out


def test_source_add_help_names_the_wrapper_address(capsys):
    with pytest.raises(SystemExit):
        main(["source", "add", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--url URL, --wrapper-url URL" in out and "the wrapper's HTTP address" in out
    assert "{trigger,log,timestamp,application,snapshot}" in out
