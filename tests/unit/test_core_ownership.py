"""broker/core/ownership.py, pure: holdings and liveness in, a decision out.

One test per rule of DESIGN.md section 3, the whole-request atomicity, the input checks,
the fence check and its syntax, and Hypothesis properties: every decision obeys the
rules, and without a reset no generation is ever granted twice to different sessions
(so an old owner's fence can never become valid again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.ownership import (
    NAME_CHARS_MAX,
    Decision,
    Event,
    Grant,
    Holding,
    Refusal,
    check_claims,
    check_fence,
    check_owner_fences,
    decide_claims,
    parse_fence,
    refusal_error,
)
from broker.errors import BrokerError, ErrorCode
from broker.types import Fence

ME = "proc-me"
OTHER = "conn-other"


def held(generation: int, holder: str | None = OTHER, live: bool = True) -> Holding:
    return Holding(generation, holder, live and holder is not None)


def decide(claims: Sequence[tuple[str, int]], current: Mapping[str, Holding]) -> Decision:
    return decide_claims(ME, claims, current)


def only_grant(decision: Decision) -> Grant:
    assert decision.refusals == ()
    assert len(decision.grants) == 1
    return decision.grants[0]


# the rules, one test each ------------------------------------------------------------


def test_generation_zero_is_always_granted_resets_to_one_and_severs_the_holder() -> None:
    decision = decide([("orders/0", 0)], {"orders/0": held(9, OTHER, live=True)})
    assert only_grant(decision) == Grant("orders/0", 1, 9, Event.RESET, OTHER)


def test_generation_zero_by_the_current_holder_resets_without_severing_anyone() -> None:
    decision = decide([("orders/0", 0)], {"orders/0": held(7, ME)})
    assert only_grant(decision) == Grant("orders/0", 1, 7, Event.RESET, None)


def test_a_live_holder_with_a_higher_generation_refuses_the_claim() -> None:
    decision = decide([("orders/0", 4)], {"orders/0": held(5, OTHER, live=True)})
    assert decision.grants == ()
    assert decision.refusals == (Refusal("orders/0", 4, 5, OTHER),)


def test_the_refusal_error_names_the_resource_and_the_current_generation() -> None:
    error = refusal_error("workers", [Refusal("orders/0", 4, 5, OTHER)])
    assert error.code is ErrorCode.OWNED_BY_HIGHER_GENERATION
    assert error.details["generation"] == 5
    assert error.details["resource"] == "orders/0"
    assert "orders/0" in error.message and "5" in error.message


def test_a_dead_holder_with_a_higher_generation_does_not_refuse() -> None:
    decision = decide([("orders/0", 2)], {"orders/0": held(5, OTHER, live=False)})
    assert only_grant(decision) == Grant("orders/0", 6, 5, Event.CLAIMED, OTHER)


def test_the_current_holder_claiming_again_at_or_below_its_generation_changes_nothing() -> None:
    for requested in (1, 4, 5):
        decision = decide([("orders/0", requested)], {"orders/0": held(5, ME)})
        assert only_grant(decision) == Grant("orders/0", 5, 5, Event.UNCHANGED, None)


def test_the_current_holder_claiming_higher_moves_to_that_generation() -> None:
    decision = decide([("orders/0", 8)], {"orders/0": held(5, ME)})
    assert only_grant(decision) == Grant("orders/0", 8, 5, Event.CLAIMED, None)


def test_a_claim_at_the_holders_generation_severs_it_and_takes_the_next_one() -> None:
    decision = decide([("orders/0", 5)], {"orders/0": held(5, OTHER, live=True)})
    assert only_grant(decision) == Grant("orders/0", 6, 5, Event.CLAIMED, OTHER)


def test_a_claim_above_the_holders_generation_severs_it_and_takes_the_claimed_one() -> None:
    decision = decide([("orders/0", 9)], {"orders/0": held(5, OTHER, live=True)})
    assert only_grant(decision) == Grant("orders/0", 9, 5, Event.CLAIMED, OTHER)


def test_a_released_resource_is_claimed_at_max_of_current_plus_one_and_requested() -> None:
    released = {"orders/0": held(5, None)}
    assert only_grant(decide([("orders/0", 1)], released)).generation == 6
    assert only_grant(decide([("orders/0", 6)], released)).generation == 6
    assert only_grant(decide([("orders/0", 7)], released)).generation == 7


def test_a_never_owned_resource_claimed_with_generation_one_gets_one() -> None:
    decision = decide([("orders/0", 1)], {})
    assert only_grant(decision) == Grant("orders/0", 1, 0, Event.CLAIMED, None)


def test_a_never_owned_resource_claimed_higher_gets_the_claimed_generation() -> None:
    assert only_grant(decide([("orders/0", 3)], {})).generation == 3


# whole-request atomicity ---------------------------------------------------------------


def test_one_refused_resource_means_nothing_is_granted() -> None:
    current = {"orders/0": held(1, OTHER, live=False), "orders/1": held(9, OTHER, live=True)}
    decision = decide([("orders/0", 3), ("orders/1", 3), ("orders/2", 3)], current)
    assert decision.grants == ()
    assert decision.refusals == (Refusal("orders/1", 3, 9, OTHER),)


def test_every_refused_resource_is_reported() -> None:
    current = {"a": held(4, OTHER), "b": held(2, OTHER), "c": held(7, "conn-third")}
    decision = decide([("a", 3), ("b", 3), ("c", 3)], current)
    assert decision.grants == ()
    assert decision.refusals == (Refusal("a", 3, 4, OTHER), Refusal("c", 3, 7, "conn-third"))
    assert refusal_error("workers", decision.refusals).details["refused"] == ["a", "c"]


def test_a_granted_request_grants_every_resource_in_claim_order() -> None:
    current = {"b": held(4, OTHER, live=False), "c": held(2, ME)}
    decision = decide([("c", 1), ("a", 2), ("b", 0)], current)
    assert decision.refusals == ()
    assert [(g.resource, g.generation, g.event) for g in decision.grants] == [
        ("c", 2, Event.UNCHANGED),
        ("a", 2, Event.CLAIMED),
        ("b", 1, Event.RESET),
    ]


# input checks ---------------------------------------------------------------------------


def test_a_resource_named_twice_in_one_claim_is_rejected() -> None:
    with pytest.raises(BrokerError) as caught:
        check_claims("workers", [("orders/0", 1), ("orders/1", 1), ("orders/0", 2)])
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert caught.value.details["resource"] == "orders/0"


def test_a_negative_generation_is_rejected() -> None:
    with pytest.raises(BrokerError) as caught:
        check_claims("workers", [("orders/0", -1)])
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_a_claim_of_nothing_is_rejected() -> None:
    with pytest.raises(BrokerError) as caught:
        check_claims("workers", [])
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("group", "resource"),
    [
        ("", "orders/0"),
        ("workers", ""),
        ("w" * (NAME_CHARS_MAX + 1), "orders/0"),
        ("workers", "r" * (NAME_CHARS_MAX + 1)),
        ("workers", "orders/0\n"),
        ("work\x00ers", "orders/0"),
    ],
)
def test_empty_oversized_or_unprintable_names_are_rejected(group: str, resource: str) -> None:
    with pytest.raises(BrokerError) as caught:
        check_claims(group, [(resource, 1)])
    assert caught.value.code is ErrorCode.INVALID_NAME


def test_names_of_the_longest_allowed_length_are_accepted() -> None:
    check_claims("w" * NAME_CHARS_MAX, [("r" * NAME_CHARS_MAX, 0)])


# fences -----------------------------------------------------------------------------------


def test_a_fence_of_the_current_generation_with_a_live_holder_passes() -> None:
    check_fence(Fence("samza", "journal/0", 5), held(5, OTHER, live=True))


@pytest.mark.parametrize(
    ("fence_generation", "holding"),
    [
        (4, held(5, OTHER, live=True)),  # an older owner: the zombie
        (6, held(5, OTHER, live=True)),  # a generation never granted
        (5, held(5, OTHER, live=False)),  # the holder is gone
        (5, held(5, None)),  # released
        (0, Holding()),  # never owned
        (1, Holding()),
    ],
)
def test_a_stale_fence_is_fenced(fence_generation: int, holding: Holding) -> None:
    with pytest.raises(BrokerError) as caught:
        check_fence(Fence("samza", "journal/0", fence_generation), holding)
    assert caught.value.code is ErrorCode.FENCED
    assert caught.value.details["generation"] == holding.generation
    assert caught.value.details["fence_generation"] == fence_generation


def test_a_fence_is_parsed_from_group_resource_generation() -> None:
    assert parse_fence("samza:journal/0:5") == Fence("samza", "journal/0", 5)
    assert str(parse_fence("samza:journal/0:5")) == "samza:journal/0:5"


def test_a_resource_may_itself_contain_colons() -> None:
    assert parse_fence("g:host:8080/x:12") == Fence("g", "host:8080/x", 12)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "samza",
        "samza:journal/0",
        "samza:journal/0:",
        ":journal/0:5",
        "samza::5",
        "samza:journal/0:-1",
        "samza:journal/0:+1",
        "samza:journal/0:x",
        "samza:journal/0:1.0",
        "samza:journal/0: 5",
        "samza:journal/0:\u0663",  # ARABIC-INDIC DIGIT THREE: a digit, not ASCII
    ],
)
def test_a_malformed_fence_is_invalid_fence(text: str) -> None:
    with pytest.raises(BrokerError) as caught:
        parse_fence(text)
    assert caught.value.code is ErrorCode.INVALID_FENCE
    assert "GROUP:RESOURCE:GENERATION" in caught.value.message


def test_a_fence_with_an_oversized_name_is_invalid_name() -> None:
    with pytest.raises(BrokerError) as caught:
        parse_fence(f"{'g' * (NAME_CHARS_MAX + 1)}:journal/0:5")
    assert caught.value.code is ErrorCode.INVALID_NAME


# owner-group topics -----------------------------------------------------------------------


def test_a_topic_without_an_owner_group_needs_no_fence() -> None:
    check_owner_fences(None, "journal", [0, 1], [])


def test_an_owner_group_write_passes_with_the_fence_of_each_partition_it_writes() -> None:
    fences = [Fence("samza", "journal/0", 5), Fence("samza", "journal/1", 2)]
    check_owner_fences("samza", "journal", [1, 0], fences)
    check_owner_fences("samza", "journal", [1], fences[1:])  # only the partitions written


@pytest.mark.parametrize(
    ("partitions", "fences", "missing"),
    [
        ([0], [], "journal/0"),  # no fence
        ([1], [Fence("samza", "journal/0", 5)], "journal/1"),  # another partition's
        ([0], [Fence("other", "journal/0", 5)], "journal/0"),  # the resource in another group
        ([0], [Fence("samza", "orders/0", 5)], "journal/0"),  # another topic's partition
        ([0], [Fence("samza", "journal", 5)], "journal/0"),  # the topic, not its partition
        ([1, 0], [Fence("samza", "journal/1", 5)], "journal/0"),  # one of two is missing
        ([2, 1], [], "journal/1"),  # the lowest partition without one is named
    ],
)
def test_an_owner_group_write_without_its_partitions_fence_is_fenced(
    partitions: list[int], fences: list[Fence], missing: str
) -> None:
    with pytest.raises(BrokerError) as caught:
        check_owner_fences("samza", "journal", partitions, fences)
    error = caught.value
    assert error.code is ErrorCode.FENCED
    assert error.message == f"writes to {missing} need the fence of samza:{missing}"
    assert error.details["group"] == "samza"
    assert error.details["resource"] == missing
    assert error.hint == (
        f"claim it (fencelog own samza {missing}) and pass --fence samza:{missing}:GENERATION"
    )


def test_the_owner_group_rule_leaves_the_generation_to_check_fence() -> None:
    """Any generation names the partition here; whether it is current is check_fence's."""
    check_owner_fences("samza", "journal", [0], [Fence("samza", "journal/0", 0)])


