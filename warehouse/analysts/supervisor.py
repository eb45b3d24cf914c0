"""The manager's side of the analysts' query process: start it, keep it informed, watch it,
restart it, and hand it analysts' work within limits.

* **Start and restart.** The process (``worker.py``) is started in a session of its own (so
  that ending it ends its JVM too), with a minimal environment (no secret of the manager's),
  optionally as another OS user. A watcher thread waits until it answers, sends it every
  view's record, then asks its health every ``health_interval_s``; a process that exits, or
  fails three health checks in a row, is ended and started again after a backoff
  (``next_wait``: 1 s, doubling to 30 s, back to 1 s after a minute of health).
  ``restarts`` counts them.
* **Records.** The store's listener (``publish``) only notes the newest record per view; a
  sender thread posts what changed, in order, coalescing bursts. After a restart the whole
  set goes again. So does the newest consistent cut over all views the manager hands over
  (``show_consistent``, at most every ``cut_interval_s``): the process shows it in the
  consistent database (``warehouse/store/published.py``).
* **Limits.** At most ``concurrency`` queries at once, ``per_principal`` per token; more is
  refused at once (``AnalystsBusy``, 429), never queued without bound. A verification's
  recomputation and comparison (``verify``) count as a query.
* **Suspension.** A statement can end the process (exhaust its heap, say) however well it is
  checked, and restarting takes 20 s or so; repeated, that would keep every analyst out. So
  the tokens with work in the process when it dies get a strike (``Suspensions``); from the
  second strike on a token is refused (429 with ``Retry-After``) for 30 s, doubling with each
  strike up to an hour. Strikes are forgotten after an hour without one. An analyst whose
  query merely ran beside the culprit's gets one strike, and no refusal.
* **Timeouts that end the work.** A query past ``timeout_s`` is answered as timed out; its
  Spark jobs are cancelled with their tasks interrupted; if it still runs ``grace_s`` later
  (a plan that blows up on the driver has no job to cancel), the process is ended and
  restarted; so is a process whose cancelled tasks ignore their interrupt for ``grace_s``
  (it ends itself). Every query it was running fails with 503, and nothing else in the
  manager notices.

Nothing here blocks the event loop: process management and record pushes have their own
threads, and queries are HTTP calls over the process's Unix socket.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from warehouse.analysts.engine import CONNECT_TOKEN_ENV
from warehouse.analysts.messages import (
    PinnedView,
    Published,
    QueryRequest,
    QueryResult,
    RowsRequest,
    RowsResult,
    VerifyRequest,
    VerifyResult,
    WorkerHealth,
)
from warehouse.backoff import Backoff

log = logging.getLogger(__name__)

# What the process inherits from the manager's environment: enough to run Python and Java,
# never the manager's own secrets (tokens, database URLs).
_INHERITED = ("PATH", "LANG", "LC_ALL", "JAVA_HOME", "TZ", "PYTHONPATH", "SPARK_HOME", "VIRTUAL_ENV")


_JSON = {"content-type": "application/json"}


class AnalystError(Exception):
    """Analysts' work the manager refuses or could not do (``api/analyst.py`` answers each
    kind with its HTTP status); ``retry_after``: seconds after which asking again may work."""

    retry_after: float | None = None


class AnalystsUnavailable(AnalystError):
    """The process is starting or restarting."""

    retry_after = 5.0


class AnalystsBusy(AnalystError):
    """Over a concurrency limit."""

    retry_after = 1.0


class AnalystSuspended(AnalystsBusy):
    """A token whose work was running each time the query process died, lately."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


SUSPEND_FIRST_S = 30.0
SUSPEND_MAX_S = 3600.0


@dataclass
class Suspension:
    strikes: int
    until: float  # monotonic; refused before it
    last: float  # when the latest strike was given


