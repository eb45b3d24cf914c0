"""``pvm bench abuse``: does a deployment keep maintaining its view while its API is attacked?

A whole deployment runs as in ``pvm bench commit``: three SQLite sources with trigger
capture and their wrapper processes, the manager in this process with the Spark store,
background compaction and the analysts' query process, and a three-way join view. A writer
process commits source transactions at a steady ``--rate`` for the whole run. After a warm-up
the run has two phases of ``--seconds`` each, side by side:

1. **quiet**: the writer only;
2. **attack**: the writer, plus one attacker process per kind of attack below, each sending
   to 127.0.0.1 only, bounded in requests and in time (it stops at the end of the phase):

   * ``heavy_queries``: analyst SQL that blows up (a string of 2^31 characters, a chain of
     twelve CTEs that doubles the plan at every step, a five-way self cross join) over REST
     three at a time with two analyst tokens (one token may run two queries at once);
   * ``bad_tokens``: requests without a valid token at a high rate (random secrets for an
     existing token id, unknown ids, malformed tokens, none);
   * ``row_pages``: the largest row pages (``GET /v1/views/V/rows?limit=10000``) with another
     analyst token, and pages over the limit;
   * ``bad_updates``: ``POST /v1/updates`` with a wrong wrapper token: oversized bodies,
     malformed JSON, a lying ``Content-Length``.

Every second, in both phases, the run samples the view's lag (``lag_seconds``) and W from
the manager, how long ``GET /v1/views/V`` takes over HTTP (what a monitor sees), the RSS and
CPU of the manager's process and of its Spark JVM, and the RSS of the analysts' query process
(its pid from the supervisor, which restarts it). It reports per phase the lag's p50/p99/max,
W's progress (units committed and made visible per second) and the memory at the start, the
end and the most, then attack/quiet ratios; per attack, the requests sent and the statuses
received. The attackers are processes of their own so that their work is not counted as the
manager's; they share the machine's cores with it, as a real attacker on the host would.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import queue
import random
import threading
import time
from collections import Counter
from pathlib import Path

from pvm.bench.process_memory import status_kib
from pvm.bench.spark_deployment import (
    measured,
    populate_sources,
    quantile,
    running_analysts,
    start_spark_store,
    write_figures,
    write_transactions,
)
from pvm.cli import CliError
from pvm.demo import SCHEMAS

VIEW = "abused_orders"
VIEW_SQL = (
    f"CREATE VIEW {VIEW} AS SELECT o.id AS order_id, o.qty, c.name AS customer, p.name AS product "
    "FROM crm.customers c, shop.orders o, inventory.products p "
    "WHERE o.customer_id = c.id AND o.product_id = p.id"
)
ATTACKS = ("heavy_queries", "bad_tokens", "row_pages", "bad_updates")
# Queries that blow up, modelled on what an outside review sent: a 2 GiB string per row (the
# check refuses it), text that doubles per row past any heap (it reaches the query process
# and ends it: its sender is suspended), a plan that doubles twelve times (4,096 view scans),
# and 2000^5 rows of a cross join.
HEAVY_QUERIES = {
    "lpad": f"SELECT length(lpad(customer, 2147483647, 'y')) FROM {VIEW} LIMIT 1",
    "doubling": (
        f"SELECT length(aggregate(collect_list(a.customer), 'y', (acc, x) -> concat(acc, acc))) FROM {VIEW} a, {VIEW} b"
    ),
    "cte_chain": (
        f"WITH c0 AS (SELECT order_id FROM {VIEW}), "
        + ", ".join(
            f"c{i} AS (SELECT order_id FROM c{i - 1} UNION ALL SELECT order_id FROM c{i - 1})" for i in range(1, 13)
        )
        + " SELECT count(*) FROM c12"
    ),
    "cross_join": f"SELECT count(*) FROM {', '.join(f'{VIEW} {alias}' for alias in 'abcde')}",
}
PHASES = ("quiet", "attack")
BAD_TOKEN_THREADS = 4


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rate", type=float, default=100.0, help="source transactions per second, all sources (default: 100)"
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase (default: 30)")
    parser.add_argument(
        "--warmup", type=float, default=5.0, help="seconds of writing before the quiet phase starts (default: 5)"
    )
    parser.add_argument("--rows", type=int, default=2000, help="customers, products and initial orders (default: 2000)")
    parser.add_argument("--parallelism", type=int, default=4, help="PPU size p of the view (default: 4)")
    parser.add_argument(
        "--batch-size", type=int, default=20, help="queued updates of one source maintained as one unit (default: 20)"
    )
    parser.add_argument(
        "--query-timeout",
        type=float,
        default=10.0,
        help="the service's --query-timeout (default here: 10 s, so that queries past it end within a phase)",
    )
    parser.add_argument(
        "--analyst-memory", default="1g", help="heap of the analysts' query process (default: 1g, as pvm serve)"
    )
    parser.add_argument(
        "--analyst-master", default="local[2]", help="its Spark master (default: local[2], as pvm serve)"
    )
    parser.add_argument(
        "--bad-token-rate", type=float, default=200.0, help="requests per second with bad tokens (default: 200)"
    )
    parser.add_argument(
        "--max-requests",
        type=int,
        default=20_000,
        help="the most requests one attacker sends (default: 20,000); each also stops when its phase ends",
    )
    parser.add_argument(
        "--attacks",
        default=",".join(ATTACKS),
        help=f"comma-separated attacks to run (default: all of {','.join(ATTACKS)})",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where sources, catalog and Spark files go (default: a temporary directory)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures and samples here, a PNG next to it")
    parser.add_argument("--seed", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    attacks = [a.strip() for a in args.attacks.split(",") if a.strip()]
    if unknown := sorted(set(attacks) - set(ATTACKS)):
        raise CliError(f"unknown attacks {', '.join(unknown)}; known: {', '.join(ATTACKS)}")
    if args.rate <= 0 or args.seconds <= 0 or args.warmup < 0 or args.rows < 10 or args.query_timeout <= 0:
        raise CliError("need --rate > 0, --seconds > 0, --warmup >= 0, --rows >= 10 and --query-timeout > 0")
    if min(args.parallelism, args.batch_size, args.max_requests) < 1 or args.bad_token_rate <= 0:
        raise CliError("--parallelism, --batch-size, --max-requests and --bad-token-rate must be positive")
    args.attack_kinds = attacks
    figures = measured(args, "pvm-bench-abuse-", measure)
    report(figures)
    write_figures(args.json, figures, plot)
    return 0


def measure(args: argparse.Namespace, data_dir: Path) -> dict:
    from rich.console import Console

    console = Console(stderr=True)
    store = start_spark_store(data_dir, console)
    return asyncio.run(AbuseRun(args, data_dir, store, console).run())


# -- process figures from /proc ---------------------------------------------------------------------
_TICKS = os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int | None:
    return status_kib(pid, "VmRSS") * 1024 or None  # None: the process is gone


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU of ``pid`` so far."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14 and 15)


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listed:
                out += [int(c) for c in listed.read().split()]
    except OSError:
        pass
    return out


def is_java(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip() == "java"
    except OSError:
        return False


# -- the attackers (each in a process of its own) --------------------------------------------------
def restarting_analysts(response) -> bool:
    """Whether a 5xx answer is the documented 503 of analysts' work while their query process
    starts, or ended in the middle of it and is restarted (``docs/analysts.md``)."""
    return (
        response.status_code == 503
        and response.headers.get("retry-after") is not None
        and "analysts' query process" in response.text
    )


class Tally:
    """What one attacker sent and got back, by request kind."""

    def __init__(self, attack: str) -> None:
        self.attack = attack
        self.lock = threading.Lock()
        self.sent: Counter[str] = Counter()
        self.statuses: dict[str, Counter[str]] = {}
        self.errors: Counter[str] = Counter()  # no HTTP answer: timeouts, refused connections
        self.server_errors: list[dict] = []  # the first few 5xx answers, as received
        self.seconds: list[float] = []
        self.unexpected_5xx = 0  # 5xx other than the analysts' query process (re)starting
        self.examples: dict[str, dict[str, str]] = {}  # kind -> status -> the first answer's body

    def record(self, kind: str, started: float, response=None, error: BaseException | None = None) -> None:
        with self.lock:
            self.sent[kind] += 1
            self.seconds.append(time.monotonic() - started)
            if response is None:
                self.errors[f"{kind}: {type(error).__name__}"] += 1
                return
            self.statuses.setdefault(kind, Counter())[str(response.status_code)] += 1
            self.examples.setdefault(kind, {}).setdefault(str(response.status_code), response.text[:300])
            if response.status_code >= 500 and not restarting_analysts(response):
                self.unexpected_5xx += 1
            if response.status_code >= 500 and len(self.server_errors) < 20:
                self.server_errors.append(
                    {
                        "kind": kind,
                        "status": response.status_code,
                        "retry_after": response.headers.get("retry-after"),
                        "body": response.text[:400],
                    }
                )

    def send(self, client, kind: str, method: str, path: str, **request) -> None:
        """One request with the attacker's ``httpx.Client``, recorded as ``kind``."""
        import httpx

        began = time.monotonic()
        try:
            response = client.request(method, path, **request)
        except httpx.HTTPError as exc:
            self.record(kind, began, error=exc)
        else:
            self.record(kind, began, response)

    def figures(self, elapsed: float) -> dict:
        seconds = sorted(self.seconds)
        total: Counter[str] = Counter()
        for counts in self.statuses.values():
            total.update(counts)
        return {
            "sent": sum(self.sent.values()),
            "seconds": round(elapsed, 2),
            "cpu_s": round(time.process_time(), 2),  # the attacker's own: cores it took from the machine
            "by_kind": {
                kind: {"sent": n, "statuses": dict(self.statuses.get(kind, {}))} for kind, n in self.sent.items()
            },
            "statuses": dict(sorted(total.items())),
            "status_5xx": sum(n for code, n in total.items() if code.startswith("5")),
            "status_5xx_unexpected": self.unexpected_5xx,
            "no_answer": dict(self.errors),
            "latency_p50_s": round(quantile(seconds, 0.5), 4),
            "latency_max_s": round(seconds[-1], 3) if seconds else None,
            "server_errors": self.server_errors,
            "examples": self.examples,
        }


