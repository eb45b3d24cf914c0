"""A Spark Connect server on the manager's own Spark session.

Analysts connect their own (thin) Spark session to it and query the views with Spark SQL::

    from pyspark.sql import SparkSession
    spark = SparkSession.builder.remote("sc://127.0.0.1:15002").getOrCreate()
    spark.sql("SELECT region, count(*) FROM order_details GROUP BY region").show()

The server is the one shipped in PySpark's own jars (``spark-connect_2.13-*.jar``), started
inside the manager's JVM, so nothing is downloaded. Every Connect client gets its own Spark
session of the same application: it sees the tables and (non-temporary) views of the shared
session catalog, which is why the store publishes each view as a catalog view rather than a
temporary one. Spark Connect has no authorization of its own: whoever reaches the port can run
any Spark code, so the server listens on the loopback interface unless told otherwise, and a
token (``spark.connect.authenticate.token``) can be required from clients, who then connect with
``sc://HOST:PORT/;token=…`` (gRPC sends a token only over TLS or to ``localhost``). A server on
any other interface than loopback is refused without a token.
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


def exposure_problem(host: str, token: str | None) -> str | None:
    """Why a Spark Connect server on ``host`` must not start with ``token``; None if it may."""
    if token or is_loopback(host):
        return None
    return (
        f"Spark Connect would listen on {host!r}, which is not the loopback interface, without a "
        "token: it has no authorization of its own, so anyone who reaches the port could run any "
        "code in the manager's Spark application"
    )


def start_connect_server(
    spark: SparkSession, host: str = "127.0.0.1", port: int = 15002, token: str | None = None
) -> ConnectServer:
    """Start (once per process) a Spark Connect server on ``spark``'s application and return
    its address; ``port`` 0 picks a free port. A second call returns the running server.
    A server on a non-loopback ``host`` needs a ``token`` (ConnectError otherwise)."""
    problem = exposure_problem(host, token)
    if problem is not None:
        raise ConnectError(problem)
    service = _service(spark)
    if not service.started():
        conf = spark.sparkContext._jsc.sc().conf()  # the live SparkConf the service reads
        conf.set("spark.connect.grpc.binding.address", host)
        conf.set("spark.connect.grpc.binding.port", str(port))
        conf.set("spark.connect.grpc.port.maxRetries", "0")  # the port asked for, or an error
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


def stop_connect_server(spark: SparkSession) -> None:
    """Stop the server if it runs (clients' sessions end with it)."""
    service = _service(spark)
    if service.started() and not service.stopped():
        # Scala default arguments are methods named stop$default$N; py4j reaches them by name.
        service.stop(getattr(service, "stop$default$1")(), getattr(service, "stop$default$2")())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
