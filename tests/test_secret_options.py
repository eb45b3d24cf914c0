"""Secrets and URLs with passwords given from a file or the environment instead of the
command line (which ``ps`` shows to every user): ``pvm wrapper run``'s URL and tokens,
``pvm serve``'s catalog URL, the client's API token. A file that cannot be read is a CLI
error; a secret still given on the command line works, with a warning."""

from __future__ import annotations

import argparse
import logging
import os
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from pvm.cli import main
from pvm.secret_options import SecretOption
from tests.api_support import LiveManager
from tests.fake_manager import FakeManager
from tests.test_secrets_at_rest import read_line

WRAPPER_TOKEN = "w" * 40
MANAGER_TOKEN = "the-manager-token-0123456789"
PASSWORD = "s3cret-pw"


def pvm(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def secret_file(tmp_path: Path, name: str, value: str) -> Path:
    path = tmp_path / name
    path.write_text(f"{value}\n")
    return path


def clean_env(**values: str) -> dict[str, str]:
    """This process's environment without any pvm secret, plus ``values``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PVM_")}
    return {**env, **values}


# -- pvm wrapper run ---------------------------------------------------------------------------


def test_wrapper_takes_its_url_and_tokens_from_files_and_the_environment(tmp_path: Path) -> None:
    db = make_source(tmp_path)
    files = {
        "--token-file": secret_file(tmp_path, "wrapper-token", WRAPPER_TOKEN),
        "--manager-token-file": secret_file(tmp_path, "manager-token", MANAGER_TOKEN),
    }
    with FakeManager(token=WRAPPER_TOKEN) as manager:
        argv = [
            sys.executable, "-m", "pvm", "wrapper", "run", "--source", "src", "--tables", "r", "--manager", manager.url,
            "--state-dir", str(tmp_path / "state"), *(str(x) for pair in files.items() for x in pair),
        ]  # fmt: skip
        wrapper = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(PVM_SOURCE_URL=f"sqlite:///{db}"),
        )
        try:
            url = read_line(wrapper).split()[-1]
            cmdline = Path(f"/proc/{wrapper.pid}/cmdline").read_bytes()
            assert MANAGER_TOKEN.encode() not in cmdline and WRAPPER_TOKEN.encode() not in cmdline
            assert httpx.get(f"{url}/v1/schema").status_code == 401
            schema = httpx.get(f"{url}/v1/schema", headers={"Authorization": f"Bearer {MANAGER_TOKEN}"})
            assert schema.status_code == 200 and "r" in schema.json()["tables"]
            with closing(sqlite3.connect(db)) as conn, conn:
                conn.execute("INSERT INTO r VALUES (1, 'a')")
            manager.wait_through("src", 1)  # posted with the wrapper token from its file
        finally:
            wrapper.terminate()
            _, err = wrapper.communicate(timeout=30)
    assert "command line" not in err, err


def make_source(tmp_path: Path) -> Path:
    db = tmp_path / "src.db"
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE r (id INTEGER PRIMARY KEY, v TEXT)")
    return db


@pytest.mark.parametrize("flag", ["--url-file", "--token-file", "--manager-token-file", "--application-token-file"])
@pytest.mark.parametrize("problem", ["missing", "a directory", "empty"])
def test_a_wrapper_secret_file_that_cannot_be_read_is_a_cli_error(
    tmp_path: Path, capsys, flag: str, problem: str
) -> None:
    path = {"missing": tmp_path / "nope", "a directory": tmp_path, "empty": secret_file(tmp_path, "empty", "")}[problem]
    code, _, err = pvm(
        capsys, "wrapper", "run", "--source", "s", "--url", "sqlite:///x.db", "--tables", "r", "--manager", "http://127.0.0.1:1",
        "--state-dir", str(tmp_path / "state"), *(["--url-file", str(path)] if flag == "--url-file" else [flag, str(path)]),
    )  # fmt: skip
    if flag == "--url-file":  # given with --url too: that is refused first
        assert code == 2 and "give --url or --url-file, not both" in err, err
        code, _, err = pvm(capsys, "wrapper", "install", "--tables", "r", "--url-file", str(path))
    assert code == 2, err
    assert err.startswith(f"pvm: error: {flag} {path}: ") and ("cannot read it" in err or "empty" in err), err
    assert not (tmp_path / "state").exists()


def test_secrets_on_the_wrapper_command_line_still_work_with_a_warning(tmp_path: Path) -> None:
    db = make_source(tmp_path)
    with FakeManager(token=WRAPPER_TOKEN) as manager:
        argv = [
            sys.executable, "-m", "pvm", "wrapper", "run", "--source", "src", "--tables", "r", "--manager", manager.url,
            "--state-dir", str(tmp_path / "state"), "--url", f"sqlite:///{db}",
            "--token", WRAPPER_TOKEN, "--manager-token", MANAGER_TOKEN,
        ]  # fmt: skip
        wrapper = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
        try:
            url = read_line(wrapper).split()[-1]
            assert (
                httpx.get(f"{url}/v1/schema", headers={"Authorization": f"Bearer {MANAGER_TOKEN}"}).status_code == 200
            )
        finally:
            wrapper.terminate()
            _, err = wrapper.communicate(timeout=30)
    for flag in ("--token", "--manager-token"):
        assert (
            f"{flag} was given on the command line, where every user of this machine can read it (ps); use {flag}-file"
            in err
        )
    assert "--url was given" not in err  # a URL without a password is no secret
    assert MANAGER_TOKEN not in err and WRAPPER_TOKEN not in err


def test_a_url_warns_only_when_it_holds_a_password(caplog) -> None:
    option = SecretOption("--url", "PVM_SOURCE_URL", "the URL", is_url=True)
    parser = argparse.ArgumentParser()
    option.add_to(parser)
    with caplog.at_level(logging.WARNING, logger="pvm.secrets"):
        assert option.value(parser.parse_args(["--url", "postgresql://pvm@db/shop"]), {}) == "postgresql://pvm@db/shop"
        assert caplog.records == []
        assert option.value(parser.parse_args(["--url", f"postgresql://pvm:{PASSWORD}@db/shop"]), {}).endswith(
            "@db/shop"
        )
    assert [r.getMessage().split(" was given")[0] for r in caplog.records] == ["--url"]
    assert PASSWORD not in caplog.text


# -- pvm serve ---------------------------------------------------------------------------------


def tokens_in(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT count(*) FROM tokens")).scalar_one()
    finally:
        engine.dispose()


@pytest.mark.servers
@pytest.mark.parametrize("given", ["file", "environment"])
def test_serve_takes_its_catalog_url_from_a_file_or_the_environment(
    tmp_path: Path, postgresql_catalog: str, given: str
) -> None:
    options, env = [], clean_env()
    if given == "file":
        options = ["--catalog-file", str(secret_file(tmp_path, "catalog-url", postgresql_catalog))]
    else:
        env["PVM_CATALOG_URL"] = postgresql_catalog
    data_dir = tmp_path / "data"
    serve = subprocess.Popen(
        [sys.executable, "-m", "pvm", "serve", "--data-dir", str(data_dir), "--store", "memory", "--port", "0", *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        url = read_line(serve).split()[-1]
        token = (data_dir / "admin-token").read_text().strip()
        deadline = time.monotonic() + 60  # the API answers 503 until the manager has started
        while httpx.get(f"{url}/v1/ready").status_code != 200:
            assert time.monotonic() < deadline, "the manager did not start"
            time.sleep(0.1)
        assert httpx.get(f"{url}/v1/tokens", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    finally:
        serve.terminate()
        serve.communicate(timeout=30)
    assert tokens_in(postgresql_catalog) == 1  # the first admin token went to that catalog
    assert not (data_dir / "catalog.db").exists()


def test_serve_refuses_a_catalog_file_it_cannot_read(tmp_path: Path, capsys) -> None:
    code, _, err = pvm(
        capsys,
        "serve",
        "--data-dir",
        str(tmp_path / "d"),
        "--store",
        "memory",
        "--catalog-file",
        str(tmp_path / "nope"),
    )
    assert code == 2 and err.startswith(f"pvm: error: --catalog-file {tmp_path / 'nope'}: cannot read it"), err
    assert not (tmp_path / "d").exists()  # refused before anything


def test_serve_warns_of_a_catalog_password_on_its_command_line(tmp_path: Path, capsys, caplog) -> None:
    from pvm import serve
    from pvm.cli import build_parser

    url = f"postgresql://pvm:{PASSWORD}@127.0.0.1:1/pvm"
    args = build_parser(["serve"]).parse_args(["serve", "--store", "memory", "--catalog", url])
    with caplog.at_level(logging.WARNING, logger="pvm.secrets"):
        serve.check_options(args)
    assert (
        args.catalog == url and "--catalog was given on the command line" in caplog.text and PASSWORD not in caplog.text
    )


# -- the client --------------------------------------------------------------------------------


def test_the_client_takes_its_token_from_a_file(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("PVM_TOKEN", raising=False)
    with LiveManager(tmp_path) as live:
        token_file = secret_file(tmp_path, "token", live.tokens["admin"])
        code, out, err = pvm(capsys, "token", "list", "--manager", live.url, "--token-file", str(token_file), "--json")
        assert code == 0 and "admin" in out, err
        code, _, err = pvm(capsys, "view", "list", "--manager", live.url, "--token-file", str(tmp_path / "nope"))
        assert code == 2 and f"--token-file {tmp_path / 'nope'}: cannot read it" in err, err
        code, _, err = pvm(
            capsys, "view", "list", "--manager", live.url, "--token", "x", "--token-file", str(token_file)
        )
        assert code == 2 and "give --token or --token-file, not both" in err, err