def attack(kind: str, url: str, credentials: dict, begin: float, until: float, settings: dict, results) -> None:
    """Run attack ``kind`` against the manager at ``url`` from the wall-clock time ``begin``
    until ``until`` or ``settings["max_requests"]``, then put ``(kind, figures)`` on
    ``results``. (The process starts before ``begin``: starting one takes seconds.)"""
    import httpx

    time.sleep(max(0.0, begin - time.time()))
    tally = Tally(kind)
    started = time.monotonic()
    budget = iter(range(settings["max_requests"]))
    budget_lock = threading.Lock()

    def go_on() -> bool:
        with budget_lock:
            return time.time() < until and next(budget, None) is not None

    rng = random.Random(f"{kind}-{until}")
    # several threads for bad tokens: one waits for each answer, and a loaded manager answers
    # a refusal in tens of milliseconds, far below the rate asked for
    workers = {"heavy_queries": 3, "row_pages": 2, "bad_tokens": BAD_TOKEN_THREADS, "bad_updates": 1}[kind]
    step = ATTACK_STEPS[kind]

    def worker(n: int) -> None:
        timeout = settings["query_timeout_s"] + 30  # the service answers a query by then
        with httpx.Client(base_url=url, timeout=timeout) as client:
            i = n
            while go_on():
                step(client, tally, credentials, settings, rng, i)
                i += workers

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:  # a request in flight at the deadline finishes (within its timeout)
        thread.join()
    results.put((kind, tally.figures(time.monotonic() - started)))


