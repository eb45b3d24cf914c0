"""A Spark Connect server on a process's own Spark session.

The analysts' query process (``api/analysts_worker.py``) starts one on loopback, with a
token only the manager's Connect gateway (``api/connect_gateway.py``) knows; analysts never
reach it directly. The server is the one shipped in PySpark's own jars
(``spark-connect_2.13-*.jar``), so nothing is downloaded. Every Connect client gets its own
Spark session of the same application: it sees the tables and (non-temporary) views of the
shared session catalog, which is why ``PublishedViews`` shows each view as a catalog view
rather than a temporary one. Spark Connect has no authorization of its own: whoever reaches
the port with the token can run any Spark code, which is why the gateway checks every
request first.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from pyspark.sql import SparkSession

_SERVICE = "org.apache.spark.sql.connect.service.SparkConnectService$"


class ConnectError(RuntimeError):
    """The Spark Connect server could not be started."""


@dataclass(frozen=True)
class ConnectServer:
    host: str
    port: int
    token: str | None = None

    @property
    def url(self) -> str:
        """The ``sc://`` address clients pass to ``SparkSession.builder.remote`` (without the
        token, which the operator hands out separately)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"sc://{host}:{self.port}"


def _service(spark: SparkSession):
    """The JVM's ``SparkConnectService`` singleton (a Scala object: static field MODULE$)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    try:
        cls = jvm.java.lang.Class.forName(_SERVICE, True, loader)
    except Exception as exc:  # py4j wraps ClassNotFoundException
        raise ConnectError(f"this Spark installation has no Spark Connect server: {exc}") from exc
    return cls.getField("MODULE$").get(None)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only the loopback interface: ``localhost`` or a loopback address
    literal. Anything else (``0.0.0.0``, ``::``, a host name, an external address) may be
    reachable from other machines."""
    if host.strip().lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def start_connect_server(
    spark: SparkSession, host: str = "127.0.0.1", port: int = 15002, token: str | None = None
) -> ConnectServer:
    """Start (once per process) a Spark Connect server on ``spark``'s application and return
    its address; ``port`` 0 picks a free port. A second call returns the running server.
    A server on a non-loopback ``host`` needs a ``token`` (ConnectError otherwise)."""
    if not token and not is_loopback(host):
        raise ConnectError(f"Spark Connect on {host!r} (not loopback) without a token would run anyone's code")
    service = _service(spark)
    if not service.started():
        conf = spark.sparkContext._jsc.sc().conf()  # the live SparkConf the service reads
        conf.set("spark.connect.grpc.binding.address", host)
        conf.set("spark.connect.grpc.binding.port", str(port))
        conf.set("spark.connect.grpc.port.maxRetries", "0")  # the port asked for, or an error
        # no plans kept across requests: a session's plan cache would hand a DataFrame used
        # again the plan it was first built with, whose eagerly analyzed parts still read the
        # consistent views' cut of that time (docs/protocol.md, 'Consistent reads across views')
        conf.set("spark.connect.session.planCache.maxSize", "0")
        if token:
            conf.set("spark.connect.authenticate.token", token)
        try:
            service.start(spark.sparkContext._jsc.sc())
        except Exception as exc:
            raise ConnectError(f"cannot start Spark Connect on {host}:{port}: {_first_line(exc)}") from exc
    conf = spark.sparkContext._jsc.sc().conf()
    bound_host = conf.get("spark.connect.grpc.binding.address", host)
    running_token = conf.get("spark.connect.authenticate.token", "") or None
    return ConnectServer(bound_host, int(service.localPort()), running_token)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
