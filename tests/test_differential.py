"""Property tests of the snapshot differential algorithms against a first-principles oracle.

For random snapshot pairs (inserts, deletes, updates, and reordering within a displacement)
every exact algorithm's output, applied to the old snapshot, gives the new one, with one
message per changed key; the window algorithm's output does too, and its extra messages
are only delete-insert pairs; with an aging buffer covering the displacement it is exact.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wrappers.differential import (
    Change,
    Compression,
    MemoryBudget,
    SnapshotError,
    apply_changes,
    hash_state,
    partitioned_hash_diff,
    remove_useless_pairs,
    sort_merge_diff,
    sorted_state,
    useless_pairs,
    window_diff,
)
from wrappers.differential.distance import displacement_stats
from wrappers.differential.messages import DELETE, INSERT, UPDATE, ChangeConflict

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- generating snapshot pairs -----------------------------------------------------------------
values = st.one_of(st.text(max_size=4), st.integers(-5, 5), st.none())
rests = st.tuples(values, st.text(max_size=3))


@st.composite
def snapshot_pairs(draw, max_size=40):
    """(f1, f2, displacement): lists of (key, rest) records; f2 is f1 with deletes, updates
    and inserts, reordered by swaps of at most ``displacement`` positions."""
    n = draw(st.integers(0, max_size))
    keys = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n, unique=True))
    f1 = [((k,), draw(rests)) for k in keys]
    f2 = []
    for key, rest in f1:
        action = draw(st.sampled_from(["keep", "keep", "keep", "delete", "update"]))
        if action == "keep":
            f2.append((key, rest))
        elif action == "update":
            new = draw(rests)
            f2.append((key, new))  # may equal the old rest: then it is no change
        if draw(st.integers(0, 6)) == 0:
            k = draw(st.integers(10_001, 20_000))
            if all(k != kk[0] for kk, _ in f2):
                f2.append(((k,), draw(rests)))
    displacement = draw(st.integers(0, 8))
    rng = random.Random(draw(st.integers(0, 2**32)))
    moved = [False] * len(f2)
    for j in range(len(f2)):
        t = j + rng.randint(0, displacement)
        if t < len(f2) and not moved[j] and not moved[t]:
            f2[j], f2[t] = f2[t], f2[j]
            moved[j] = moved[t] = True
    return f1, f2, displacement


def oracle(f1, f2):
    """The exact differential by first principles: {key: (kind, old, new)}."""
    a, b = dict(f1), dict(f2)
    out = {}
    for k, v in a.items():
        if k not in b:
            out[k] = (DELETE, v, None)
        elif b[k] != v:
            out[k] = (UPDATE, v, b[k])
    for k, v in b.items():
        if k not in a:
            out[k] = (INSERT, None, v)
    return out


def check_exact(changes, f1, f2):
    """Applied to f1 the changes give f2, deletes come first, one message per changed key."""
    changes = list(changes)
    assert apply_changes(dict(f1), changes) == dict(f2)
    kinds = [c.kind for c in changes]
    if INSERT in kinds:
        assert DELETE not in kinds[kinds.index(INSERT) :]
    expected = oracle(f1, f2)
    assert sorted(c.key for c in changes) == sorted(expected)
    for c in changes:
        kind, old, new = expected[c.key]
        assert c.kind == kind
        if c.kind != DELETE:
            assert c.new == new
        if c.old is not None:
            assert c.old == old


EXACT = [
    ("sort_merge", lambda f1, f2, **kw: sort_merge_diff(f1, f2, **kw)),
    ("partitioned_hash", lambda f1, f2, **kw: partitioned_hash_diff(f1, f2, **kw)),
    ("sort_merge <K,b>", lambda f1, f2, **kw: sort_merge_diff(f1, f2, compression=Compression(64), **kw)),
    (
        "sort_merge <K,b,p>",
        lambda f1, f2, **kw: sort_merge_diff(f1, f2, compression=Compression(64, pointer=True), **kw),
    ),
    ("partitioned_hash <K,b>", lambda f1, f2, **kw: partitioned_hash_diff(f1, f2, compression=Compression(64), **kw)),
    (
        "partitioned_hash <K,b,p>",
        lambda f1, f2, **kw: partitioned_hash_diff(f1, f2, compression=Compression(64, pointer=True), **kw),
    ),
    (
        "partitioned_hash <K,b> crc32",
        lambda f1, f2, **kw: partitioned_hash_diff(f1, f2, compression=Compression(32), **kw),
    ),
]


@pytest.mark.parametrize("name,algorithm", EXACT, ids=[n for n, _ in EXACT])
@SETTINGS
@given(pair=snapshot_pairs())
def test_exact_algorithms_turn_f1_into_f2(name, algorithm, pair):
    f1, f2, _ = pair
    result = algorithm(f1, f2)
    check_exact(result.changes, f1, f2)
    assert result.stats.old_records == len(f1)
    assert result.stats.new_records == len(f2)


@pytest.mark.parametrize("name,algorithm", EXACT, ids=[n for n, _ in EXACT])
@settings(max_examples=25, deadline=None)
@given(pair=snapshot_pairs(max_size=30))
def test_exact_algorithms_spill_with_a_tiny_budget(name, algorithm, pair):
    """Three records of memory: sorted runs, buckets and change lists go to disk."""
    f1, f2, _ = pair
    tiny = algorithm(f1, f2, budget=MemoryBudget(records=3, bytes=None))
    check_exact(tiny.changes, f1, f2)
    roomy = algorithm(f1, f2, budget=MemoryBudget(records=None, bytes=None))
    assert sorted(tiny.changes.to_list(), key=repr) == sorted(roomy.changes.to_list(), key=repr)


@SETTINGS
@given(chain=st.lists(snapshot_pairs(max_size=25), min_size=1, max_size=3), budget=st.sampled_from([3, 7, None]))
def test_kept_state_carries_over_between_differentials(chain, budget):
    """The state of one differential is the old side of the next one."""
    b = MemoryBudget(records=budget, bytes=None)
    comps = [None, Compression(64), Compression(64, pointer=True)]
    snaps = [chain[0][0]] + [p[1] for p in chain]
    for comp in comps:
        sm_state = sorted_state(snaps[0], compression=comp, budget=b)
        ph_state = hash_state(snaps[0], compression=comp, budget=b)
        for old, new in itertools.pairwise(snaps):
            sm = sort_merge_diff(sm_state, new, compression=comp, budget=b)
            ph = partitioned_hash_diff(ph_state, new, compression=comp, budget=b)
            check_exact(sm.changes, old, new)
            check_exact(ph.changes, old, new)
            sm_state, ph_state = sm.state, ph.state


@pytest.mark.parametrize("spill", [False, True])
@SETTINGS
@given(pair=snapshot_pairs(), inp=st.integers(1, 5), aging=st.integers(1, 12))
def test_window_turns_f1_into_f2_with_only_useless_pairs_extra(pair, inp, aging, spill):
    f1, f2, _ = pair
    budget = MemoryBudget(records=2, bytes=None) if spill else None
    result = window_diff(f1, f2, input_records=inp, aging_records=aging, budget=budget)
    changes = list(result.changes)
    assert apply_changes(dict(f1), changes) == dict(f2)
    kinds = [c.kind for c in changes]
    if INSERT in kinds:
        assert DELETE not in kinds[kinds.index(INSERT) :]
    expected = oracle(f1, f2)
    a, b = dict(f1), dict(f2)
    by_key: dict = {}
    for c in changes:
        by_key.setdefault(c.key, []).append(c)
    for key, cs in by_key.items():
        if len(cs) == 1:
            kind, old, new = expected[key]
            assert (cs[0].kind, cs[0].old, cs[0].new) == (kind, old, new)
        else:
            # an extra message: a delete-insert pair of the record as it was and as it is
            assert [c.kind for c in cs] == [DELETE, INSERT]
            assert cs[0].old == a[key] and cs[1].new == b[key]
            if key not in expected:
                assert a[key] == b[key]  # identical records
    assert set(expected) <= set(by_key)
    # the second pass leaves exactly the exact differential
    check_exact(remove_useless_pairs(changes, budget=budget), f1, f2)


@SETTINGS
@given(pair=snapshot_pairs(), inp=st.integers(1, 5))
def test_window_is_exact_once_the_aging_buffer_covers_the_displacement(pair, inp):
    f1, f2, _ = pair
    disp = displacement_stats([k for k, _ in f1], [k for k, _ in f2])
    cover = disp.maximum + 2 * inp  # positions in the files, so deletes and inserts count
    result = window_diff(f1, f2, input_records=inp, aging_records=max(1, cover))
    check_exact(result.changes, f1, f2)
    assert useless_pairs(result.changes) == []


def test_window_far_displacement_gives_useless_pairs_that_the_second_pass_removes():
    f1 = [((i,), (f"v{i}",)) for i in range(100)]
    f2 = list(reversed(f1))
    small = window_diff(f1, f2, input_records=4, aging_records=8)
    assert len(small.changes) > 0
    assert all(c.kind in (DELETE, INSERT) for c in small.changes)
    assert apply_changes(dict(f1), small.changes) == dict(f2)
    assert len(remove_useless_pairs(small.changes)) == 0
    assert len(window_diff(f1, f2, input_records=4, aging_records=100).changes) == 0
    assert len(window_diff(f1, f2, input_records=4, aging_records=8, second_pass=True).changes) == 0


def test_window_aging_bytes_sets_the_buffer_from_record_size():
    f1 = [((i,), ("x" * 20,)) for i in range(50)]
    r = window_diff(f1, f1[::-1], input_records=5, aging_bytes=10 * 30)  # 9 + 21 nominal bytes
    assert r.stats.details["aging_records"] == 10
    with pytest.raises(ValueError):
        window_diff(f1, f1, aging_records=3, aging_bytes=100)


# -- duplicate keys and schema changes ---------------------------------------------------------
DUP = [((1,), ("a",)), ((2,), ("b",)), ((1,), ("c",))]
OK = [((1,), ("a",)), ((3,), ("c",))]


@pytest.mark.parametrize(
    "run",
    [
        lambda old, new: sort_merge_diff(old, new),
        lambda old, new: sort_merge_diff(old, new, compression=Compression(32)),
        lambda old, new: sort_merge_diff(old, new, compression=Compression(32, pointer=True)),
        lambda old, new: partitioned_hash_diff(old, new),
        lambda old, new: partitioned_hash_diff(old, new, compression=Compression(32)),
        lambda old, new: partitioned_hash_diff(old, new, budget=MemoryBudget(records=1, bytes=None)),
        lambda old, new: partitioned_hash_diff(
            old, new, compression=Compression(32, pointer=True), budget=MemoryBudget(records=1, bytes=None)
        ),
    ],
)
@pytest.mark.parametrize("where", ["old", "new"])
def test_duplicate_keys_raise_snapshot_error(run, where):
    old, new = (DUP, OK) if where == "old" else (OK, DUP)
    with pytest.raises(SnapshotError, match="duplicate key"):
        run(old, new)


def test_window_reports_duplicate_keys_that_meet_in_its_buffers():
    """The window holds only its buffers, so it finds a repeated key while the first copy
    is still waiting there (the outer joins find every repeat)."""
    with pytest.raises(SnapshotError, match="duplicate key.*old"):
        window_diff(DUP, OK)
    with pytest.raises(SnapshotError, match="duplicate key.*new"):
        window_diff(OK, [((5,), ("x",)), ((2,), ("b",)), ((5,), ("y",))])


def test_duplicate_keys_in_kept_state_builders():
    with pytest.raises(SnapshotError, match="duplicate key"):
        sorted_state(DUP)
    with pytest.raises(SnapshotError, match="duplicate key"):
        hash_state(DUP)
    state = hash_state(DUP, budget=MemoryBudget(records=1, bytes=None))  # partitioned: found when loaded
    with pytest.raises(SnapshotError, match="duplicate key"):
        partitioned_hash_diff(state, OK, budget=MemoryBudget(records=1, bytes=None))


ALL = [
    lambda old, new: sort_merge_diff(old, new),
    lambda old, new: partitioned_hash_diff(old, new),
    lambda old, new: window_diff(old, new),
]


@pytest.mark.parametrize("run", ALL)
def test_schema_change_raises_snapshot_error(run):
    wider = [((1,), ("a", 1)), ((3,), ("c", 2))]
    with pytest.raises(SnapshotError, match="schema changed"):
        run(OK, wider)
    longer_key = [((1, 1), ("a",))]
    with pytest.raises(SnapshotError, match="key changed"):
        run(OK, longer_key)
    ragged = [((1,), ("a",)), ((2,), ("b", "extra"))]
    with pytest.raises(SnapshotError, match="record 1"):
        run(OK, ragged)


def test_kept_state_with_a_different_schema_or_checksum_is_refused():
    wider = [((1,), ("a", 1))]
    with pytest.raises(SnapshotError, match="schema changed"):
        sort_merge_diff(sorted_state(OK), wider)
    with pytest.raises(SnapshotError, match="schema changed"):
        partitioned_hash_diff(hash_state(OK), wider)
    kb = sorted_state(OK, compression=Compression(32))
    with pytest.raises(SnapshotError, match="checksums"):
        sort_merge_diff(kb, OK)
    with pytest.raises(SnapshotError, match="checksums"):
        sort_merge_diff(kb, OK, compression=Compression(64))
    with pytest.raises(SnapshotError, match="checksums"):
        partitioned_hash_diff(hash_state(OK, compression=Compression(16)), OK, compression=Compression(32))
    # an uncompressed state can be compared in a compressed format
    r = partitioned_hash_diff(hash_state(OK), [((1,), ("A",))], compression=Compression(32))
    assert sorted((c.kind, c.key) for c in r.changes) == [(DELETE, (3,)), (UPDATE, (1,))]


def test_strict_apply_refuses_an_insert_delete_pair():
    """The reason for sending deletes first: an insert before the delete of the same key."""
    with pytest.raises(ChangeConflict):
        apply_changes({(1,): ("a",)}, [Change.insert((1,), ("b",)), Change.delete((1,))])
    assert apply_changes({(1,): ("a",)}, [Change.delete((1,)), Change.insert((1,), ("b",))]) == {(1,): ("b",)}


def test_partitioned_hash_rebuckets_kept_state_when_the_budget_shrinks():
    f1 = [((i,), (str(i),)) for i in range(200)]
    f2 = [((i,), (str(i) if i % 7 else "x",)) for i in range(10, 230)]
    state = hash_state(f1)  # one bucket, fits the default budget
    assert state.partitions == 1
    r = partitioned_hash_diff(state, f2, budget=MemoryBudget(records=30, bytes=None))
    check_exact(r.changes, f1, f2)
    assert not r.stats.in_memory and r.state.partitions >= 200 // 30
    r2 = partitioned_hash_diff(r.state, f1, budget=MemoryBudget(records=30, bytes=None))
    check_exact(r2.changes, f2, f1)


def test_tiny_budget_really_spills_and_gives_the_same_changes():
    f1 = [((i,), (f"v{i}", i % 3)) for i in range(300)]
    f2 = [((i,), (f"v{i}", i % 3 if i % 11 else -1)) for i in range(20, 330)][::-1]
    tiny = MemoryBudget(records=16, bytes=None)
    for comp in (None, Compression(32), Compression(32, pointer=True)):
        sm = sort_merge_diff(f1, f2, compression=comp, budget=tiny)
        assert sm.stats.runs > 0 and not sm.stats.in_memory
        check_exact(sm.changes, f1, f2)
        ph = partitioned_hash_diff(f1, f2, compression=comp, budget=tiny)
        assert ph.stats.partitions > 1 and not ph.stats.in_memory
        check_exact(ph.changes, f1, f2)
        if comp is not None and comp.pointer:
            assert ph.stats.fetched == sm.stats.fetched == len(oracle(f1, f2)) - 20  # inserts and updates
    w = window_diff(f1, f2, input_records=8, aging_records=4, budget=tiny)
    assert w.stats.io.files_created > 0  # the change lists went to disk
    assert apply_changes(dict(f1), w.changes) == dict(f2)
    cleaned = remove_useless_pairs(w.changes, budget=tiny)
    check_exact(cleaned, f1, f2)