def _heavy_query(client, tally: Tally, credentials, settings, rng, i: int) -> None:
    # cheap refusals first in each round, so that the queries that reach Spark interleave
    name = ("cte_chain", "lpad", "cross_join", "doubling")[i % 4]
    token = credentials["analysts"][i % len(credentials["analysts"])]
    tally.send(
        client,
        name,
        "POST",
        "/v1/query",
        json={"sql": HEAVY_QUERIES[name], "limit": 10},
        headers={"Authorization": f"Bearer {token}"},
    )
    time.sleep(0.05)  # a 429 or 503 comes back at once: do not spin


def _bad_token(client, tally: Tally, credentials, settings, rng, i: int) -> None:
    began = time.monotonic()
    known = credentials["known_id"]
    tokens = {
        "random_secret": f"pvm_{known}_{rng.randbytes(32).hex()}",
        "unknown_id": f"pvm_{rng.randint(10_000, 2**40)}_{rng.randbytes(32).hex()}",
        "malformed": "pvm_" + "x" * rng.randint(1, 300),
        "none": None,
    }
    name = list(tokens)[i % len(tokens)]
    headers = {} if tokens[name] is None else {"Authorization": f"Bearer {tokens[name]}"}
    if i % 2:
        tally.send(client, name, "GET", f"/v1/views/{VIEW}", headers=headers)
    else:
        tally.send(client, name, "POST", "/v1/query", json={"sql": f"SELECT * FROM {VIEW}"}, headers=headers)
    pause = began + BAD_TOKEN_THREADS / settings["bad_token_rate"] - time.monotonic()
    if pause > 0:
        time.sleep(pause)


