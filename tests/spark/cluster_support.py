"""A deployment as deploy/README.md runs it, on this machine: a standalone Spark cluster of
``deploy/spark-cluster.sh`` and the manager as ``pvm serve --config FILE`` in a process of
its own, talked to over HTTP only. The cluster tests share it.

Everything started here is ended by pid or process group, also when a test fails: the
daemons by ``spark-cluster.sh stop`` (each daemon's process group holds its executors),
the manager's process group, and whatever is left that names the test's directory on its
command line (``leftovers``)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "spark-cluster.sh"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_groups() -> dict[int, list[int]]:
    """Every process group of the machine and its processes."""
    groups: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            groups.setdefault(int(fields[2]), []).append(int(entry.name))
    return groups


def command_lines() -> dict[int, str]:
    """The command line of every process of the machine (what ``ps`` shows anyone)."""
    lines = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                lines[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
    return lines


def leftovers(directory: Path) -> dict[int, str]:
    """The processes whose command line names ``directory`` (the test's own)."""
    return {pid: line for pid, line in command_lines().items() if str(directory) in line}


def kill_leftovers(directory: Path, grace_s: float = 0.0) -> dict[int, str]:
    """SIGKILL every process that names ``directory`` once ``grace_s`` has passed (or sooner,
    when none is left: a stopping JVM takes a moment to end); what there was then."""
    deadline = time.monotonic() + grace_s
    while (found := leftovers(directory)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return found


def cluster(
    command: str, run_dir: Path, *options: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), command, "--run-dir", str(run_dir), "--python", sys.executable, *options],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


@dataclass
class SparkCluster:
    """A master and ``workers`` workers of ``spark-cluster.sh`` on loopback, with Spark's
    shared-secret authentication (the secret in ``secret_file``)."""

    run_dir: Path
    secret_file: Path
    workers: int = 2
    port: int = field(default_factory=free_port)
    webui: int = field(default_factory=free_port)
    worker_webui: int = field(default_factory=free_port)

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def start(self) -> None:
        options = ["--host", "127.0.0.1", "--master-port", str(self.port), "--master-webui-port", str(self.webui)]
        options += ["--worker-webui-port", str(self.worker_webui), "--workers", str(self.workers)]
        options += ["--worker-cores", "1", "--worker-memory", "1g", "--timeout", "120"]
        options += ["--auth-secret-file", str(self.secret_file)]
        started = cluster("start", self.run_dir, *options)
        assert started.returncode == 0, started.stderr + self.logs()

    def stop(self) -> subprocess.CompletedProcess[str]:
        return cluster("stop", self.run_dir)

    def daemon_pid(self, name: str) -> int:
        return int((self.run_dir / f"{name}.pid").read_text())

    def kill_worker(self, number: int) -> list[int]:
        """kill -9 of worker ``number``'s JVM and its executor (its process group, as a
        machine that dies takes them all); the pids killed."""
        pgid = self.daemon_pid(f"worker-{number}")
        pids = process_groups().get(pgid, [])
        os.killpg(pgid, signal.SIGKILL)
        return pids

    def state(self) -> dict[str, Any]:
        """The master's status (its web UI's JSON)."""
        with httpx.Client(timeout=5) as http:
            return dict(http.get(f"http://127.0.0.1:{self.webui}/json/").json())

    def logs(self) -> str:
        return "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in self.run_dir.glob("*.log"))


class ServedManager:
    """``pvm serve --config FILE`` in a process group of its own; a ``Deployment`` of
    ``pvm.bench.three_sources`` (wrappers started by a ``WrapperSet``), over HTTP."""

    def __init__(self, data_dir: Path, config: Path, port: int) -> None:
        self.data_dir = data_dir
        self.config = config
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.wrappers: dict[str, Any] = {}
        self.process: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / "manager.log"
        self.starts = 0

    def start(self, timeout: float = 150.0) -> float:
        """Start it and wait until it has started (Spark, the analysts' process, recovery of
        every view); the seconds it took."""
        began = time.monotonic()
        self.starts += 1
        with open(self.log, "ab") as log:
            log.write(f"=== start {self.starts}\n".encode())
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pvm", "serve", "--config", str(self.config)],
                stdout=log,
                stderr=log,
                cwd=self.data_dir.parent,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                start_new_session=True,
            )
        deadline = began + timeout
        with httpx.Client(timeout=5) as http:
            while True:
                assert self.process.poll() is None, f"pvm serve ended ({self.process.returncode}):{self.tail()}"
                assert time.monotonic() < deadline, f"pvm serve did not start in {timeout} s:{self.tail()}"
                try:
                    if not http.get(f"{self.url}/v1/health").json().get("starting", True):
                        return time.monotonic() - began
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, as systemd stops it; SIGKILL of its process group after ``timeout``."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        return self.process.returncode

    def tail(self, chars: int = 4000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        spark_log = self.data_dir / "spark.log"
        spark = spark_log.read_text(errors="replace")[-chars:] if spark_log.exists() else ""
        return f"\n--- manager.log\n{text[-chars:]}\n--- spark.log\n{spark}"

    @property
    def admin_token(self) -> str:
        return (self.data_dir / "admin-token").read_text().strip()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The answer's JSON; a 503 (a part still starting) is asked again after its
        Retry-After, for two minutes at most."""
        deadline = time.monotonic() + 120
        with httpx.Client(timeout=120) as http:
            while True:
                response = http.request(method, f"{self.url}{path}", headers=self.headers(), **kwargs)
                if response.status_code != 503 or time.monotonic() > deadline:
                    break
                time.sleep(min(float(response.headers.get("retry-after", 1)), 2.0))
        assert response.status_code < 300, f"{method} {path}: {response.status_code} {response.text}"
        return response.json()

    def token(self, role: str, source: str | None = None) -> str:
        return str(
            self.call("POST", "/v1/tokens", json={"role": role, "source": source, "name": f"{role} test"})["token"]
        )

    async def wrapper_token(self, source: str) -> str:
        return await asyncio.to_thread(self.token, "wrapper", source)

    async def register_source(
        self, name: str, wrapper_url: str, capture: str, tables: list[str], manager_token: str
    ) -> None:
        body = {"name": name, "wrapper_url": wrapper_url, "capture": capture, "tables": tables}
        await asyncio.to_thread(self.call, "POST", "/v1/sources", json=body | {"manager_token": manager_token})

    def connect_url(self) -> str:
        """The Spark Connect address the last start printed (``connect_port = 0``)."""
        lines = [line for line in self.log.read_text().splitlines() if line.startswith("spark connect on ")]
        assert lines, f"no Spark Connect address printed:{self.tail()}"
        return lines[-1].split()[3]
