"""The behaviour every ViewStore shares, checked on the reference store and the Spark store."""

from __future__ import annotations

import pytest

from contract.zset import ZSet
from warehouse.store.base import Effect, StoreError, ViewStore
from warehouse.store.memory import MemoryStore

E1 = Effect(1, ZSet({(1, "a"): 1, (2, "b"): 2}))
E2 = Effect(2, ZSet({(1, "a"): -1, (3, "c"): 1}))
E3 = Effect(3, ZSet({(2, "b"): -2, (4, None): 1}))


@pytest.fixture(params=["memory", pytest.param("spark", marks=pytest.mark.spark)])
def store(request: pytest.FixtureRequest) -> ViewStore:
    if request.param == "memory":
        return MemoryStore()
    return request.getfixturevalue("spark_store")


def test_out_of_order_commits_sum_to_every_as_of(store: ViewStore, view: str) -> None:
    store.create(view, ["k", "name"])
    store.commit(view, [E3])
    store.commit(view, [E1, E2])
    assert store.read(view, as_of=0) == ZSet()
    assert store.read(view, as_of=1) == E1.delta
    assert store.read(view, as_of=2) == E1.delta + E2.delta
    assert store.read(view) == ZSet({(3, "c"): 1, (4, None): 1})
    assert store.committed_orders(view) == {1, 2, 3}


def test_recommit_is_a_no_op(store: ViewStore, view: str) -> None:
    store.create(view, ["k", "name"])
    store.commit(view, [E1, E2])
    store.commit(view, [E2, Effect(1, ZSet({(9, "z"): 5})), E3])
    store.commit(view, [E3, Effect(3, ZSet({(8, "y"): 1}))])
    assert store.read(view) == E1.delta + E2.delta + E3.delta
    assert store.committed_orders(view) == {1, 2, 3}


def test_first_effect_of_an_order_in_a_group_wins(store: ViewStore, view: str) -> None:
    store.create(view, ["k", "name"])
    store.commit(view, [E1, Effect(1, ZSet({(9, "z"): 1}))])
    assert store.read(view) == E1.delta


def test_negative_weights_are_kept(store: ViewStore, view: str) -> None:
    store.create(view, ["k", "name"])
    store.commit(view, [E2])
    assert store.read(view) == E2.delta
    assert store.read(view).has_negative()


def test_empty_effect_counts_as_committed(store: ViewStore, view: str) -> None:
    store.create(view, ["k", "name"])
    store.commit(view, [Effect(7, ZSet())])
    assert store.committed_orders(view) == {7}
    assert store.read(view) == ZSet()


def test_create_is_idempotent_for_the_same_columns(store: ViewStore, view: str) -> None:
    store.create(view, ["k", "name"])
    store.commit(view, [E1])
    store.create(view, ["k", "name"])
    assert store.read(view) == E1.delta
    with pytest.raises(StoreError):
        store.create(view, ["k", "other"])


def test_unknown_view_is_an_error(store: ViewStore) -> None:
    for call in (
        lambda: store.read("nowhere"),
        lambda: store.commit("nowhere", [E1]),
        lambda: store.publish("nowhere", 1),
        lambda: store.committed_orders("nowhere"),
    ):
        with pytest.raises(StoreError):
            call()


def test_drop_forgets_the_view(store: ViewStore, view: str) -> None:
    store.create(view, ["k", "name"])
    store.commit(view, [E1])
    store.publish(view, 1)
    store.drop(view)
    with pytest.raises(StoreError):
        store.read(view)
    store.drop(view)  # dropping twice is harmless
    store.create(view, ["k", "name"])
    assert store.read(view) == ZSet()
    assert store.committed_orders(view) == set()