def _row_page(client, tally: Tally, credentials, settings, rng, i: int) -> None:
    headers = {"Authorization": f"Bearer {credentials['pager']}"}
    if i % 10 == 9:  # over the largest page: refused before anything is read
        tally.send(client, "over_limit", "GET", f"/v1/views/{VIEW}/rows", params={"limit": 10_001}, headers=headers)
    else:
        params = {"limit": 10_000, "offset": rng.randint(0, settings["rows"])}
        if i % 3 == 1:
            params["latest"] = "true"
        tally.send(client, "largest_page", "GET", f"/v1/views/{VIEW}/rows", params=params, headers=headers)
    time.sleep(0.05)


class RawAnswer:
    """The status line, headers and start of the body of an HTTP answer read off a socket."""

    def __init__(self, data: bytes) -> None:
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status_code = int(lines[0].split()[1])
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        self.text = body.decode("utf-8", "replace")


def send_raw(host: str, port: int, head: str, body: bytes, timeout: float) -> RawAnswer:
    """One request whose headers lie (a Content-Length the body does not have, or not a
    number), which HTTP clients refuse to send; the answer as far as it came."""
    import socket

    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data) < 512:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data:
        raise ConnectionError("the connection closed without an answer")
    return RawAnswer(data)


def _bad_update(client, tally: Tally, credentials, settings, rng, i: int) -> None:
    import httpx

    token = f"pvm_{credentials['known_id']}_{rng.randbytes(32).hex()}"
    choice = i % 4
    if choice in (0, 1):  # headers that lie: sent over a raw socket
        url = httpx.URL(str(client.base_url))
        length, body, name = (
            (str(65 << 20), b"{" * 1024, "oversized_declared")
            if choice == 0
            else ("12abc", b"{}", "bad_content_length")
        )
        head = (
            f"POST /v1/updates HTTP/1.1\r\nHost: {url.host}:{url.port}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\nConnection: close"
        )
        began = time.monotonic()
        try:
            answer = send_raw(url.host, url.port or 80, head, body, timeout=10)
        except OSError as exc:
            tally.record(name, began, error=exc)
        else:
            tally.record(name, began, answer)
    elif choice == 2:  # 2 MiB of JSON that never closes
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        body = b'{"source": "shop", "updates": [' * 65_536
        tally.send(client, "malformed_2mib", "POST", "/v1/updates", content=body, headers=headers)
    else:  # a well-formed batch for a real source, with the wrong secret
        batch = {"source": "shop", "updates": [{"seq": 1, "changes": []}]}
        tally.send(
            client, "wrong_secret", "POST", "/v1/updates", json=batch, headers={"Authorization": f"Bearer {token}"}
        )
    time.sleep(0.01)


ATTACK_STEPS = {
    "heavy_queries": _heavy_query,
    "bad_tokens": _bad_token,
    "row_pages": _row_page,
    "bad_updates": _bad_update,
}


