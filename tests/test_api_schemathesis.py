"""Schemathesis against the manager's OpenAPI schema: generated requests, valid and invalid,
to every operation of a live server (over in-process sources, so registering a source never
leaves this process) must never get a 5xx answer. Bounded: a fixed number of examples per
operation, derandomized so CI runs the same requests every time."""

from __future__ import annotations

from collections import Counter

import httpx
import schemathesis
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.api_support import VIEW, LiveManager, exercise


def test_no_operation_answers_5xx(tmp_path):
    with LiveManager(tmp_path) as live:
        for name in ("a", "b"):
            r = httpx.post(
                f"{live.url}/v1/sources",
                json={"name": name, "wrapper_url": f"http://{name}.invalid"},
                headers=live.auth("admin"),
            )
            assert r.status_code == 201, r.text
        live.sources["a"].load("R", [(1, "x")])
        r = httpx.post(f"{live.url}/v1/views", json={"sql": VIEW, "name": "v"}, headers=live.auth("admin"))
        assert r.status_code == 201, r.text

        schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
        operations = sorted((result.ok() for result in schema.get_all_operations()), key=_last_destructive)
        assert len(operations) >= 15
        failures: list[str] = []
        statuses: Counter = Counter()
        for operation in operations:
            answered: Counter = Counter()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                try:
                    exercise(operation, mode, live, answered)
                except Unsatisfiable:
                    pass  # nothing to make invalid (no parameters, no body)
                except Exception as exc:  # collect them all, then report
                    failures.append(f"{operation.method.upper()} {operation.path} ({mode.value}): {exc}")
            # every operation got past authentication (a revoked admin token or the failure
            # throttle would leave nothing tested)
            assert set(answered) - {401, 429}, (operation.method, operation.path, answered)
            statuses.update(answered)
        assert not failures, "\n\n".join(failures)
        print(sorted(statuses.items()))
        assert statuses[200] + statuses[201] > 100 and sum(v for k, v in statuses.items() if 400 <= k < 500) > 100


def _last_destructive(operation) -> tuple:
    """Revoking tokens and dropping views last, so the rest runs with a working admin token."""
    delete = operation.method.upper() == "DELETE"
    return (delete and operation.path.startswith("/v1/tokens"), delete, operation.path)