class Suspensions:
    """Strikes against the tokens whose work was running when the query process died.

    >>> s = Suspensions()
    >>> s.strike(["mallory", "alice"], now=0.0)   # first strike: remembered, not refused
    >>> s.refused_for("alice", now=1.0), s.refused_for("mallory", now=1.0)
    (0.0, 0.0)
    >>> s.strike(["mallory"], now=100.0)          # again: 30 s, then 60 s, … up to an hour
    >>> s.refused_for("mallory", now=110.0)
    20.0
    >>> s.strike(["mallory"], now=200.0); s.refused_for("mallory", now=200.0)
    60.0
    >>> s.strike(["alice"], now=4000.0)  # strikes over an hour old are forgotten: a first one again
    >>> s.refused_for("alice", now=4000.0), len(s)
    (0.0, 1)
    """

    def __init__(self) -> None:
        self._by_token: dict[str, Suspension] = {}

    def __len__(self) -> int:
        return len(self._by_token)

    def strike(self, tokens: Collection[str], now: float) -> None:
        self._forget(now)
        for token in tokens:
            prior = self._by_token.get(token)
            strikes = 1 if prior is None else prior.strikes + 1
            seconds = 0.0 if strikes == 1 else min(SUSPEND_FIRST_S * 2 ** (strikes - 2), SUSPEND_MAX_S)
            self._by_token[token] = Suspension(strikes, now + seconds, now)

    def refused_for(self, token: str, now: float) -> float:
        """Seconds ``token`` is still refused (0: not)."""
        suspension = self._by_token.get(token)
        return 0.0 if suspension is None else max(0.0, suspension.until - now)

    def strikes(self, token: str) -> int:
        suspension = self._by_token.get(token)
        return 0 if suspension is None else suspension.strikes

    def _forget(self, now: float) -> None:
        """Nothing kept per token past an hour without a strike: bounded by the tokens that
        struck lately, not by every token ever seen."""
        for token in [t for t, s in self._by_token.items() if now - max(s.last, s.until) > SUSPEND_MAX_S]:
            del self._by_token[token]


class QueryTimedOut(AnalystError):
    """The query ran past the timeout; its work was stopped."""


class QueryRefused(AnalystError):
    """Spark refused or failed the query (an unknown column, a failed cast, …)."""


@dataclass(frozen=True)
class AnalystSettings:
    """How the analysts' query process runs (``pvm serve --analyst-…``)."""

    work_dir: Path
    master: str = "local[2]"
    memory: str = "1g"
    concurrency: int = 4
    per_principal: int = 2
    timeout_s: float = 120.0
    grace_s: float = 10.0
    max_result_bytes: int = 16 << 20
    connect_port: int = -1  # the process's own Connect server, on loopback; -1: none
    user: str | None = None  # OS user to run it as (the manager must run as root)
    spark_conf: dict[str, str] = field(default_factory=dict)
    health_interval_s: float = 2.0
    start_timeout_s: float = 180.0
    cut_interval_s: float = 0.5  # how often, at most, the consistent views move to a newer cut
    # the waits before a start (``next_wait``)
    restart_backoff: Backoff = field(default_factory=lambda: Backoff(first_s=1.0, max_s=30.0))


T = TypeVar("T")


def next_wait(previous_s: float, lived_s: float, backoff: Backoff) -> float:
    """The wait before starting the next process: ``backoff.first_s`` after one that lived a
    minute, else the wait after ``previous_s``.

    >>> backoff = AnalystSettings(work_dir=Path("analysts")).restart_backoff
    >>> [next_wait(previous, 5.0, backoff) for previous in (1.0, 2.0, 16.0, 30.0)]
    [2.0, 4.0, 30.0, 30.0]
    >>> next_wait(30.0, 61.0, backoff)
    1.0
    """
    return backoff.first_s if lived_s > 60 else backoff.after(previous_s)


