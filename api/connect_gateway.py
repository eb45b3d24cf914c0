"""Spark Connect for analysts, with the service's tokens and role model.

Analysts connect a Spark session to the gateway (``pvm serve --connect-port``)::

    spark = SparkSession.builder.remote("sc://localhost:15002/;token=pvm_7_…").getOrCreate()
    spark.sql("SELECT region, count(*) FROM order_details GROUP BY region").show()

The gateway is a gRPC server of Spark Connect's service in the manager process (its own
thread and event loop, so a busy analyst never holds up the manager's loop). Every call:

1. carries an analyst (or admin) token of the service (``Authorization: Bearer``; pyspark
   sends the URL's ``token``), checked like the REST API's, so tokens are per analyst and
   revoking one ends its access; a Connect session stays with the token that opened it;
2. is checked against what analysts may do (``api/connect_check.py``): read views, nothing
   else; a refusal is ``PERMISSION_DENIED`` naming what is not allowed;
3. counts against the analysts' limits (``RESOURCE_EXHAUSTED`` over them) and runs for at
   most the query timeout: then its operation is interrupted, and if it still runs after
   the grace period the analysts' query process is restarted;
4. is forwarded to the Spark Connect server of the analysts' query process, on loopback,
   which requires a secret only the gateway has.

Uploading artifacts (jars, Python files) is refused. gRPC clients send a token only over TLS
or to ``localhost``: on any other interface the gateway needs a certificate
(``--connect-tls-cert``/``--connect-tls-key``) and refuses to start without one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from pyspark.sql.connect.proto import base_pb2

from api.auth import Principal, TooManyAttempts
from api.connect_check import Refused, check_analyze, check_config, check_execute
from warehouse.analysts.supervisor import AnalystProcess, AnalystsBusy

log = logging.getLogger(__name__)

SERVICE = "spark.connect.SparkConnectService"
MAX_SESSIONS = 100_000


class GatewayError(RuntimeError):
    """The gateway cannot start (the message says why)."""


@dataclass(frozen=True)
class GatewaySettings:
    host: str
    port: int
    timeout_s: float = 120.0
    grace_s: float = 10.0
    tls_cert: Path | None = None
    tls_key: Path | None = None


class ConnectGateway:
    def __init__(
        self,
        settings: GatewaySettings,
        verify: Callable[[str, str], Awaitable[Principal | None]],
        analysts: AnalystProcess,
        views: Callable[[], Collection[str]],
    ) -> None:
        from warehouse.store.spark_connect import is_loopback

        if not is_loopback(settings.host) and (settings.tls_cert is None or settings.tls_key is None):
            raise GatewayError(
                f"Spark Connect on {settings.host!r} (not loopback) needs TLS: clients send their token only over "
                "TLS or to localhost; give --connect-tls-cert and --connect-tls-key, or --connect-host 127.0.0.1"
            )
        self.settings = settings
        self._verify = verify
        self._analysts = analysts
        self._views = views
        self._sessions: OrderedDict[tuple[str, str], int | None] = OrderedDict()
        self._operations: OrderedDict[str, float] = OrderedDict()  # operation id -> when it started
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: grpc.aio.Server | None = None
        self._upstream: tuple[int, grpc.aio.Channel] | None = None
        self._closing: set[asyncio.Future[None]] = set()
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> str:
        """Start serving in a thread of its own; returns the ``sc://`` address."""
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve(started))
                loop.run_forever()
            except BaseException as exc:  # bind failures end up here
                failure.append(exc)
                started.set()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="connect-gateway", daemon=True)
        self._thread.start()
        started.wait(30)
        if failure or self.port is None:
            raise GatewayError(
                f"cannot serve Spark Connect on {self.settings.host}:{self.settings.port}: {failure[0] if failure else 'timed out'}"
            )
        host = "localhost" if self.settings.host in ("127.0.0.1", "::1", "localhost") else self.settings.host
        return f"sc://{host}:{self.port}"

    async def _serve(self, started: threading.Event) -> None:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 128 << 20)])
        server.add_generic_rpc_handlers((self._handlers(),))
        address = f"{self.settings.host}:{self.settings.port}"
        if self.settings.tls_cert is not None and self.settings.tls_key is not None:
            credentials = grpc.ssl_server_credentials(
                [(self.settings.tls_key.read_bytes(), self.settings.tls_cert.read_bytes())]
            )
            self.port = server.add_secure_port(address, credentials)
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        self._server = server
        started.set()

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._server is None:
            return

        async def shutdown() -> None:
            assert self._server is not None
            await self._server.stop(grace=1)
            if self._upstream is not None:
                await self._upstream[1].close()
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- the service ------------------------------------------------------------------------
    def _handlers(self) -> grpc.GenericRpcHandler:
        def unary(handler: Callable[..., Any], request: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(handler, request_deserializer=request.FromString)

        def stream(handler: Callable[..., Any], request: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_stream_rpc_method_handler(handler, request_deserializer=request.FromString)

        passed = {
            name: unary(self._passthrough(name), getattr(base_pb2, f"{name}Request"))
            for name in (
                "Interrupt",
                "ReleaseExecute",
                "ReleaseSession",
                "FetchErrorDetails",
                "GetStatus",
                "CloneSession",
            )
        }
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "ExecutePlan": stream(self._execute, base_pb2.ExecutePlanRequest),
                "ReattachExecute": stream(self._reattach, base_pb2.ReattachExecuteRequest),
                "AnalyzePlan": unary(self._analyze, base_pb2.AnalyzePlanRequest),
                "Config": unary(self._config, base_pb2.ConfigRequest),
                "AddArtifacts": grpc.stream_unary_rpc_method_handler(self._no_artifacts),
                "ArtifactStatus": unary(self._no_artifacts_status, base_pb2.ArtifactStatusesRequest),
                **passed,
            },
        )

    async def _admitted(self, request: Any, context: grpc.aio.ServicerContext) -> Principal:
        """The caller's principal, once its token, role and session check out."""
        metadata = {k.lower(): v for k, v in context.invocation_metadata() or ()}
        header = str(metadata.get("authorization", ""))
        if not header.lower().startswith("bearer "):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "Spark Connect needs an analyst token: sc://HOST:PORT/;token=<token> (pvm token create --role analyst)",
            )
        try:
            principal = await self._verify(header[7:].strip(), _client_address(context.peer()))
        except TooManyAttempts as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{exc} (retry after {exc.retry_after:.0f} s)")
        if principal is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the token is unknown, malformed or revoked")
        assert principal is not None
        if principal.role not in ("analyst", "admin"):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{principal.describe()} may not use Spark Connect: that needs the analyst role",
            )
        session = (request.user_context.user_id, request.session_id)
        owner = self._sessions.get(session, principal.token_id)
        if owner != principal.token_id:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED, "this Spark Connect session belongs to another token"
            )
        self._sessions[session] = principal.token_id
        self._sessions.move_to_end(session)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return principal

    async def _refused(self, context: grpc.aio.ServicerContext, check: Callable[[], None]) -> None:
        try:  # parsing SQL in a plan takes a while: not on the gateway's event loop
            await self._analysts.check(check)  # the analysts' check threads, not the shared pool
        except Refused as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))

    def _channel(self) -> grpc.aio.Channel:
        port = self._analysts.connect_port
        if not self._analysts.ready or port is None:
            raise AnalystsDown()
        if self._upstream is None or self._upstream[0] != port:
            if self._upstream is not None:
                closing = asyncio.ensure_future(self._upstream[1].close())
                self._closing.add(closing)  # held until done: the loop keeps only weak references
                closing.add_done_callback(self._closing.discard)
            self._upstream = (
                port,
                grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", -1)]),
            )
        return self._upstream[1]

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self._analysts.connect_token}"),)

    async def _execute(
        self, request: base_pb2.ExecutePlanRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        principal = await self._admitted(request, context)
        await self._refused(context, lambda: check_execute(request, self._views()))
        if not request.operation_id:
            request.operation_id = str(uuid.uuid4())  # so that it can be interrupted
        self._started(request.operation_id)
        async for chunk in self._forward_stream("ExecutePlan", request, principal, context):
            yield chunk

    async def _reattach(
        self, request: base_pb2.ReattachExecuteRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        principal = await self._admitted(request, context)
        async for chunk in self._forward_stream("ReattachExecute", request, principal, context):
            yield chunk

    async def _forward_stream(
        self, method: str, request: Any, principal: Principal, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        operation = request.operation_id
        started = self._operations.get(operation, time.monotonic())
        remaining = self.settings.timeout_s - (time.monotonic() - started)
        if remaining <= 0:
            await self._interrupt(request)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, self._timed_out())
        try:
            with self._analysts.admit(principal.describe()):
                call = self._channel().unary_stream(
                    f"/{SERVICE}/{method}", request_serializer=_serialize, response_deserializer=None
                )(request, metadata=self._metadata(), timeout=remaining)
                try:
                    async for chunk in call:
                        yield chunk
                except grpc.aio.AioRpcError as error:
                    if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        await self._interrupt(request)
                        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, self._timed_out())
                    await context.abort(error.code(), error.details() or "")
        except AnalystsBusy as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except AnalystsDown:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the analysts' query process is starting; try again shortly"
            )

    def _started(self, operation: str) -> None:
        """Note when an operation started: its time runs across reattached streams. Entries
        older than twice the timeout are forgotten (their operations were interrupted)."""
        now = time.monotonic()
        self._operations[operation] = now
        while self._operations and next(iter(self._operations.values())) < now - 2 * self.settings.timeout_s:
            self._operations.popitem(last=False)

    def _timed_out(self) -> str:
        return f"the operation ran longer than {self.settings.timeout_s:.0f} s and was interrupted"

    async def _interrupt(self, request: Any) -> None:
        """Interrupt an operation past its time; restart the analysts' process if it still
        runs ``grace_s`` later (work stuck on the driver does not stop when interrupted)."""
        operation = request.operation_id
        self._operations.pop(operation, None)
        interrupt = base_pb2.InterruptRequest(
            session_id=request.session_id,
            user_context=request.user_context,
            interrupt_type=base_pb2.InterruptRequest.INTERRUPT_TYPE_OPERATION_ID,
            operation_id=operation,
        )
        try:
            await self._unary("Interrupt", interrupt, timeout=5.0)
        except (grpc.aio.AioRpcError, AnalystsDown):
            return
        asyncio.get_running_loop().create_task(self._ensure_stopped(request))

    async def _ensure_stopped(self, request: Any) -> None:
        await asyncio.sleep(self.settings.grace_s)
        status = base_pb2.GetStatusRequest(session_id=request.session_id, user_context=request.user_context)
        status.operation_status.operation_ids.append(request.operation_id)
        try:
            answer = base_pb2.GetStatusResponse.FromString(await self._unary("GetStatus", status, timeout=5.0))
        except (grpc.aio.AioRpcError, AnalystsDown):
            return
        states = base_pb2.GetStatusResponse.OperationStatus
        if any(
            s.state in (states.OPERATION_STATE_RUNNING, states.OPERATION_STATE_TERMINATING)
            for s in answer.operation_statuses
        ):
            self._analysts.restart(
                f"Spark Connect operation {request.operation_id} still ran {self.settings.grace_s:.0f} s after it was interrupted"
            )

    async def _unary(self, method: str, request: Any, timeout: float | None = None) -> bytes:
        call = self._channel().unary_unary(
            f"/{SERVICE}/{method}", request_serializer=_serialize, response_deserializer=None
        )
        return await call(
            request, metadata=self._metadata(), timeout=timeout if timeout is not None else self.settings.timeout_s
        )

    async def _forward_unary(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> bytes:
        try:
            return await self._unary(method, request)
        except AnalystsDown:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the analysts' query process is starting; try again shortly"
            )
        except grpc.aio.AioRpcError as error:
            await context.abort(error.code(), error.details() or "")
        raise AssertionError("unreachable")

    async def _analyze(self, request: base_pb2.AnalyzePlanRequest, context: grpc.aio.ServicerContext) -> bytes:
        principal = await self._admitted(request, context)
        await self._refused(context, lambda: check_analyze(request, self._views()))
        try:
            with self._analysts.admit(principal.describe()):
                return await self._forward_unary("AnalyzePlan", request, context)
        except AnalystsBusy as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        raise AssertionError("unreachable")

    async def _config(self, request: base_pb2.ConfigRequest, context: grpc.aio.ServicerContext) -> bytes:
        await self._admitted(request, context)
        await self._refused(context, lambda: check_config(request))
        return await self._forward_unary("Config", request, context)

    def _passthrough(self, method: str) -> Callable[..., Awaitable[bytes]]:
        async def handler(request: Any, context: grpc.aio.ServicerContext) -> bytes:
            await self._admitted(request, context)
            return await self._forward_unary(method, request, context)

        return handler

    async def _no_artifacts(self, requests: Any, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            "uploading artifacts (jars, Python files) is not allowed: analysts read views",
        )
        raise AssertionError("unreachable")

    async def _no_artifacts_status(self, request: Any, context: grpc.aio.ServicerContext) -> bytes:
        await self._admitted(request, context)
        return base_pb2.ArtifactStatusesResponse(session_id=request.session_id).SerializeToString()


class AnalystsDown(Exception):
    """The analysts' query process is not ready."""


def _client_address(peer: str) -> str:
    """The address part of a gRPC peer (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``), for the
    failed-attempt limits that the REST API applies per address too.

    >>> _client_address("ipv4:10.0.0.7:51234"), _client_address("ipv6:[::1]:40000")
    ('10.0.0.7', '::1')
    """
    kind, _, rest = peer.partition(":")
    host = rest.rsplit(":", 1)[0] if kind in ("ipv4", "ipv6") else rest
    return host.strip("[]") or peer


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()
