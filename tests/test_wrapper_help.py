"""``pvm wrapper --help`` states what the wrapper really does, as docs/capture.md does: the
limits of timestamp capture, and how source transactions are grouped into updates (a read
merges every transaction it sees into one update and never splits one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pvm.cli import main as pvm_main

DOCS = Path(__file__).resolve().parent.parent / "docs" / "capture.md"


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        pvm_main(argv)
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines; compare words


@pytest.mark.parametrize("argv", [["wrapper", "--help"], ["wrapper", "run", "--help"]])
def test_help_states_the_ts_limits_and_the_transaction_grouping(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    text = help_text(argv, capsys)
    # Timestamp capture's limits.
    assert "TS cannot see deletes (deleted rows stay in the views)" in text
    assert "reports a key change as an insert of the new key" in text
    assert "With --delete-flag-column (Carnes TDI)" in text and "deletes are seen" in text
    # Transaction grouping: never one update per transaction, which the wrapper does not do.
    assert "one source transaction per update" not in text
    assert "everything committed since its previous read and ships it as ONE update" in text
    assert "whole source transactions only (a transaction is never split)" in text
    assert "all those one read sees are merged, so an update may hold several" in text
    assert "cut between transactions only" in text and "however large" in text
    assert "shipped in parts of one seq, at most --part-changes changes and --part-bytes bytes each" in text
    assert "the wrapper's memory does not grow with it" in text
    assert "While the manager is down, capture goes on" in text


def test_the_docs_say_the_same() -> None:
    docs = " ".join(DOCS.read_text().split())
    assert "**TS cannot see deletes.**" in docs
    assert "one read shows whole committed transactions only, and all of them become one update" in docs
    assert "a source transaction is never split" in docs
    assert "cut between transactions only" in docs and "a read is one update however large" in docs
    assert "the wrapper stores and ships it in parts" in docs and "## Updates of any size" in docs
    assert "one source transaction per update" not in docs