# -- the run ------------------------------------------------------------------------------------------
class AbuseRun:
    def __init__(self, args: argparse.Namespace, data_dir: Path, store, console) -> None:
        self.args = args
        self.data_dir = data_dir
        self.store = store
        self.console = console
        self.samples: list[dict] = []
        self.probes: list[dict] = []  # GET /v1/views/V over HTTP, as a monitor asks

    async def run(self) -> dict:
        from warehouse.analysts.supervisor import AnalystSettings
        from warehouse.store.compaction import Compactor

        paths = populate_sources(self.data_dir, self.args.rows, random.Random(self.args.seed), prefix="abuse-")
        settings = AnalystSettings(
            work_dir=self.data_dir / "analysts",
            master=self.args.analyst_master,
            memory=self.args.analyst_memory,
            timeout_s=self.args.query_timeout,
        )
        compactor = Compactor(self.store)  # as pvm serve runs it
        async with running_analysts(self.store, settings) as analysts:
            try:
                return await self._run(paths, analysts, compactor)
            finally:
                await asyncio.to_thread(compactor.stop)

    async def _run(self, paths: dict[str, Path], analysts, compactor) -> dict:
        from api.auth import issue
        from pvm.local_deployment import LocalDeployment, side_by_side

        async with LocalDeployment(self.data_dir, self.store) as deployment:
            manager = deployment.manager
            manager.analysts = analysts  # REST queries and row pages go to it, as in pvm serve
            await side_by_side(
                *(
                    deployment.add_sqlite_source(source, paths[source], [table], max_concurrent_queries=2)
                    for source, (table, _) in SCHEMAS.items()
                )
            )
            with self.console.status("initial load of the view"):
                await manager.define_view(VIEW_SQL, parallelism=self.args.parallelism, batch_size=self.args.batch_size)
                await manager.wait_idle(VIEW, timeout=300)
            compactor.start()
            with self.console.status("starting the analysts' query process"):
                if not await asyncio.to_thread(analysts.wait_ready, 300):
                    raise CliError(f"the analysts' query process did not start: {analysts.status()}")
            # one analyst token per attacker thread role: a token's limit of 2 queries at once
            # does not bound an attacker who holds several
            credentials = {
                "analysts": [(await issue(manager, "analyst", name=f"attacker {i}"))[1] for i in range(2)],
                "pager": (await issue(manager, "analyst", name="pager"))[1],
                "known_id": int(deployment.analyst_token.split("_")[1]),
            }
            with self.console.status("a first view status (its row count is the query process's first job)"):
                await asyncio.to_thread(_first_status, deployment)
            figures = await self._phases(deployment, analysts, paths, credentials)
            with self.console.status("waiting until the view has caught up"):
                caught_up = time.monotonic()
                await deployment.wait_shipped(timeout=300)
                await manager.wait_idle(VIEW, timeout=300)
                figures["catch_up_s"] = round(time.monotonic() - caught_up, 2)
            status = manager.status(VIEW)
            figures["view"] = {
                "state": status["state"],
                "error": status["error"],
                "watermark": status["watermark"],
                "units_committed": status["counters"]["units_committed"],
                "parallelism": self.args.parallelism,
                "batch_size": self.args.batch_size,
            }
            figures["analysts"] = {k: v for k, v in analysts.status().items() if k != "pid"}
            await manager.drop_view(VIEW)
        return figures

    async def _phases(self, deployment, analysts, paths: dict[str, Path], credentials: dict) -> dict:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        args = self.args
        context = multiprocessing.get_context("spawn")
        writer_queue = context.Queue()
        writer_seconds = args.warmup + 2 * args.seconds
        writer = context.Process(
            target=write_transactions,
            args=({s: str(p) for s, p in paths.items()}, args.rows, args.rate, writer_seconds, args.seed, writer_queue),
            kwargs={"every_marker": False},
            name="bench-writer",
            daemon=True,
        )
        results = context.Queue()
        attackers: list = []
        writer.start()
        start = time.time()  # the quiet phase starts after the warm-up
        quiet_at, attack_at, end_at = start + args.warmup, start + args.warmup + args.seconds, writer_seconds + start
        attack_settings = {
            "max_requests": args.max_requests,
            "query_timeout_s": args.query_timeout,
            "bad_token_rate": args.bad_token_rate,
            "rows": args.rows,
        }
        for kind in args.attack_kinds:  # waiting, until the attack phase starts
            attacker = context.Process(
                target=attack,
                args=(kind, deployment.url, credentials, attack_at, end_at, attack_settings, results),
                name=f"bench-attacker-{kind}",
                daemon=True,
            )
            attacker.start()
            attackers.append(attacker)
        sampler = Sampler(deployment.manager, analysts)
        probe = asyncio.create_task(self._probe(deployment, end_at))
        columns = (TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn())
        try:
            with Progress(*columns, console=self.console, transient=True) as progress:
                task = progress.add_task("warm-up", total=writer_seconds)
                tick = start
                while (now := time.time()) < end_at:
                    phase = "warm-up" if now < quiet_at else "quiet" if now < attack_at else "attack"
                    sample = sampler.sample(now - quiet_at, phase)
                    if phase != "warm-up":
                        self.samples.append(sample)
                    progress.update(
                        task,
                        completed=now - start,
                        description=f"{phase}: lag {sample['lag_s']:.2f} s, W {sample['watermark']}, "
                        f"manager {sample['manager_rss_mb']:.0f} MB",
                    )
                    tick += 1.0
                    await asyncio.sleep(max(0.0, tick - time.time()))
            attacks = await asyncio.to_thread(self._collect, attackers, results)
            written = await asyncio.to_thread(self._writer_figures, writer, writer_queue)
        finally:
            for process in (*attackers, writer):
                if process.is_alive():
                    process.kill()
            probe.cancel()
            await asyncio.gather(probe, return_exceptions=True)
        return self._figures(written, attacks, (quiet_at, attack_at, end_at))

    def _collect(self, attackers: list, results) -> dict:
        """Each attacker's figures; an attacker that did not report within its requests'
        timeout is counted as such."""
        out: dict[str, dict] = {}
        deadline = time.monotonic() + self.args.query_timeout + 60
        while len(out) < len(attackers) and time.monotonic() < deadline:
            try:
                kind, figures = results.get(timeout=1)
            except queue.Empty:
                continue
            out[kind] = figures
        for attacker in attackers:
            attacker.join(timeout=5)
        for kind in self.args.attack_kinds:
            out.setdefault(
                kind,
                {"sent": 0, "statuses": {}, "status_5xx": 0, "status_5xx_unexpected": 0, "missing": "no report"},
            )
        return out

    def _writer_figures(self, writer, writer_queue) -> dict:
        try:
            while True:
                kind, figures, _ = writer_queue.get(timeout=60)
                if kind == "done":
                    return figures
        except queue.Empty:
            raise CliError(f"the writer process did not finish (exit code {writer.exitcode})") from None
        finally:
            writer.join(timeout=30)

    async def _probe(self, deployment, end_at: float) -> None:
        """``GET /v1/views/V`` once a second with the admin token: how long a monitor waits."""
        import httpx

        async with httpx.AsyncClient(base_url=deployment.url, headers=deployment.headers(), timeout=60) as http:
            while time.time() < end_at:
                asked = time.time()
                status: int | str
                try:
                    answer = await http.get(f"/v1/views/{VIEW}")
                    status = answer.status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                self.probes.append({"at": asked, "seconds": round(time.time() - asked, 4), "status": status})
                await asyncio.sleep(max(0.0, asked + 1.0 - time.time()))

    # -- figures ----------------------------------------------------------------------------------
    def _figures(self, written: dict, attacks: dict, bounds: tuple[float, float, float]) -> dict:
        quiet_at, attack_at, end_at = bounds
        phases = {}
        for phase in PHASES:
            samples = [s for s in self.samples if s["phase"] == phase]
            probes = sorted(
                p["seconds"]
                for p in self.probes
                if (quiet_at <= p["at"] < attack_at) == (phase == "quiet") and quiet_at <= p["at"] < end_at
            )
            phases[phase] = phase_figures(samples, probes)
            phases[phase]["status_probe_failures"] = sum(
                1
                for p in self.probes
                if p["status"] != 200
                and (quiet_at <= p["at"] < attack_at) == (phase == "quiet")
                and quiet_at <= p["at"] < end_at
            )
        quiet, attacked = phases["quiet"], phases["attack"]
        return {
            "machine": {"cores": os.cpu_count(), "load_average_at_end": os.getloadavg()},
            "settings": {
                "rate": self.args.rate,
                "seconds_per_phase": self.args.seconds,
                "warmup_s": self.args.warmup,
                "rows": self.args.rows,
                "query_timeout_s": self.args.query_timeout,
                "analyst_memory": self.args.analyst_memory,
                "analyst_master": self.args.analyst_master,
                "bad_token_rate": self.args.bad_token_rate,
                "max_requests_per_attacker": self.args.max_requests,
                "attacks": self.args.attack_kinds,
            },
            "writer": {k: round(v, 3) for k, v in written.items()},
            "phases": phases,
            "ratios": {
                "lag_p99_attack_over_quiet": _ratio(attacked["lag_p99_s"], quiet["lag_p99_s"]),
                "w_progress_attack_over_quiet": _ratio(attacked["w_per_s"], quiet["w_per_s"]),
                "units_committed_attack_over_quiet": _ratio(attacked["units_per_s"], quiet["units_per_s"]),
                "manager_rss_growth_during_attack_pct": attacked["manager_rss_growth_pct"],
                "manager_jvm_rss_growth_during_attack_pct": attacked["manager_jvm_rss_growth_pct"],
                "analysts_rss_growth_during_attack_pct": attacked["analysts_rss_growth_pct"],
            },
            "attacks": attacks,
            "status_5xx": sum(a.get("status_5xx", 0) for a in attacks.values()),
            "status_5xx_unexpected": sum(a.get("status_5xx_unexpected", 0) for a in attacks.values()),
            "samples": self.samples,
            "probes": [{**p, "at": round(p["at"] - quiet_at, 3)} for p in self.probes],
        }


