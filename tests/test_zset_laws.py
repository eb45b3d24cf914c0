"""The Z-set laws the protocol's argument rests on (docs/protocol.md), for any Z-sets.

* Z-sets under ``+`` are an abelian group (empty Z-set, negation): effects committed in any
  order sum to the same view (signed commits, Theorem 9), and a subtracted delta undoes an
  added one exactly.
* Join is linear in each argument: ``(a + b) ⋈ c = a ⋈ c + b ⋈ c`` and
  ``p ⋈ (r + s) = p ⋈ r + p ⋈ s``. Compensation rests on the second: an answer that saw
  ``R + ΔR``, less ``partial ⋈ ΔR``, is the answer for ``R``, and one join with ``Σ ΔR_k``
  subtracts many updates at once. The chain rule that splits a unit changing several
  relations into terms follows from both.
* Projection is linear: a unit's effect is the projection of its terms' sum.

Weights and values come from small domains (with NULLs, which never join) so that rows
collide, cancel and match often.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contract import expr
from contract.expr import And, Cmp, Col
from contract.schemas import KEY_RELATION, Subquery
from contract.zset import ZSet, total
from tests.sim import evaluate
from warehouse.join import distinct_keys, extend, local_join
from warehouse.plan import SweepStep

VALUES = st.one_of(st.none(), st.integers(0, 3))
WEIGHTS = st.integers(-3, 3).filter(bool)


def zsets(width: int = 2) -> st.SearchStrategy[ZSet]:
    return st.dictionaries(st.tuples(*[VALUES] * width), WEIGHTS, max_size=6).map(ZSet)


# partial (p.a, p.b) ⋈ relation r (r.b, r.c) ON p.b = r.b AND p.a <= r.c: an equality the
# join hashes on and a condition it can only filter with
PARTIAL = (Col("p", "a"), Col("p", "b"))
RELATION = (Col("r", "b"), Col("r", "c"))
ON = And((Cmp("=", Col("p", "b"), Col("r", "b")), Cmp("<=", Col("p", "a"), Col("r", "c"))))
STEP = SweepStep(relation=1, layout=PARTIAL, keys=PARTIAL, on=ON)


def join(partial: ZSet, relation: ZSet) -> ZSet:
    return local_join(partial, STEP, relation, RELATION)


def answer(partial: ZSet, relation: ZSet) -> ZSet:
    """``partial ⋈ relation`` the way maintenance gets it: the partial result's distinct keys
    shipped in a subquery, the source's answer (the simulated source's evaluation), joined
    back with ``extend``. An empty partial result sends no subquery (``ViewChange``)."""
    if not partial:
        return ZSet()
    keys = distinct_keys(partial, STEP)
    shipped = {col: Col(KEY_RELATION, f"k{i}") for i, col in enumerate(STEP.keys)}
    query = Subquery(
        relation="r",
        alias="r",
        keys=[list(k) for k in keys],
        on=expr.to_wire(expr.substitute(ON, shipped)),
        where=None,
        select=["b", "c"],
        priority=0.0,
    )
    rows = evaluate(query, ("b", "c"), relation)
    return extend(partial, STEP, keys, ((r[0], tuple(r[1:-1]), r[-1]) for r in rows))


# -- the group ---------------------------------------------------------------------------------
@given(zsets(), zsets())
def test_addition_commutes(a, b):
    assert a + b == b + a


@given(zsets(), zsets(), zsets())
def test_addition_is_associative(a, b, c):
    assert (a + b) + c == a + (b + c)


@given(zsets())
def test_the_empty_zset_is_the_identity(a):
    assert a + ZSet() == a == ZSet() + a


@given(zsets(), zsets())
def test_negation_is_the_inverse_and_subtraction_adds_it(a, b):
    assert a + (-a) == ZSet() and (a + (-a)).is_empty()
    assert a - b == a + (-b)
    assert (a + b) - b == a


@given(zsets(), zsets(), st.integers(-3, 3))
def test_in_place_addition_is_addition(a, b, scale):
    inplace = a.copy()
    inplace.add_all(b, scale)
    assert inplace == a + b.scaled(scale)


@given(zsets(), zsets())
def test_no_row_is_kept_with_weight_zero(a, b):
    assert all(w != 0 for _, w in (a + b).items())
    assert all(w != 0 for _, w in (a - b).items())


@given(st.lists(zsets(), max_size=6), st.randoms(use_true_random=False))
def test_effects_sum_to_the_same_view_in_any_commit_order(effects, rng):
    shuffled = list(effects)
    rng.shuffle(shuffled)
    assert total(shuffled) == total(effects)


# -- join ----------------------------------------------------------------------------------------
@given(zsets(), zsets(), zsets())
def test_join_distributes_over_addition_of_partial_results(a, b, r):
    assert join(a + b, r) == join(a, r) + join(b, r)


@given(zsets(), zsets(), zsets())
def test_join_distributes_over_addition_of_relations(p, r, s):
    assert join(p, r + s) == join(p, r) + join(p, s)


@given(zsets(), zsets())
def test_join_with_a_negated_or_empty_side(p, r):
    assert join(p, -r) == -join(p, r) == join(-p, r)
    assert join(p, ZSet()) == ZSet() == join(ZSet(), r)


@given(zsets(), zsets())
def test_a_sources_answer_is_the_local_join(p, r):
    """What ``extend`` makes of a source's answer equals ``local_join``: the answer and the
    compensation subtracted from it are computed alike."""
    assert answer(p, r) == join(p, r)


@given(zsets(), zsets(), st.lists(zsets(), max_size=4))
@settings(deadline=None)
def test_compensation_leaves_the_answer_for_the_state_before(p, r, concurrent):
    """An answer that reflects concurrent updates ``ΔR_k``, less one join of the partial
    result with their sum, is the answer over the relation without them."""
    seen = r + total(concurrent)
    assert answer(p, seen) - join(p, total(concurrent)) == answer(p, r)
    assert join(p, total(concurrent)) == total(join(p, d) for d in concurrent)


@given(zsets(), zsets(), zsets(), zsets())
def test_the_chain_rule_splits_a_change_of_both_sides(p, dp, r, dr):
    """``(p + Δp) ⋈ (r + Δr) − p ⋈ r = Δp ⋈ r + (p + Δp) ⋈ Δr``: the terms of a unit that
    changes two relations, the left one including the unit's own delta, the right one not."""
    assert join(p + dp, r + dr) - join(p, r) == join(dp, r) + join(p + dp, dr)


@given(zsets())
def test_the_unit_zset_is_the_identity_of_join(r):
    """The initial load starts from ``{(): 1}``: joined with a relation, it is the relation."""
    first = SweepStep(relation=0, layout=(), keys=(), on=None)
    assert local_join(ZSet.unit(), first, r, RELATION) == r


# -- projection ----------------------------------------------------------------------------------
@given(zsets(3), zsets(3))
def test_projection_is_linear(a, b):
    def project(row):
        return (row[0], row[2])  # rows that differ in the dropped column collide

    assert (a + b).map_rows(project) == a.map_rows(project) + b.map_rows(project)
    assert (-a).map_rows(project) == -a.map_rows(project)