class AnalystProcess:
    def __init__(self, settings: AnalystSettings) -> None:
        self.settings = settings
        self.socket = settings.work_dir / "query.sock"
        self.connect_token = secrets.token_urlsafe(32)
        self.connect_port: int | None = None
        self.restarts = 0
        self.last_exit: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._restart = threading.Event()
        self._restart_reason: str | None = None
        self._lock = threading.Lock()
        self._records: dict[str, dict[str, Any]] = {}
        self._pending: dict[str, dict[str, Any] | None] = {}
        self._cut: dict[str, PinnedView] | None = None  # the newest consistent cut over all views
        self._cut_pending = False
        self._in_flight = False
        self._send = threading.Condition(self._lock)
        self._admitted: dict[str, int] = {}
        self.suspensions = Suspensions()
        self._struck_pid: int | None = None  # one strike per death, however many calls saw it
        self._threads: list[threading.Thread] = []
        self._stops: set[asyncio.Task[None]] = set()
        # Analysts' SQL is parsed and checked in the manager before it is sent: on threads of
        # its own, so a flood of long statements waits here and never takes the default pool
        # that commits, publishes and token checks share. Admission comes first, so at most
        # ``concurrency`` checks run or wait at once.
        self._checks = ThreadPoolExecutor(max_workers=max(1, settings.concurrency), thread_name_prefix="analyst-check")

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the process in the background; ``ready`` tells when it answers."""
        self.settings.work_dir.mkdir(parents=True, exist_ok=True)
        if self.settings.user is not None:  # its scratch space and socket are its own
            import pwd

            account = pwd.getpwnam(self.settings.user)
            os.chown(self.settings.work_dir, account.pw_uid, account.pw_gid)
        for target, name in ((self._watch, "analysts-watch"), (self._sender, "analysts-publish")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stopping.set()
        with self._send:
            self._send.notify_all()
        self._end_process()
        for thread in self._threads:
            thread.join(timeout=10)
        self._checks.shutdown(wait=False, cancel_futures=True)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    def restart(self, why: str) -> None:
        """End the process and start a new one (from any thread)."""
        log.warning("restarting the analysts' query process: %s", why)
        self._restart_reason = why
        self._ready.clear()  # no more work for it from now on
        self._restart.set()

    def _strike_running(self) -> None:
        """A strike for every token with work admitted now: the process died under it."""
        process = self._process
        with self._lock:
            if process is None or self._struck_pid == process.pid:
                return
            self._struck_pid = process.pid
            running = list(self._admitted)
            self.suspensions.strike(running, time.monotonic())
        if running:
            log.warning("the analysts' query process died with work of %s running: a strike each", ", ".join(running))

    def status(self) -> dict[str, Any]:
        process = self._process
        return {
            "ready": self.ready,
            "pid": None if process is None else process.pid,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "running": sum(self._admitted.values()),
        }

    def _command(self) -> list[str]:
        s = self.settings
        command = [
            sys.executable,
            "-m",
            "api.analysts_worker",
            "--socket",
            str(self.socket),
            "--work-dir",
            str(s.work_dir),
            "--master",
            s.master,
            "--memory",
            s.memory,
            "--concurrency",
            str(s.concurrency),
            "--connect-port",
            str(s.connect_port),
            "--reap-after",
            str(s.grace_s),
            "--parent-pid",
            str(os.getpid()),
        ]
        for key, value in s.spark_conf.items():
            command += ["--spark-conf", f"{key}={value}"]
        return command

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in _INHERITED}
        env["HOME"] = str(self.settings.work_dir)
        env[CONNECT_TOKEN_ENV] = self.connect_token
        return env

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.socket.unlink(missing_ok=True)
        log_file = open(self.settings.work_dir / "query-process.log", "ab")
        try:
            return subprocess.Popen(
                self._command(),
                cwd=self.settings.work_dir,
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: ending it ends its JVM
                user=self.settings.user,
                group=_group_of(self.settings.user),
            )
        finally:
            log_file.close()

    def _end_process(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)

    def _watch(self) -> None:
        backoff = self.settings.restart_backoff.first_s
        while not self._stopping.is_set():
            self._restart.clear()
            self._restart_reason = None
            started = time.monotonic()
            self._process = self._spawn()
            why = self._wait_until_answering() or self._show_everything()
            if why is None:
                self._ready.set()
                log.info("analysts' query process %d is ready", self._process.pid)
                why = self._supervise()
            self._ready.clear()
            self._end_process()
            if self._stopping.is_set():
                return
            self.last_exit = why
            self.restarts += 1
            backoff = next_wait(backoff, time.monotonic() - started, self.settings.restart_backoff)
            log.warning("analysts' query process ended (%s); starting another in %.1f s", why, backoff)
            self._stopping.wait(backoff)

    def _wait_until_answering(self) -> str | None:
        """None once the process answers; else why it will not."""
        process = self._process
        assert process is not None
        deadline = time.monotonic() + self.settings.start_timeout_s
        while time.monotonic() < deadline:
            if self._stopping.is_set() or self._restart.is_set():
                return self._restart_reason or "stopped"
            if process.poll() is not None:
                return f"exited with code {process.returncode} while starting"
            health = self._health()
            if health is not None and health.ready:
                self.connect_port = health.connect_port
                return None
            time.sleep(0.2)
        return f"did not answer within {self.settings.start_timeout_s:.0f} s of its start"

    def _show_everything(self) -> str | None:
        """Send a new process every view's record before it takes analysts' work: a query
        must never find a view missing. None once it has them; else why not."""
        with self._send:
            message = Published(views=dict(self._records), reset=True, consistent=self._cut)
            self._pending.clear()
            self._cut_pending = False
            self._in_flight = True
        try:
            delivered = self._post_records(message)
        finally:
            with self._send:
                self._in_flight = False
                if not delivered:
                    for view, record in message.views.items():
                        self._pending.setdefault(view, record)
                    self._cut_pending = self._cut is not None
        return None if delivered else "did not take the views' records"

    def _supervise(self) -> str:
        """Watch the ready process; returns why it must be ended (or has ended)."""
        process = self._process
        assert process is not None
        failures = 0
        while not self._stopping.is_set():
            if self._restart.wait(self.settings.health_interval_s):
                return self._restart_reason or "restart asked"
            if process.poll() is not None:
                self._strike_running()
                return f"exited with code {process.returncode}"
            failures = 0 if self._health() is not None else failures + 1
            if failures >= 3:
                return "stopped answering its health checks"
        return "stopped"

    def _health(self) -> WorkerHealth | None:
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), timeout=5.0) as client:
                response = client.get("http://analysts/health")
            return WorkerHealth.model_validate_json(response.content) if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, OSError):
            return None

    # -- records --------------------------------------------------------------------------------
    def publish(self, view: str, meta: Any) -> None:
        """The store's listener: note the newest record of ``view`` (None: dropped)."""
        record = None if meta is None else meta.to_record()
        with self._send:
            if record is None:
                self._records.pop(view, None)
            else:
                self._records[view] = record
            self._pending[view] = record
            self._send.notify_all()

    def show_consistent(self, cut: dict[str, PinnedView]) -> None:
        """Note the newest consistent cut over all views (``Manager.cut_of_all``):
        sent with the next records, and to every new process."""
        with self._send:
            if cut == self._cut:
                return
            self._cut = cut
            self._cut_pending = True
            self._send.notify_all()

    def cut_orders(self) -> dict[str, int] | None:
        """The orders of the newest cut noted by ``show_consistent`` (None: none yet)."""
        with self._send:
            return None if self._cut is None else {name: pin.as_of for name, pin in self._cut.items()}

    def _sender(self) -> None:
        while not self._stopping.is_set():
            with self._send:
                while not self._stopping.is_set() and not (self.ready and (self._pending or self._cut_pending)):
                    self._send.wait(timeout=1.0)
                if self._stopping.is_set():
                    return
                # records first, then the cut: the cut names its own records, so either order
                # shows what was sent; one message keeps them together
                message = Published(views=dict(self._pending), consistent=self._cut if self._cut_pending else None)
                generation = self.restarts
                self._pending.clear()
                self._cut_pending = False
                self._in_flight = True
            delivered = self._post_records(message)
            with self._send:
                self._in_flight = False
                # keep what did not arrive (newer records win), unless a new process took
                # every record since
                if not delivered and generation == self.restarts:
                    for view, record in message.views.items():
                        self._pending.setdefault(view, record)
                    self._cut_pending = self._cut_pending or message.consistent is not None
                self._send.notify_all()
            if not delivered:
                self._stopping.wait(0.5)

    def _post_records(self, message: Published) -> bool:
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), timeout=60.0) as client:
                response = client.post("http://analysts/publish", content=message.model_dump_json(), headers=_JSON)
            if response.status_code != 200:
                log.warning("the analysts' query process refused records: %s", response.text[:500])
            return response.status_code == 200
        except (httpx.HTTPError, OSError):
            return False

    def shown(self) -> bool:
        """Whether every record noted so far has reached the process."""
        with self._send:
            return self.ready and not self._pending and not self._cut_pending and not self._in_flight

    # -- analysts' work ---------------------------------------------------------------------------
    @contextmanager
    def admit(self, who: str) -> Iterator[None]:
        """Count a request of ``who`` against the limits; AnalystsBusy over them."""
        with self._lock:
            if (wait := self.suspensions.refused_for(who, time.monotonic())) > 0:
                raise AnalystSuspended(
                    f"{who}'s work was running the last {self.suspensions.strikes(who)} times the analysts' query "
                    f"process died; its queries are refused for {wait:.0f} s more",
                    retry_after=max(1.0, wait),
                )
            if sum(self._admitted.values()) >= self.settings.concurrency:
                raise AnalystsBusy(
                    f"{self.settings.concurrency} analyst queries are running, the most the service runs at once; "
                    "try again shortly"
                )
            if self._admitted.get(who, 0) >= self.settings.per_principal:
                raise AnalystsBusy(
                    f"{who} already runs {self.settings.per_principal} queries, the most one token may run at once"
                )
            self._admitted[who] = self._admitted.get(who, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._admitted[who] -= 1
                if not self._admitted[who]:
                    del self._admitted[who]

    async def check(self, check: Callable[..., T], *args: Any) -> T:
        """``check(*args)`` on the analysts' own check threads (parsing SQL takes a while: not on
        the event loop, and not on the pool that maintenance shares)."""
        return await asyncio.get_running_loop().run_in_executor(self._checks, check, *args)

    async def query(
        self,
        sql: str,
        limit: int,
        who: str,
        check: Callable[[str], str] | None = None,
        pin: Callable[[str], Awaitable[dict[str, PinnedView]]] | None = None,
    ) -> QueryResult:
        """Run analyst SQL, checked first by ``check`` (``api/analyst.py``'s ``check_query``)
        once the request is admitted: a refused statement costs its slot for the check only.
        ``pin``: the views the checked SQL reads at given orders (a consistent cut), asked
        once the check has passed."""
        with self.admit(who):
            if check is not None:
                sql = await self.check(check, sql)
            views = await pin(sql) if pin is not None else {}
            tag = f"pvm-query-{uuid.uuid4().hex}"
            request = QueryRequest(sql=sql, limit=limit, views=views, tag=tag, max_bytes=self.settings.max_result_bytes)
            return QueryResult.model_validate(await self._call("/query", request.model_dump_json(), tag))

    async def rows(self, record: dict[str, Any], as_of: int | None, offset: int, limit: int, who: str) -> RowsResult:
        """A sorted page of a view's rows as of ``as_of``, from the files ``record`` names."""
        with self.admit(who):
            tag = f"pvm-rows-{uuid.uuid4().hex}"
            request = RowsRequest(
                record=record,
                as_of=as_of,
                offset=offset,
                limit=limit,
                tag=tag,
                max_bytes=self.settings.max_result_bytes,
            )
            return RowsResult.model_validate(await self._call("/rows", request.model_dump_json(), tag))

    async def verify(self, request: VerifyRequest, who: str) -> VerifyResult:
        """Recompute a view from the relations in ``request`` and compare it with the view as
        of W, read from the files of the request's record (a verification's engine part,
        ``warehouse/verify.py``). It counts against the limits as a query of ``who`` does."""
        with self.admit(who):
            tag = f"pvm-verify-{uuid.uuid4().hex}"
            # the relations may be large: encoded off the event loop
            body = await asyncio.to_thread(request.model_copy(update={"tag": tag}).model_dump_json)
            return VerifyResult.model_validate(await self._call("/verify", body, tag, "the verification"))

    async def _call(self, path: str, body: str, tag: str, what: str = "the query") -> Any:
        if not self.ready:
            raise AnalystsUnavailable("the analysts' query process is starting; try again shortly")
        transport = httpx.AsyncHTTPTransport(uds=str(self.socket))
        async with httpx.AsyncClient(transport=transport, timeout=None) as client:
            try:
                response = await asyncio.wait_for(
                    client.post(f"http://analysts{path}", content=body, headers=_JSON),
                    self.settings.timeout_s,
                )
            except TimeoutError:
                self._stop_later(tag)
                raise QueryTimedOut(
                    f"{what} ran longer than {self.settings.timeout_s:.0f} s and was cancelled"
                ) from None
            except httpx.HTTPError:
                self._strike_running()
                self.restart("its socket stopped answering in the middle of a request")
                raise AnalystsUnavailable(
                    "the analysts' query process ended while answering and is being restarted; try again shortly"
                ) from None
        if response.status_code == 400:
            raise QueryRefused(f"{what} failed: {_detail(response)}")
        if response.status_code != 200:
            raise AnalystsUnavailable(f"the analysts' query process failed: {_detail(response)}")
        return response.json()

    def _stop_later(self, tag: str) -> None:
        task = asyncio.get_running_loop().create_task(self._stop_work(tag))
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _stop_work(self, tag: str) -> None:
        """Cancel the jobs of ``tag``; end the process if it still runs ``grace_s`` later."""
        await asyncio.to_thread(self.stop_work, tag)

    def stop_work(self, tag: str) -> None:
        """Blocking form of ``_stop_work`` (for the Connect gateway's threads too)."""
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), timeout=5.0) as client:
                client.post("http://analysts/cancel", json={"tag": tag})
        except (httpx.HTTPError, OSError):
            pass
        deadline = time.monotonic() + self.settings.grace_s
        while time.monotonic() < deadline:
            health = self._health()
            if health is None or tag not in health.running:
                return
            time.sleep(0.2)
        self.restart(f"query {tag} still ran {self.settings.grace_s:.0f} s after it was cancelled")


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))[:1000]
    except ValueError:
        return response.text[:1000]


def _group_of(user: str | None) -> int | None:
    if user is None:
        return None
    import pwd

    return pwd.getpwnam(user).pw_gid
