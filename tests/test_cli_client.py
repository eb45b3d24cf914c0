"""The ``pvm`` commands of administrators and analysts, against a live manager: the first
admin token made on the catalog, sources, views with a progress display, tables, and API
errors printed as ``pvm: error: <message>`` with a non-zero exit status."""

from __future__ import annotations

import json

from pvm.cli import main
from tests.api_support import VIEW, LiveManager


def pvm(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tokens_on_the_catalog_without_a_manager(tmp_path, capsys):
    code, out, err = pvm(capsys, "token", "create", "--role", "admin", "--data-dir", str(tmp_path))
    assert code == 0 and out.startswith("pvm_1_") and "shown only now" in err
    code, out, _ = pvm(capsys, "token", "create", "--role", "wrapper", "--source", "shop", "--data-dir", str(tmp_path), "--json")
    assert code == 0 and json.loads(out)["source"] == "shop"
    code, _, err = pvm(capsys, "token", "create", "--role", "wrapper", "--data-dir", str(tmp_path))
    assert code == 2 and "pvm: error:" in err and "--source" in err
    assert pvm(capsys, "token", "revoke", "1", "--data-dir", str(tmp_path))[0] == 0
    code, out, _ = pvm(capsys, "token", "list", "--data-dir", str(tmp_path), "--json")
    tokens = json.loads(out)
    assert [(t["id"], t["role"], t["revoked_at"] is not None) for t in tokens] == [(1, "admin", True), (2, "wrapper", False)]
    code, _, err = pvm(capsys, "token", "revoke", "7", "--data-dir", str(tmp_path))
    assert code == 2 and "unknown token 7" in err


def test_administrator_and_analyst_session(tmp_path, capsys):
    with LiveManager(tmp_path) as live:
        admin = ["--manager", live.url, "--token", live.tokens["admin"]]
        analyst = ["--manager", live.url, "--token", live.tokens["analyst"]]
        for name, table in (("a", "R"), ("b", "S")):
            code, _, err = pvm(capsys, "source", "add", name, "--wrapper-url", f"http://{name}.invalid", "--tables", table, *admin)
            assert code == 0, err
        live.sources["a"].load("R", [(1, "x"), (2, "y")])
        live.sources["b"].load("S", [(1, 10), (2, 20), (2, 21)])

        code, _, err = pvm(capsys, "view", "define", "--sql", VIEW, "--name", "v", "--parallelism", "2", "--wait", *admin)
        assert code == 0 and "view v defined: active" in err, err
        code, out, _ = pvm(capsys, "view", "list", *analyst)
        assert code == 0 and "active" in out and "v" in out
        code, out, _ = pvm(capsys, "view", "show", "v", *analyst, "--json")
        assert code == 0 and json.loads(out)["row_count"] == 3
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
        code, _, err = pvm(capsys, "view", "define", "--sql", "SELECT COUNT(*) FROM a.R", *admin)
        assert code == 2 and err.startswith("pvm: error: ")
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
    announce_first_admin_token(url)
    err = capsys.readouterr().err
    token = next(w.removeprefix("PVM_TOKEN=") for w in err.split() if w.startswith("PVM_TOKEN="))
    assert parse_token(token) is not None
    announce_first_admin_token(url)
    assert capsys.readouterr().err == ""
