"""``pvm bench abuse`` end to end at toy sizes: both phases are sampled, every attack is sent,
the view keeps being maintained while they run, and no answer is a 5xx other than the
documented 503 of the analysts' query process while it restarts (a string of 2^31 characters
ends its JVM on purpose). The real numbers come from a manual run, see docs/benchmarks.md.

The queries keep the bench's default time limit (10 s), longer than the 3 s phases: run with
a limit of 3 s, W did not move during one CI run's attack phase (why is not known yet), and
the check that the view is maintained under attack failed."""

from __future__ import annotations

import json

import pytest

from pvm.bench.abuse import ATTACKS, PHASES
from pvm.cli import main

pytestmark = pytest.mark.spark


def test_bench_abuse_samples_both_phases_and_every_attack(spark, tmp_path) -> None:
    out = tmp_path / "abuse.json"
    code = main([
        "bench", "abuse", "--seconds", "3", "--rate", "20", "--warmup", "2", "--rows", "50",
        "--data-dir", str(tmp_path / "data"), "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    figures = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert figures["settings"]["query_timeout_s"] == 10

    assert list(figures["phases"]) == list(PHASES)
    for phase in PHASES:
        assert figures["phases"][phase]["samples"] >= 2, phase
        assert {s["phase"] for s in figures["samples"]} == set(PHASES)
    attacked = figures["phases"]["attack"]
    assert attacked["w_end"] > attacked["w_start"]  # W moved on while the attacks ran
    assert figures["view"]["state"] == "active"

    assert set(figures["attacks"]) == set(ATTACKS)
    for kind, attack in figures["attacks"].items():
        assert (
            attack["sent"] > 0
            and sum(attack["statuses"].values()) + sum(attack["no_answer"].values()) == (attack["sent"])
        ), kind
        assert attack["status_5xx_unexpected"] == 0, attack["server_errors"]
    assert figures["status_5xx_unexpected"] == 0
    # bad tokens are refused, and throttled once they come more than 10 a second: on a busy
    # machine the attack may not reach that rate in 3 s (tests/test_api_auth_cost.py holds
    # the throttle itself to it)
    bad_tokens = figures["attacks"]["bad_tokens"]
    assert set(bad_tokens["statuses"]) <= {"401", "429"}
    if bad_tokens["sent"] > 3 * 20:
        assert "429" in bad_tokens["statuses"], bad_tokens
