"""``pvm bench load``'s options refused before anything starts (no Spark, no servers)."""

from __future__ import annotations

from pvm.cli import main


def test_bad_sizes_are_refused(capsys) -> None:
    assert main(["bench", "load", "--rows", "ten"]) == 2
    assert main(["bench", "load", "--rows", "0"]) == 2
    assert main(["bench", "load", "--warm-up", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--rows takes comma-separated row counts, not 'ten'" in err
    assert "--rows: every size must be at least 1" in err
    assert "--warm-up takes a row count, 0 for none" in err
