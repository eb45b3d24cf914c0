"""``pvm serve`` and ``pvm wrapper run`` read options from a TOML file (``--config FILE`` or
``$PVM_CONFIG``): keys are the long options, values are converted and checked as on the
command line, a flag on the command line wins over the file, secrets are never read from it
in clear, and a bad file is one error line, exit status 2, before anything is created."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pvm import config_file, serve
from pvm.cli import Parser, build_parser, main

PASSWORD = "s3cret-pw"


@pytest.fixture(autouse=True)
def no_config_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(config_file.ENV, raising=False)


def write(tmp_path: Path, text: str, name: str = "pvm.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def parse(*argv: str) -> argparse.Namespace:
    return build_parser(list(argv)).parse_args(list(argv))


def pvm(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().err


# -- pvm serve ---------------------------------------------------------------------------------


def test_a_config_file_sets_the_options(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        'data_dir = "var/elsewhere"\nport = 8123\nstore = "memory"\n'
        'spark-conf = ["spark.sql.shuffle.partitions=8", "spark.driver.memory=2g"]\n'
        'query_timeout = 30\ncommit-linger = 0.5\nlog_level = "DEBUG"\n',
    )
    args = parse("serve", "--config", str(config))
    assert args.data_dir == Path("var/elsewhere") and args.port == 8123 and args.store == "memory"
    assert args.spark_conf == ["spark.sql.shuffle.partitions=8", "spark.driver.memory=2g"]
    assert args.query_timeout == 30.0 and isinstance(args.query_timeout, float)
    assert args.commit_linger == 0.5 and args.log_level == "DEBUG"
    assert args.host == "127.0.0.1" and args.seq_window == 100_000  # not in the file: the defaults
    assert args.config == config
    assert serve.check_options(args) == {"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "2g"}


def test_a_flag_on_the_command_line_wins_over_the_file(tmp_path: Path) -> None:
    config = write(tmp_path, 'port = 8123\nhost = "0.0.0.0"\nspark_conf = ["spark.a=1", "spark.b=2"]\n')
    args = parse("serve", "--port", "9000", f"--config={config}", "--spark-conf", "spark.c=3")
    assert args.port == 9000  # the command line, wherever --config is
    assert args.host == "0.0.0.0"  # the file
    assert args.spark_conf == ["spark.c=3"]  # a repeatable option given on the command line replaces the file's


def test_pvm_config_names_the_file_and_config_wins_over_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(config_file.ENV, str(write(tmp_path, "port = 8123\n", "env.toml")))
    assert parse("serve").port == 8123
    assert parse("serve", "--config", str(write(tmp_path, "port = 8124\n"))).port == 8124
    monkeypatch.setenv(config_file.ENV, str(tmp_path / "missing.toml"))
    code, err = pvm(capsys, "serve", "--data-dir", str(tmp_path / "d"))
    assert code == 2 and f"pvm: error: ${config_file.ENV} {tmp_path / 'missing.toml'}: cannot read it" in err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ("prot = 8000\n", "unknown key 'prot' (did you mean 'port'?)"),
        ("data-dri = 'x'\n", "unknown key 'data-dri' (did you mean 'data_dir'?)"),
        ("zzz = 1\n", "unknown key 'zzz' (the keys are the long options of pvm serve without dashes)"),
        ('port = "8000"\n', 'port = "8000": expected an integer'),
        ("port = 80.5\n", "port = 80.5: expected an integer"),
        ("port = true\n", "port = true: expected an integer"),
        ('query_timeout = "30"\n', 'query_timeout = "30": expected a number'),
        ("host = 1\n", "host = 1: expected a string"),
        ('spark_conf = "spark.a=1"\n', 'spark_conf = "spark.a=1": expected an array of strings'),
        ("spark_conf = [1]\n", "spark_conf = 1: expected a string"),
        ('store = "sparkle"\n', "store: invalid choice: 'sparkle' (choose from 'memory', 'spark')"),
        ('log_level = "debug"\n', "log_level: invalid choice: 'debug'"),
        ("[serve]\nport = 1\n", "unknown key 'serve'"),
        ('data_dir = "a"\ndata-dir = "b"\n', "'data_dir' and 'data-dir' set the same option"),
        ("config = 'other.toml'\n", "unknown key 'config'"),
        ("port = \n", "not valid TOML: Invalid value (at line 1, column 8)"),
        ("port = 1\nport = 2\n", "not valid TOML"),
        (f'catalog = "postgresql://pvm:{PASSWORD}@db/pvm"\n', "catalog: a URL with a password is not read"),
        ("catalog = 5\n", "catalog: expected a string"),
    ],
)
def test_a_bad_file_is_one_error_line_and_nothing_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    data = tmp_path / "data"
    config = write(tmp_path, text)
    code, err = pvm(capsys, "serve", "--data-dir", str(data), "--config", str(config))
    assert code == 2, err
    assert err.startswith("pvm: error: ") and err.count("\n") == 1, err
    assert err.startswith(f"pvm: error: --config {config}: ") and message in err, err  # the file, then the key
    assert PASSWORD not in err
    assert not data.exists()  # refused before the data directory, the catalog, the socket or Spark


@pytest.mark.parametrize(
    "text, message",
    [
        ("commit_group_size = 0\n", "--commit-group-size must be at least 1"),
        ("connect_port = 0\n", "--connect-port needs the Spark store"),
        ("spark_conf = ['nope']\n", "--spark-conf 'nope': expected spark.<setting>=<value>"),
        ("seq_window = 0\n", "--seq-window must be at least 1"),
        ("max_queued_changes = 0\n", "--max-queued-changes must be at least 1"),
    ],
)
def test_what_check_options_refuses_it_refuses_from_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    config = write(tmp_path, f'data_dir = "{tmp_path / "data"}"\nstore = "memory"\n{text}')
    code, err = pvm(capsys, "serve", "--config", str(config))
    assert code == 2 and f"pvm: error: {message}" in err, err
    assert not (tmp_path / "data").exists()


def test_a_missing_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = pvm(capsys, "serve", "--config", str(tmp_path / "nope.toml"), "--data-dir", str(tmp_path / "d"))
    assert code == 2 and f"pvm: error: --config {tmp_path / 'nope.toml'}: cannot read it: No such file" in err
    assert not (tmp_path / "d").exists()


def test_secrets_come_from_their_files_named_in_the_config(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    write(tmp_path, f"{url}\n", "catalog-url")
    args = parse("serve", "--config", str(write(tmp_path, f'catalog_file = "{tmp_path / "catalog-url"}"\n')))
    serve.check_options(args)
    assert args.catalog == url
    # A URL without a password is no secret: the file may hold it, as the command line may.
    args = parse("serve", "--config", str(write(tmp_path, f'catalog = "{url}"\n')))
    serve.check_options(args)
    assert args.catalog == url
    # The command line wins over the file for the pair: --catalog over the file's catalog_file.
    args = parse("serve", "--catalog", "sqlite:///other.db", "--config", str(write(tmp_path, 'catalog_file = "x"\n')))
    serve.check_options(args)
    assert args.catalog == "sqlite:///other.db"


def test_every_option_can_be_set_in_a_file() -> None:
    parser = build_parser(["serve"])._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    keys = config_file.keys(parser)
    for action in parser._actions:
        long = [f for f in action.option_strings if f.startswith("--")]
        if long and action.dest not in ("help", "config"):
            assert long[0][2:].replace("-", "_") in keys, action


def test_help_works_whatever_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv(config_file.ENV, str(write(tmp_path, "not toml at all")))
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0 and "--config FILE" in capsys.readouterr().out


# -- pvm wrapper run ---------------------------------------------------------------------------

WRAPPER = """\
source = "shop"
url = "sqlite:///shop.db"
tables = "orders,customers"
manager = "http://127.0.0.1:8000"
token_file = "/run/pvm/shop-token"
manager-token-file = "/run/pvm/manager-token"
port = 8101
capture = "snapshot"
key = ["orders=id", "customers=id,region"]
snapshot_interval = 30
insecure_no_application_token = true
"""


def test_a_wrapper_takes_its_options_and_its_required_ones_from_a_file(tmp_path: Path) -> None:
    config = write(tmp_path, WRAPPER)
    args = parse("wrapper", "run", "--config", str(config))
    assert (args.source, args.url, args.tables, args.manager) == (
        "shop", "sqlite:///shop.db", "orders,customers", "http://127.0.0.1:8000",
    )  # fmt: skip
    assert args.token_file == Path("/run/pvm/shop-token") and args.manager_token_file == Path("/run/pvm/manager-token")
    assert args.port == 8101 and args.capture == "snapshot" and args.snapshot_interval == 30.0
    assert args.key == [("orders", "id"), ("customers", "id,region")]  # through the option's own type
    assert args.insecure_no_application_token is True
    assert args.poll_interval == 0.05  # a default

    args = parse("wrapper", "run", "--config", str(config), "--source", "crm", "--port", "0", "--token-file", "t")
    assert args.source == "crm" and args.port == 0 and args.token_file == Path("t")
    # The command line's --token replaces the file's token_file (one or the other, not both).
    args = parse("wrapper", "run", "--config", str(config), "--token", "from-the-command-line")
    assert args.token == "from-the-command-line" and args.token_file is None

    off = write(tmp_path, "insecure_no_application_token = false\n", "off.toml")
    args = parse("wrapper", "run", "--config", str(off), "--source", "s", "--tables", "t", "--manager", "http://m")
    assert args.insecure_no_application_token is False


def test_required_options_are_still_required(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        parse("wrapper", "run", "--config", str(write(tmp_path, 'source = "shop"\n')))
    assert exited.value.code == 2


@pytest.mark.parametrize(
    "text, message",
    [
        ('token = "abcdef0123456789"\n', "token: a secret is not read from a configuration file in clear"),
        ('manager_token = "m"\n', '(manager_token_file = "PATH", its first line), or set $PVM_MANAGER_TOKEN'),
        ("application-token = 12345\n", "application-token: a secret is not read"),
        (f'url = "postgresql://shop:{PASSWORD}@db/shop"\n', "url: a URL with a password is not read"),
        ("max_value_bytes = 0\n", "max_value_bytes: must be at least 1, got 0"),
        ("part_changes = 1\n", "part_changes: must be between 2 and 100,000, got 1"),
        ("part_bytes = 40000000\n", "part_bytes: must be between 1 and 33,554,432, got 40,000,000"),
        ("poll_interval = -1\n", "poll_interval: must be positive, got -1"),
        ('key = ["orders"]\n', "key: expected TABLE=VALUE, got 'orders'"),
        ('capture = "triggers"\n', "capture: invalid choice: 'triggers'"),
        ('insecure_no_application_token = "yes"\n', 'insecure_no_application_token = "yes": expected true or false'),
        ("tabels = 'orders'\n", "unknown key 'tabels' (did you mean 'tables'?)"),
    ],
)
def test_a_bad_wrapper_file_is_refused_before_anything_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    state = tmp_path / "state"
    config = write(tmp_path, f'state_dir = "{state}"\n{text}')
    code, err = pvm(
        capsys, "wrapper", "run", "--config", str(config), "--source", "s", "--tables", "t", "--manager", "m"
    )
    assert code == 2, err
    assert err.startswith(f"pvm: error: --config {config}: ") and err.count("\n") == 1, err
    assert message in err, err
    assert PASSWORD not in err and "abcdef0123456789" not in err and "12345" not in err
    assert not state.exists()


def test_wrapper_install_takes_no_config() -> None:
    with pytest.raises(SystemExit):
        parse("wrapper", "install", "--config", "x.toml", "--tables", "t")


# -- any command with --config -----------------------------------------------------------------


def test_flags_and_nargs_of_any_parser(tmp_path: Path) -> None:
    parser = Parser(prog="pvm thing")
    config_file.add_to(parser)
    parser.add_argument("--no-color", dest="color", action="store_false")
    parser.add_argument("--fast", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--names", nargs="+", default=[])
    parser.add_argument("--verbose", "-v", action="count", default=0)
    config = write(tmp_path, 'no_color = true\nfast = true\nnames = ["a", "b"]\n')
    args = parser.parse_args(["--config", str(config)])
    assert (args.color, args.fast, args.names) == (False, True, ["a", "b"])
    assert parser.parse_args(["--config", str(config), "--no-fast", "--names", "c"]).fast is False
    assert "verbose" not in config_file.keys(parser)  # a counter is not set from a file


# -- the examples of docs/configuration.md -------------------------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_the_documented_examples_are_accepted(tmp_path: Path) -> None:
    blocks = DOCS.read_text().split("```toml\n")[1:]
    examples = [block.split("```")[0] for block in blocks]
    assert len(examples) == 3
    manager, *wrappers = examples
    args = parse("serve", "--config", str(write(tmp_path, manager, "manager.toml")))
    assert args.data_dir == Path("/var/lib/pvm") and args.catalog_file == Path("/etc/pvm/secrets/catalog-url")
    assert args.spark_conf == ["spark.driver.memory=4g", "spark.sql.shuffle.partitions=8"]
    for i, text in enumerate(wrappers):
        args = parse("wrapper", "run", "--config", str(write(tmp_path, text, f"wrapper{i}.toml")))
        assert args.source in ("shop", "legacy") and args.token_file is not None
