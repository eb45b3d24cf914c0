"""Dump files: CSV and Parquet readers, pointers, bad input, kept state files, checksums."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import wrappers
from wrappers.differential import (
    Compression,
    CsvSnapshot,
    MemoryBudget,
    ParquetSnapshot,
    Schema,
    SnapshotError,
    apply_changes,
    checksum,
    expected_clean_runs,
    from_rows,
    hash_state,
    miss_probability,
    open_snapshot,
    partitioned_hash_diff,
    sort_merge_diff,
    sorted_state,
    window_diff,
    write_csv,
    write_parquet,
)
from wrappers.differential.compression import canonical, make_batch_compressor, make_compressor
from wrappers.differential.spill import IOStats, RecordFile, SpillError

SCHEMA = Schema(("id", "name", "balance"), ("id",))
F1 = [(("1",), ("ann", "10")), (("2",), ("bob", "20")), (("3",), ("cy", "30"))]
F2 = [(("3",), ("cy", "31")), (("1",), ("ann", "10")), (("4",), ("dee", "40"))]


def _csv(tmp_path, name, records, schema=SCHEMA):
    p = tmp_path / name
    write_csv(p, schema, records)
    return p


def _parquet(tmp_path, name, records, schema=SCHEMA):
    p = tmp_path / name
    write_parquet(p, schema, records)
    return p


ALGORITHMS = [
    lambda a, b: window_diff(a, b),
    lambda a, b: sort_merge_diff(a, b),
    lambda a, b: sort_merge_diff(a, b, compression=Compression(32, pointer=True)),
    lambda a, b: partitioned_hash_diff(a, b),
    lambda a, b: partitioned_hash_diff(
        a, b, compression=Compression(32, pointer=True), budget=MemoryBudget(records=1, bytes=None)
    ),
]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("run", ALGORITHMS)
def test_algorithms_over_dump_files(tmp_path, fmt, run):
    write = _csv if fmt == "csv" else _parquet
    a = open_snapshot(write(tmp_path, f"a.{fmt}", F1), key="id")
    b = open_snapshot(write(tmp_path, f"b.{fmt}", F2), key="id")
    result = run(a, b)
    assert apply_changes(dict(F1), result.changes) == dict(F2)
    assert result.stats.io.bytes_read >= os.path.getsize(tmp_path / f"b.{fmt}")


def test_csv_quotes_embedded_newlines_converters_and_pointers(tmp_path):
    records = [(("1",), ('a "quoted", value', "x\ny")), (("2",), ("plain", "")), (("3",), ("é ü", "z"))]
    p = _csv(tmp_path, "q.csv", records)
    snap = CsvSnapshot(p, key="id")
    assert list(snap) == records
    with_ptr = list(snap.scan_with_pointers())
    assert [(k, r) for k, r, _ in with_ptr] == records
    fetched = dict(snap.fetch([p_ for *_, p_ in with_ptr][::-1]))
    assert [fetched[p_] for *_, p_ in with_ptr] == records
    typed = CsvSnapshot(p, key=["id"], types={"id": int})
    assert [k for k, _ in typed] == [(1,), (2,), (3,)]
    assert typed.schema.types == ("int", "str", "str")


def test_csv_key_not_first_column_and_blank_last_line(tmp_path):
    p = tmp_path / "k.csv"
    p.write_text("name,id\nann,1\nbob,2\n\n")
    snap = CsvSnapshot(p, key="id")
    assert list(snap) == [(("1",), ("ann",)), (("2",), ("bob",))]
    assert [(k, r) for k, r, _ in snap.scan_with_pointers()] == list(snap)


@given(
    rows=st.lists(
        st.tuples(st.text(min_size=1, max_size=5), st.text(max_size=6)),
        max_size=15,
        unique_by=lambda r: r[0],
    )
)
@example(rows=[("\r", '"'), ("a", "x\ry"), ("b", "\r\n")])  # a bare CR must be quoted
@settings(max_examples=40, deadline=None)
def test_csv_round_trip(tmp_path_factory, rows):
    records = [((k,), (v,)) for k, v in rows]
    p = tmp_path_factory.mktemp("rt") / "r.csv"
    write_csv(p, Schema(("k", "v"), ("k",)), records)
    snap = CsvSnapshot(p, key="k")
    assert list(snap) == records
    assert [(k, r) for k, r, _ in snap.scan_with_pointers()] == records
    ptrs = [p_ for *_, p_ in snap.scan_with_pointers()]
    assert [r for _, r in snap.fetch(ptrs)] == records


@pytest.mark.parametrize(
    "content,message",
    [
        (b"", "empty dump"),
        (b"id,name,balance", "header line has no line terminator"),
        (b"id,name,balance\n1,ann,10\n2,bo", "truncated dump"),
        (b"id,name,balance\n1,ann,10\n2,bob\n", "2 field"),
        (b'id,name,balance\n1,"ann,10\n', "unterminated quoted field"),
        (b"id,name,balance\n1,\xff\xfe,10\n", "not valid utf-8"),
    ],
)
def test_bad_csv_dumps_raise_snapshot_error(tmp_path, content, message):
    p = tmp_path / "bad.csv"
    p.write_bytes(content)
    good = _csv(tmp_path, "good.csv", F1)
    for run in ALGORITHMS:
        with pytest.raises(SnapshotError, match=message):
            run(open_snapshot(good, key="id"), open_snapshot(p, key="id"))


def test_missing_dump_and_unknown_format(tmp_path):
    with pytest.raises(SnapshotError, match="cannot read"):
        CsvSnapshot(tmp_path / "nope.csv", key="id")
    with pytest.raises(SnapshotError, match="unknown dump format"):
        open_snapshot(tmp_path / "x.json", key="id")
    with pytest.raises(SnapshotError, match="key column"):
        CsvSnapshot(_csv(tmp_path, "a.csv", F1), key="nope")


@pytest.mark.parametrize("cut", [0.5, 0.98])
def test_truncated_parquet_raises_snapshot_error(tmp_path, cut):
    good = _parquet(tmp_path, "good.parquet", F1 * 1)
    data = good.read_bytes()
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(SnapshotError, match="unreadable or truncated Parquet"):
        window_diff(ParquetSnapshot(good, key="id"), ParquetSnapshot(bad, key="id"))
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 this is not a parquet file")
    with pytest.raises(SnapshotError, match="unreadable or truncated Parquet"):
        open_snapshot(garbage, key="id")


def test_schema_or_key_change_between_dumps(tmp_path):
    a = open_snapshot(_csv(tmp_path, "a.csv", F1), key="id")
    wider = Schema(("id", "name", "balance", "email"), ("id",))
    b = open_snapshot(_csv(tmp_path, "b.csv", [(k, (*r, "e")) for k, r in F2], wider), key="id")
    with pytest.raises(SnapshotError, match="schema changed"):
        window_diff(a, b)
    rekeyed = open_snapshot(_csv(tmp_path, "c.csv", F2), key="name")
    with pytest.raises(SnapshotError, match="key changed"):
        partitioned_hash_diff(a, rekeyed)
    p1 = open_snapshot(_parquet(tmp_path, "a.parquet", [((1,), ("ann", 10))]), key="id")
    p2 = open_snapshot(_parquet(tmp_path, "b.parquet", [((1,), ("ann", "ten"))]), key="id")
    with pytest.raises(SnapshotError, match="column types differ"):
        sort_merge_diff(p1, p2)


def test_truncated_kept_state_raises_snapshot_error(tmp_path):
    state = sorted_state(F1, compression=Compression(32), spill_dir=tmp_path)
    path = state.file.path
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:-3])
    with pytest.raises(SnapshotError, match="truncated"):
        sort_merge_diff(state, F2, compression=Compression(32))
    hs = hash_state(F1, spill_dir=tmp_path)
    with open(hs.parts[0].path, "wb") as f:
        f.write(b"junk")
    with pytest.raises(SpillError):
        partitioned_hash_diff(hs, F2)


def test_record_file_reopen_and_io_counting(tmp_path):
    stats = IOStats()
    f = RecordFile(tmp_path, stats=stats, chunk_records=2, keep=True)
    f.extend([(1, "a"), (2, "b"), (3, {"not": "marshal-able"})])
    f.seal()
    assert stats.bytes_written == f.nbytes > 0
    again = RecordFile.open(f.path)
    assert list(again.read(stats)) == [(1, "a"), (2, "b"), (3, {"not": "marshal-able"})]
    assert len(again) == 3 and stats.bytes_read == f.nbytes


def test_from_rows_and_schema_errors():
    snap = from_rows([(10, "x", 1)], columns=("a", "id", "b"), key="id")
    assert list(snap) == [(("x",), (10, 1))]
    with pytest.raises(SnapshotError, match="duplicate column"):
        Schema(("a", "a"), ("a",))
    with pytest.raises(SnapshotError, match="row 0"):
        from_rows([(1,)], columns=("a", "b"), key="a")


# -- compression ------------------------------------------------------------------------------
def test_miss_probability_numbers_from_the_paper():
    assert miss_probability(32) == pytest.approx(2.3e-10, rel=0.02)
    # 256 MB of 150-byte records compared daily: about 2,400 days before a missed update
    assert expected_clean_runs(32, 1_789_570) == pytest.approx(2400, rel=0.01)
    assert expected_clean_runs(64, 1_789_570) > 1e12


@given(
    rests=st.lists(
        st.tuples(st.one_of(st.text(max_size=4), st.integers(), st.none()), st.text(max_size=3)), max_size=30
    )
)
@settings(max_examples=60, deadline=None)
def test_batch_compressor_matches_single(rests):
    for bits, h in [(32, "crc32"), (12, "crc32"), (64, "blake2b"), (20, "blake2b")]:
        one, many = make_compressor(bits, h), make_batch_compressor(bits, h)
        assert many(rests) == [one(r) for r in rests]


def test_canonical_encoding_is_injective_on_tricky_values():
    tricky = [("a\x1fb",), ("a", "b"), ("(1,)",), (1,), ("",), ("", ""), ("1",), (1.0,), (True,), (None,)]
    encodings = [canonical(r) for r in tricky]
    assert len(set(encodings)) == len(tricky)


def test_checksums_are_the_same_in_another_process():
    code = "from wrappers.differential import checksum; print(checksum(('ann', 10, None), 32), checksum(('ann',), 64))"
    root = os.path.dirname(os.path.dirname(os.path.abspath(wrappers.__file__)))
    env = dict(os.environ, PYTHONHASHSEED="123", PYTHONPATH=root)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.split()
    assert [int(x) for x in out] == [checksum(("ann", 10, None), 32), checksum(("ann",), 64)]


def test_compression_settings():
    assert Compression(32).hash == "crc32" and Compression(33).hash == "blake2b"
    with pytest.raises(ValueError):
        Compression(40, hash="crc32")
    with pytest.raises(ValueError):
        Compression(0)
    assert Compression(32, pointer=True).without_pointer() == Compression(32)