# properties ---------------------------------------------------------------------------------

SESSIONS = ("s1", "s2", "s3")
RESOURCES = ("a", "b", "c", "d")


@st.composite
def holdings(draw: st.DrawFn) -> Holding:
    generation = draw(st.integers(0, 6))
    if generation == 0:
        return Holding()
    holder = draw(st.sampled_from((None, *SESSIONS)))
    return Holding(generation, holder, holder is not None and draw(st.booleans()))


@st.composite
def claims(draw: st.DrawFn) -> list[tuple[str, int]]:
    names = draw(st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=4, unique=True))
    return [(name, draw(st.integers(0, 8))) for name in names]


def refuses(session: str, requested: int, holding: Holding) -> bool:
    """A live other holder with a higher generation, and no reset."""
    return (
        requested != 0
        and holding.holder not in (None, session)
        and holding.holder_live
        and holding.generation > requested
    )


@settings(max_examples=400, deadline=None)
@given(
    session=st.sampled_from(SESSIONS),
    request=claims(),
    current=st.dictionaries(st.sampled_from(RESOURCES), holdings()),
)
def test_every_decision_obeys_the_rules(
    session: str, request: list[tuple[str, int]], current: dict[str, Holding]
) -> None:
    decision = decide_claims(session, request, current)
    expected_refused = [r for r, g in request if refuses(session, g, current.get(r, Holding()))]
    assert [r.resource for r in decision.refusals] == expected_refused
    if expected_refused:
        assert decision.grants == ()  # all or none
        for refusal in decision.refusals:
            holding = current[refusal.resource]
            assert refusal.current_generation == holding.generation > refusal.requested_generation
        return
    assert [g.resource for g in decision.grants] == [r for r, _ in request]
    for grant, (_, requested) in zip(decision.grants, request, strict=True):
        holding = current.get(grant.resource, Holding())
        assert grant.previous_generation == holding.generation
        other = holding.holder if holding.holder not in (None, session) else None
        if requested == 0:
            assert (grant.generation, grant.event, grant.severed) == (1, Event.RESET, other)
            continue
        assert grant.generation >= requested
        assert not (other is not None and holding.holder_live and holding.generation > requested)
        if holding.holder == session and requested <= holding.generation:
            assert (grant.generation, grant.event, grant.severed) == (
                holding.generation,
                Event.UNCHANGED,
                None,
            )
        else:
            assert grant.generation == max(holding.generation + 1, requested)
            assert (grant.event, grant.severed) == (Event.CLAIMED, other)


