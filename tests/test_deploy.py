"""``deploy/``: the systemd units pass ``systemd-analyze verify`` (installed by
``scripts/test_tools.sh``; the test fails without it), keep the settings a deployment relies
on, and the example configuration files are accepted by the real parsers."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pvm import config_file
from pvm.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"
UNIT_NAMES = ["pvm-manager.service", "pvm-wrapper@.service", "pvm-spark-master.service", "pvm-spark-worker.service"]
# where deploy/README.md installs the virtualenv and the project's files
INSTALLED = {"/opt/pvm/venv/bin/": f"{Path(sys.executable).parent}/", "/opt/pvm/src/": f"{ROOT}/"}


@pytest.fixture(autouse=True)
def no_config_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(config_file.ENV, raising=False)


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    assert path, "systemd-analyze is missing: bash scripts/test_tools.sh installs it (Debian's systemd package)"
    return path


def installed_copy(directory: Path, units: dict[str, str]) -> list[Path]:
    """The units as installed on this machine: their /opt/pvm paths pointed at this
    checkout and its virtualenv, and a template verified as an instance (``@shop``)."""
    directory.mkdir(exist_ok=True)
    paths = []
    for name, text in units.items():
        for installed, here in INSTALLED.items():
            text = text.replace(installed, here)
        (directory / name).write_text(text)
        if name.endswith("@.service"):
            instance = directory / name.replace("@.", "@shop.")
            instance.symlink_to(name)
            paths.append(instance)
        else:
            paths.append(directory / name)
    return paths


def verify(paths: list[Path]) -> str:
    """What ``systemd-analyze verify`` finds wrong with the units: an empty string if nothing.
    It exits 0 on unknown keys and values it cannot parse (it only warns), so any line it
    prints counts as a problem."""
    done = subprocess.run(
        [systemd_analyze(), "verify", "--man=no", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=paths[0].parent,
    )
    problems = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        problems += f"\n(exit status {done.returncode})"
    return problems.strip()


def unit_texts() -> dict[str, str]:
    return {name: (UNITS / name).read_text() for name in UNIT_NAMES}


def settings(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_the_units_are_the_ones_documented() -> None:
    assert sorted(path.name for path in UNITS.iterdir()) == sorted(UNIT_NAMES)
    readme = (DEPLOY / "README.md").read_text()
    for name in UNIT_NAMES:
        assert name in readme


def test_every_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    assert verify(installed_copy(tmp_path / "units", unit_texts())) == ""


@pytest.mark.parametrize(
    "change, problem",
    [
        (("Restart=on-failure", "Restart=sometimes"), "restart specifier"),
        (("NoNewPrivileges=yes", "NoNewPrivilege=yes"), "Unknown key"),
        (("/opt/pvm/venv/bin/pvm", "/opt/pvm/venv/bin/pvm-missing"), "is not executable"),
        (("[Service]", "[Servce]"), "Unknown section"),
    ],
)
def test_a_broken_unit_is_reported(tmp_path: Path, change: tuple[str, str], problem: str) -> None:
    units = unit_texts()
    old, new = change
    units["pvm-manager.service"] = units["pvm-manager.service"].replace(old, new)
    problems = verify(installed_copy(tmp_path / "units", units))
    assert problem in problems and "pvm-manager.service" in problems


@pytest.mark.parametrize("name", UNIT_NAMES)
def test_each_unit_runs_hardened_as_its_own_user(name: str) -> None:
    unit = settings((UNITS / name).read_text())
    assert unit["User"] == ["pvm"] and unit["Group"] == ["pvm"]
    assert unit["Restart"] == ["on-failure"]
    assert len(unit["EnvironmentFile"]) == 1 and unit["EnvironmentFile"][0].startswith("/etc/pvm/")
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "UMask": "0077",
    }.items():
        assert unit[key] == [value], key
    # the directory it writes is its own (StateDirectory=) and writable despite ProtectSystem
    state = unit["StateDirectory"][0]
    assert f"/var/lib/{state}" in unit["ReadWritePaths"][0].split()
    assert "MemoryDenyWriteExecute" not in unit  # the JVM's JIT writes code it runs
    assert unit["ExecStart"][0].split()[0] in ("/opt/pvm/venv/bin/pvm", "/opt/pvm/src/deploy/spark-cluster.sh")


def test_the_worker_may_write_the_store() -> None:
    worker = settings((UNITS / "pvm-spark-worker.service").read_text())
    manager = settings((UNITS / "pvm-manager.service").read_text())
    assert f"-/var/lib/{manager['StateDirectory'][0]}" in worker["ReadWritePaths"][0].split()


# -- the example configuration files ---------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    return build_parser(list(argv)).parse_args(list(argv))


def test_the_example_configuration_files_are_accepted() -> None:
    manager = parse("serve", "--config", str(DEPLOY / "manager.toml"))
    assert manager.data_dir == Path("/var/lib/pvm") and manager.catalog_file == Path("/etc/pvm/secrets/catalog-url")
    assert manager.spark_master == "spark://10.0.0.5:7077" and manager.connect_port == 15002
    assert manager.connect_tls_cert == Path("/etc/pvm/tls/connect.crt")
    shop = parse("wrapper", "run", "--config", str(DEPLOY / "wrapper-shop.toml"))
    assert shop.source == "shop" and shop.url_file == Path("/etc/pvm/secrets/shop-url")
    assert shop.token_file is not None and shop.manager_token_file is not None
    assert shop.state_dir == Path("/var/lib/pvm-wrappers")


def test_the_readmes_toml_examples_are_accepted(tmp_path: Path) -> None:
    """Every ```toml block of deploy/README.md, as the manager's or a wrapper's file."""
    blocks = [block.split("```")[0] for block in (DEPLOY / "README.md").read_text().split("```toml\n")[1:]]
    assert blocks
    for i, text in enumerate(blocks):
        path = tmp_path / f"example{i}.toml"
        path.write_text(text)
        command = ("wrapper", "run") if re.search(r"^source\s*=", text, re.M) else ("serve",)
        parse(*command, "--config", str(path))


def test_the_examples_match_the_units() -> None:
    """The paths the units use are the ones the examples and the README install."""
    manager = parse("serve", "--config", str(DEPLOY / "manager.toml"))
    shop = parse("wrapper", "run", "--config", str(DEPLOY / "wrapper-shop.toml"))
    units = unit_texts()
    assert f"ReadWritePaths={manager.data_dir}\n" in units["pvm-manager.service"]
    assert f"ReadWritePaths={shop.state_dir}\n" in units["pvm-wrapper@.service"]
    assert "--config /etc/pvm/manager.toml" in units["pvm-manager.service"]
    assert "--config /etc/pvm/wrapper-%i.toml" in units["pvm-wrapper@.service"]


def test_spark_env_names_only_what_the_script_reads() -> None:
    script = (DEPLOY / "spark-cluster.sh").read_text()
    names = re.findall(r"^#?\s*([A-Z_]+)=", (DEPLOY / "spark.env").read_text(), re.M)
    assert "SPARK_MASTER_URL" in names and "PVM_PYTHON" in names
    for name in names:
        assert name == "JAVA_HOME" or f"${{{name}:-" in script, name