def _first_status(deployment) -> None:
    """``GET /v1/views/V`` once before the phases: it counts the view's rows in the analysts'
    query process, whose first Spark job takes seconds, which is not what the phases measure."""
    import httpx

    httpx.get(f"{deployment.url}/v1/views/{VIEW}", headers=deployment.headers(), timeout=300).raise_for_status()


class Sampler:
    """One sample a second of the view's progress and the processes' memory and CPU."""

    def __init__(self, manager, analysts) -> None:
        self.manager = manager
        self.analysts = analysts
        self.pid = os.getpid()
        self.last: dict | None = None

    def sample(self, t: float, phase: str) -> dict:
        status = self.manager.status(VIEW)
        jvms = [c for c in children(self.pid) if is_java(c)]  # the store's Spark driver
        analysts_pid = self.analysts.status()["pid"]
        analysts_tree = [analysts_pid, *children(analysts_pid)] if analysts_pid else []
        now = time.monotonic()
        cpu = cpu_seconds(self.pid) or 0.0
        jvm_cpu = sum(cpu_seconds(j) or 0.0 for j in jvms)
        sample = {
            "t": round(t, 3),
            "phase": phase,
            "lag_s": status.get("lag_seconds") or 0.0,
            "lag_updates": status.get("lag_updates"),
            "watermark": status["watermark"],
            "units_committed": status["counters"]["units_committed"],
            "updates_received": status["counters"]["updates_received"],
            "state": status["state"],
            "manager_rss_mb": _mb(rss_bytes(self.pid)),
            "manager_jvm_rss_mb": _mb(sum(rss_bytes(j) or 0 for j in jvms)),
            "analysts_rss_mb": _mb(sum(rss_bytes(p) or 0 for p in analysts_tree)) if analysts_tree else None,
            "analysts_pid": analysts_pid,
            "analysts_restarts": self.analysts.restarts,
            "analysts_ready": self.analysts.ready,
        }
        last = self.last
        if last is None:
            sample.update(manager_cpu=None, manager_jvm_cpu=None, w_per_s=None, units_per_s=None, received_per_s=None)
        else:
            dt = now - last["now"]
            sample.update(
                manager_cpu=round((cpu - last["cpu"]) / dt, 3),  # cores busy
                manager_jvm_cpu=round((jvm_cpu - last["jvm_cpu"]) / dt, 3),
                w_per_s=round((sample["watermark"] - last["watermark"]) / dt, 2),
                units_per_s=round((sample["units_committed"] - last["units_committed"]) / dt, 2),
                received_per_s=round((sample["updates_received"] - last["updates_received"]) / dt, 2),
            )
        self.last = {"now": now, "cpu": cpu, "jvm_cpu": jvm_cpu, **sample}
        return sample