@st.composite
def steps(draw: st.DrawFn) -> list[tuple[str, list[tuple[str, int]], dict[str, bool]]]:
    """Claims by random sessions, each seeing a random choice of which sessions are live."""
    return draw(
        st.lists(
            st.tuples(
                st.sampled_from(SESSIONS),
                claims(),
                st.fixed_dictionaries({s: st.booleans() for s in SESSIONS}),
            ),
            max_size=25,
        )
    )


@settings(max_examples=300, deadline=None)
@given(sequence=steps())
def test_without_a_reset_no_generation_is_granted_to_two_sessions(
    sequence: list[tuple[str, list[tuple[str, int]], dict[str, bool]]],
) -> None:
    """Apply each decision as the engine does (grant, sever, release) and check the fence
    safety: a generation, once granted to one session, is never granted to another, and
    a resource's generation never goes down, until a reset (which the audit log records)."""
    state: dict[str, tuple[int, str | None]] = {}
    granted_to: dict[tuple[str, int], str] = {}
    for session, request, live in sequence:
        current = {r: Holding(n, h, h is not None and live[h]) for r, (n, h) in state.items()}
        decision = decide_claims(session, request, current)
        for grant in decision.grants:
            if grant.event is Event.RESET:
                granted_to = {k: v for k, v in granted_to.items() if k[0] != grant.resource}
            else:
                assert grant.generation >= grant.previous_generation
            owner = granted_to.setdefault((grant.resource, grant.generation), session)
            assert owner == session, f"{grant} was already granted to {owner}"
        severed = {g.severed for g in decision.grants} - {None}
        state = {r: (n, None if h in severed else h) for r, (n, h) in state.items()}
        for grant in decision.grants:
            state[grant.resource] = (grant.generation, session)
