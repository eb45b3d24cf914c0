"""Schemathesis against a wrapper's OpenAPI schema: generated requests, valid and invalid, to
every operation of wrapper processes over a real SQLite source (trigger capture, and
application capture for ``POST /v1/changes``) must never get a 5xx answer. Bounded and
derandomized like the manager's run (tests/test_api_schemathesis.py)."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest
import schemathesis
from hypothesis import given
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from pvm.wrapper_process import WrapperProcess, start_wrapper
from tests.api_support import schemathesis_settings
from tests.fake_manager import FakeManager

EXAMPLES = 40
MANAGER_TOKEN = "schemathesis-manager-token"
APPLICATION_TOKEN = "schemathesis-application-token"


def _source(tmp_path: Path) -> Path:
    path = tmp_path / "src.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE r (id INTEGER PRIMARY KEY, b INTEGER, v TEXT, x REAL)")
        db.execute("CREATE TABLE s (k INTEGER PRIMARY KEY, note TEXT)")
        db.executemany("INSERT INTO r VALUES (?, ?, ?, ?)", [(i, i % 3, f"v{i}", i / 2) for i in range(20)])
    return path


def _start(path: Path, manager: FakeManager, name: str, *capture_args: str) -> WrapperProcess:
    return start_wrapper(
        name, f"sqlite:///{path}", ["r", "s"], manager.url, manager_token=MANAGER_TOKEN,
        state_dir=path.parent / f"state-{name}", log_path=path.parent / f"{name}.log", capture_args=capture_args,
    )  # fmt: skip


@pytest.mark.parametrize("capture", ["trigger", "application"])
def test_no_wrapper_operation_answers_5xx(tmp_path: Path, capture: str) -> None:
    path = _source(tmp_path)
    extra = ("--capture", "application", "--application-token", APPLICATION_TOKEN) if capture == "application" else ()
    with FakeManager() as manager, _start(path, manager, "src", *extra) as wrapper:
        schema = schemathesis.openapi.from_url(f"{wrapper.url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) == (6 if capture == "application" else 5)
        failures: list[str] = []
        statuses: Counter = Counter()
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                try:
                    _exercise(operation, mode, wrapper.url, statuses)
                except Unsatisfiable:
                    pass  # nothing to make invalid (no parameters, no body)
                except Exception as exc:  # collect them all, then report
                    failures.append(f"{operation.method.upper()} {operation.path} ({mode.value}): {exc}")
        assert not failures, "\n\n".join(failures)
        print(sorted(statuses.items()))
        assert statuses[200] > 20 and sum(v for k, v in statuses.items() if 400 <= k < 500) > 50


def _exercise(operation, mode, url: str, statuses: Counter) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @schemathesis_settings(EXAMPLES)
    def run(case) -> None:
        token = APPLICATION_TOKEN if case.path == "/v1/changes" else MANAGER_TOKEN
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}  # tokens are tested on their own
        response = case.call(base_url=url, timeout=30)
        statuses[response.status_code] += 1
        if response.status_code >= 500:
            pytest.fail(f"{response.status_code} for {case.method} {case.formatted_path}: {response.text[:500]}")
        case.validate_response(response, checks=[not_a_server_error])

    run()