def _mb(n: int | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or a != a or b != b:
        return None
    return round(a / b, 3)


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


def phase_figures(samples: list[dict], probe_seconds: list[float]) -> dict:
    lags = sorted(s["lag_s"] for s in samples)
    out: dict = {
        "samples": len(samples),
        "lag_p50_s": round(quantile(lags, 0.5), 3),
        "lag_p99_s": round(quantile(lags, 0.99), 3),
        "lag_max_s": round(lags[-1], 3) if lags else None,
        "w_per_s": _mean([s["w_per_s"] for s in samples if s["w_per_s"] is not None]),
        "units_per_s": _mean([s["units_per_s"] for s in samples if s["units_per_s"] is not None]),
        "updates_received_per_s": _mean([s["received_per_s"] for s in samples if s["received_per_s"] is not None]),
        "w_start": samples[0]["watermark"] if samples else None,
        "w_end": samples[-1]["watermark"] if samples else None,
        "manager_cpu_mean": _mean([s["manager_cpu"] for s in samples if s["manager_cpu"] is not None]),
        "manager_jvm_cpu_mean": _mean([s["manager_jvm_cpu"] for s in samples if s["manager_jvm_cpu"] is not None]),
        "status_probe_p50_s": round(quantile(probe_seconds, 0.5), 4),
        "status_probe_max_s": round(probe_seconds[-1], 3) if probe_seconds else None,
        "analysts_restarts": (samples[-1]["analysts_restarts"] - samples[0]["analysts_restarts"]) if samples else 0,
        "analysts_seconds_not_ready": sum(1 for s in samples if not s["analysts_ready"]),
    }
    for memory in ("manager_rss_mb", "manager_jvm_rss_mb", "analysts_rss_mb"):
        values = [s[memory] for s in samples if s[memory] is not None]
        name = memory.removesuffix("_mb")
        out[f"{name}_start_mb"] = values[0] if values else None
        out[f"{name}_end_mb"] = values[-1] if values else None
        out[f"{name}_max_mb"] = max(values) if values else None
        out[f"{name}_growth_pct"] = (
            round(100 * (values[-1] - values[0]) / values[0], 1) if values and values[0] else None
        )
    return out


# -- the report ----------------------------------------------------------------------------------------
def report(figures: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    q, a = figures["phases"]["quiet"], figures["phases"]["attack"]
    table = Table(title=f"view lag and memory, quiet vs attack ({figures['settings']['seconds_per_phase']:g} s each)")
    for column in ("", "quiet", "attack"):
        table.add_column(column)

    def row(label: str, fmt) -> None:
        table.add_row(label, fmt(q), fmt(a))

    row("lag p50 / p99 / max (s)", lambda p: f"{p['lag_p50_s']} / {p['lag_p99_s']} / {p['lag_max_s']}")
    row("W progress (units/s)", lambda p: f"{p['w_per_s']}")
    row("updates received (/s; captured batches)", lambda p: f"{p['updates_received_per_s']}")
    row("GET /v1/views/V p50 / max (s)", lambda p: f"{p['status_probe_p50_s']} / {p['status_probe_max_s']}")
    for name, label in (
        ("manager_rss", "manager RSS"),
        ("manager_jvm_rss", "manager JVM RSS"),
        ("analysts_rss", "analysts RSS"),
    ):
        row(
            f"{label} start / end / max (MB)",
            lambda p, n=name: f"{p[f'{n}_start_mb']} / {p[f'{n}_end_mb']} / {p[f'{n}_max_mb']}",
        )
    row("manager CPU / its JVM (cores)", lambda p: f"{p['manager_cpu_mean']} / {p['manager_jvm_cpu_mean']}")
    row(
        "analysts' process restarts",
        lambda p: f"{p['analysts_restarts']} ({p['analysts_seconds_not_ready']} s not ready)",
    )
    console.print(table)
    r = figures["ratios"]
    console.print(
        f"attack/quiet: lag p99 {r['lag_p99_attack_over_quiet']}, W progress {r['w_progress_attack_over_quiet']}; "
        f"RSS growth during the attack: manager {r['manager_rss_growth_during_attack_pct']}%, "
        f"its JVM {r['manager_jvm_rss_growth_during_attack_pct']}%, analysts {r['analysts_rss_growth_during_attack_pct']}%"
    )
    attacks = Table(title="attacks (attack phase)")
    for column in ("attack", "sent", "statuses", "5xx (unexpected)", "no answer", "its CPU (s)"):
        attacks.add_column(column)
    for kind, f in figures["attacks"].items():
        attacks.add_row(
            kind,
            str(f["sent"]),
            ", ".join(f"{code}: {n}" for code, n in f["statuses"].items()),
            f"{f['status_5xx']} ({f['status_5xx_unexpected']})",
            ", ".join(f"{k}: {n}" for k, n in f.get("no_answer", {}).items()) or "0",
            str(f.get("cpu_s")),
        )
    console.print(attacks)
    for kind, f in figures["attacks"].items():
        for error in f.get("server_errors", [])[:3]:
            console.print(f"[red]{kind} {error['kind']}: {error['status']}[/red] {error['body'][:200]}")
    console.print(f"caught up {figures['catch_up_s']} s after the writer stopped; view {figures['view']['state']}")


def plot(figures: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = figures["samples"]
    t = [s["t"] for s in samples]
    boundary = figures["settings"]["seconds_per_phase"]
    fig, (lag, progress, memory) = plt.subplots(3, 1, sharex=True, figsize=(9, 8))
    lag.plot(t, [s["lag_s"] for s in samples], label="lag_seconds")
    lag.set_ylabel("lag (s)")
    progress.plot(t, [s["w_per_s"] for s in samples], label="W progress (units/s)")
    progress.plot(t, [s["received_per_s"] for s in samples], label="updates received/s", alpha=0.6)
    progress.set_ylabel("per second")
    for key, label in (
        ("manager_rss_mb", "manager"),
        ("manager_jvm_rss_mb", "manager's Spark JVM"),
        ("analysts_rss_mb", "analysts' query process"),
    ):
        memory.plot(t, [s[key] for s in samples], label=label)
    memory.set_ylabel("RSS (MB)")
    memory.set_xlabel("seconds since the quiet phase started")
    for axes in (lag, progress, memory):
        axes.axvline(boundary, color="red", linestyle="--", label="attack starts")
        axes.legend(loc="upper left", fontsize="small")
        axes.grid(alpha=0.3)
    fig.suptitle(f"pvm bench abuse: {figures['settings']['rate']:g} transactions/s, quiet then attack")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
