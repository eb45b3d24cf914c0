"""What the Spark store exposes to other machines and other users: the driver's and block
manager's ports listen on loopback only (as the service does by default), and the store's
directories and files are the service user's alone (``file_access.STORE_FILES``)."""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from contract.zset import ZSet
from warehouse.store.base import Effect
from warehouse.store.spark import SparkStore

pytestmark = pytest.mark.spark

LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp*


def jvm_pid(spark: SparkSession) -> int:
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


def listening_addresses(pid: int) -> dict[int, ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Port -> address of every TCP socket process ``pid`` listens on (from /proc: the
    process's socket inodes matched against the kernel's socket tables)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = {}
    for table in ("tcp", "tcp6"):
        with open(f"/proc/net/{table}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == LISTEN and fields[9] in inodes:
                    address, port = fields[1].split(":")
                    found[int(port, 16)] = _kernel_address(address)
    return found


def _kernel_address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net's address: 32-bit words in host byte order (little-endian here)."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    return address.ipv4_mapped or address if isinstance(address, ipaddress.IPv6Address) else address


def test_the_driver_and_block_manager_listen_on_loopback_only(spark: SparkSession) -> None:
    listening = listening_addresses(jvm_pid(spark))
    driver_port = int(spark.sparkContext.getConf().get("spark.driver.port"))
    block_managers = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().keys().mkString(",").split(",")
    block_manager_port = int(block_managers[0].rsplit(":", 1)[1])
    assert {driver_port, block_manager_port} <= set(listening), (driver_port, block_manager_port, listening)
    assert all(a.is_loopback for a in listening.values()), listening


def modes(root: Path) -> dict[str, set[str]]:
    """The permission bits of every directory and file under ``root``, root included."""
    seen: dict[str, set[str]] = {"dirs": {oct(stat.S_IMODE(root.stat().st_mode))}, "files": set()}
    for path in root.rglob("*"):
        seen["dirs" if path.is_dir() else "files"].add(oct(stat.S_IMODE(path.lstat().st_mode)))
    return seen


def test_the_stores_files_are_the_service_users_alone(spark: SparkSession, data_dir: Path, view: str) -> None:
    """With the test process's umask (022, not the service's 077): Spark's own writes follow
    the Hadoop umask of ``STORE_FILES``, the store's directories are made with its modes."""
    os.umask(umask := os.umask(0o022))
    assert umask & 0o077 != 0o077, "the test needs a process umask that lets others read"
    store = SparkStore(spark, data_dir)
    try:
        store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
        store.commit(view, [Effect(1, ZSet({(1, "a"): 1, (2, "b"): 1}))])
        store.publish(view, 1)
        store.commit(view, [Effect(2, ZSet({(3, "c"): 1}))])
        store.publish(view, 2)
        assert store.compact(view)
        store.commit(view, [Effect(3, ZSet({(4, "d"): 1}))])  # into the z-log version compaction made
        files = modes(data_dir)
        assert files["files"] and len(list(data_dir.rglob("*.parquet"))) >= 2
        assert files == {"dirs": {"0o700"}, "files": {"0o600"}}
    finally:
        store.drop(view)
