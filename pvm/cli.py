"""The ``pvm`` command line.

Each subcommand lives in its own module exposing ``configure(parser)`` and ``run(args) -> int``.
Only the module of the chosen subcommand is imported; heavy imports (Spark, FastAPI) belong
inside ``run``. Errors the user can fix are raised as ``CliError`` and printed as one line.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("pvm.serve", "run the manager (HTTP API, maintenance, view store)"),
    "wrapper": ("pvm.wrapper", "run, install or uninstall a source wrapper"),
    "demo": ("pvm.demo", "the end-to-end demo on embedded SQLite sources, verified at the end"),
    "verify": ("pvm.verify", "recompute a view from its sources and compare it with the stored view"),
    "token": ("pvm.client.token", "create, list or revoke bearer tokens (admin, analyst, wrapper of a source)"),
    "source": ("pvm.client.source", "register, list or show sources"),
    "view": ("pvm.client.view", "define, list, show, read, pause, resume or drop views"),
    "query": ("pvm.client.query", "a read-only SQL query over the views"),
}
BENCHMARKS: dict[str, tuple[str, str]] = {
    "pvm-vs-sweep": ("pvm.bench.pvm_vs_sweep", "total maintenance time T(p) against SWEEP (paper Fig. 21/23)"),
    "diff": ("pvm.bench.diff", "snapshot differential algorithms against reading both snapshots"),
    "capture": (
        "pvm.bench.capture",
        "trigger and log capture's cost to source writes, and view freshness with each over three databases",
    ),
    "commit": ("pvm.bench.commit", "Spark store: grouped commits vs one append per effect, and freshness under load"),
    "workload": (
        "pvm.bench.workload",
        "a CH-benCHmark-style load over PostgreSQL + MariaDB + SQLite at a rate ramp: freshness, lag, CPU",
    ),
    "load": (
        "pvm.bench.load",
        "a view's initial load in Spark over PostgreSQL + MariaDB + SQLite, against Spark over JDBC",
    ),
    "aggregate": (
        "pvm.bench.aggregate",
        "an aggregate view over 1,000,000 join rows: one source update maintained incrementally vs recomputed",
    ),
    "wire": ("pvm.bench.wire", "JSON against Arrow IPC for the rows of subquery answers and update batches"),
    "abuse": (
        "pvm.bench.abuse",
        "view lag, W progress and memory of a deployment quiet, then under attack through its API",
    ),
}


class CliError(Exception):
    """A problem with the user's input: printed as ``pvm: error: …``, exit status 2."""


class Parser(argparse.ArgumentParser):
    """The parser of ``pvm`` and of every subcommand: one with a ``--config`` option
    (``pvm.config_file.add_to``) also takes its options from that TOML file."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:
        words = list(sys.argv[1:] if args is None else args)
        if not any(action.dest == "config" for action in self._actions):
            return super().parse_known_args(words, namespace)
        from pvm import config_file

        return config_file.parse_known_args(self, super().parse_known_args, words, namespace)


def _add(sub, name: str, module: str, help_text: str, chosen: bool) -> None:
    parser = sub.add_parser(name, help=help_text, description=help_text)
    if chosen:
        importlib.import_module(module).configure(parser)
    parser.set_defaults(_module=module)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    words = [a for a in argv if not a.startswith("-")]
    parser = Parser(prog="pvm", description="Parallel view maintenance for data warehouses.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        _add(sub, name, module, help_text, words[:1] == [name])
    bench = sub.add_parser("bench", help="benchmarks (ratios measured side by side in one run)")
    bench_sub = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, (module, help_text) in BENCHMARKS.items():
        _add(bench_sub, name, module, help_text, words[:2] == ["bench", name])
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(argv).parse_args(argv)  # CliError for a bad --config file
        return int(importlib.import_module(args._module).run(args) or 0)
    except CliError as exc:
        print(f"pvm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
