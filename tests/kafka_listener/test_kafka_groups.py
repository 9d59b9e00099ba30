"""Consumer group generations are ownership generations: a zombie member's commit is
refused, and a generation is never handed out twice (raw requests, as no client sends a
zombie's commit on purpose)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import Any

import pytest
from kafka.protocol.admin import DeleteGroupsRequest
from kafka.protocol.consumer import (
    HeartbeatRequest,
    JoinGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)

from broker.client.client import connect
from broker.errors import BrokerError, ErrorCode
from broker.kafka import wire
from broker.kafka.admin_codes import NON_EMPTY_GROUP
from broker.kafka.groups import Coordinator
from support.kafka_raw import STEP_TIMEOUT_S, RawKafka
from support.servers import ServeProcess
from support.waiting import wait_until

GROUP = "zombies"


def join(member: RawKafka, member_id: str = "", group_id: str = GROUP) -> Any:
    protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")
    request = JoinGroupRequest(
        group_id=group_id,
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[protocol],
    )
    return member.call(request, 5)


def sync(member: RawKafka, generation: int, member_id: str, assignments: dict[str, bytes]) -> Any:
    request = SyncGroupRequest(
        group_id=GROUP,
        generation_id=generation,
        member_id=member_id,
        group_instance_id=None,
        assignments=[
            SyncGroupRequest.SyncGroupRequestAssignment(member_id=m, assignment=a)
            for m, a in assignments.items()
        ],
    )
    return member.call(request, 3)


def commit(member: RawKafka, generation: int, member_id: str, offset: int) -> int:
    topic_cls = OffsetCommitRequest.OffsetCommitRequestTopic
    request = OffsetCommitRequest(
        group_id=GROUP,
        generation_id_or_member_epoch=generation,
        member_id=member_id,
        group_instance_id=None,
        topics=[
            topic_cls(
                name="work",
                partitions=[
                    topic_cls.OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=offset, committed_metadata=None
                    )
                ],
            )
        ],
    )
    answer = member.call(request, 7)
    (code,) = {p.error_code for t in answer.topics for p in t.partitions}
    return int(code)


def committed(member: RawKafka) -> int:
    topic_cls = OffsetFetchRequest.OffsetFetchRequestTopic
    request = OffsetFetchRequest(
        group_id=GROUP, topics=[topic_cls(name="work", partition_indexes=[0])]
    )
    answer = member.call(request, 5)
    return int(answer.topics[0].partitions[0].committed_offset)


def committed_v7(member: RawKafka, require_stable: bool) -> tuple[int, int]:
    """(committed offset, error) of work/0 for GROUP, OffsetFetch v7."""
    topic_cls = OffsetFetchRequest.OffsetFetchRequestTopic
    request = OffsetFetchRequest(
        group_id=GROUP,
        topics=[topic_cls(name="work", partition_indexes=[0])],
        require_stable=require_stable,
    )
    (partition,) = member.call(request, 7).topics[0].partitions
    return int(partition.committed_offset), int(partition.error_code)


def test_offsets_an_open_transaction_holds_are_unstable_to_who_asks_for_stable_ones(
    kafka_server: ServeProcess, kafka: str
) -> None:
    """OffsetFetch's require_stable (KIP-447): a read_committed consumer taking over a
    partition was answered the offset before an open transaction's at once, and read
    again what that transaction's commit then covered."""
    with connect(kafka_server.address) as client:
        client.create_topic("work")
        client.commit_offsets(GROUP, "work", {0: 5})
        txn = client.txn_begin("copier")
        client.txn_commit_offsets(txn.txn_id, GROUP, "work", {0: 10})
        asker = RawKafka(kafka)
        try:
            assert committed_v7(asker, require_stable=True) == (-1, wire.UNSTABLE_OFFSET_COMMIT)
            assert committed_v7(asker, require_stable=False) == (5, wire.NONE)
            client.txn_commit(txn.txn_id)
            assert committed_v7(asker, require_stable=True) == (10, wire.NONE)
        finally:
            asker.close()


def hear_of_rebalance(member: RawKafka, generation: int, member_id: str) -> None:
    """Heartbeat until the answer is REBALANCE_IN_PROGRESS: the group prepares one."""
    beat = HeartbeatRequest(group_id=GROUP, generation_id=generation, member_id=member_id)
    code = wait_until(
        lambda: member.call(beat, 3).error_code or None,
        STEP_TIMEOUT_S,
        message="a heartbeat telling of the rebalance",
    )
    assert code == wire.REBALANCE_IN_PROGRESS


def test_a_zombie_members_commit_is_refused(kafka_server: ServeProcess, kafka: str) -> None:
    with connect(kafka_server.address) as client:
        client.create_topic("work")
    first, second, third = RawKafka(kafka), RawKafka(kafka), RawKafka(kafka)
    try:
        joined = join(first)
        assert joined.error_code == wire.NONE
        one, first_id = joined.generation_id, joined.member_id
        assert sync(first, one, first_id, {first_id: b"p0"}).assignment == b"p0"
        assert commit(first, one, first_id, 5) == wire.NONE

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            newcomer = pool.submit(join, second)
            # the first member hears of the rebalance on its heartbeat and joins again
            hear_of_rebalance(first, one, first_id)
            rejoined = pool.submit(join, first, first_id).result(STEP_TIMEOUT_S)
            second_joined = newcomer.result(STEP_TIMEOUT_S)
        two = rejoined.generation_id
        assert two == second_joined.generation_id > one

        # the first member's earlier incarnation (generation one) is a zombie now
        assert commit(first, one, first_id, 99) == wire.ILLEGAL_GENERATION
        assert commit(third, two, "nobody-knows-me", 99) == wire.UNKNOWN_MEMBER_ID
        # an admin's commit (no generation, no member) while the group has members: Kafka's
        # UNKNOWN_MEMBER_ID (librdkafka's 0081 AlterConsumerGroupOffsets expects it)
        assert commit(third, -1, "", 99) == wire.UNKNOWN_MEMBER_ID
        assert committed(third) == 5

        # the generation lives in the ownership table, under the group `kafka`
        with connect(kafka_server.address) as client:
            (row,) = [r for r in client.ownership("kafka") if r.resource == GROUP]
        assert row.generation == two
    finally:
        for member in (first, second, third):
            member.close()


def test_a_member_commits_while_its_group_prepares_a_rebalance(
    kafka_server: ServeProcess, kafka: str
) -> None:
    """Kafka's rule, on which a consumer's "commit what I read as I give my partitions
    up" rests (librdkafka's on_revoke, its auto-commit): while the group prepares a
    rebalance, a member of the generation still current may commit. Once the new
    generation is formed, and until it is synced, a commit is REBALANCE_IN_PROGRESS."""
    with connect(kafka_server.address) as client:
        client.create_topic("work")
    first, second, third = RawKafka(kafka), RawKafka(kafka), RawKafka(kafka)
    try:
        joined = join(first)
        one, first_id = joined.generation_id, joined.member_id
        assert sync(first, one, first_id, {first_id: b"p0"}).assignment == b"p0"
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            newcomer = pool.submit(join, second)
            hear_of_rebalance(first, one, first_id)
            assert commit(first, one, first_id, 7) == wire.NONE  # what it read, as it revokes
            rejoined = pool.submit(join, first, first_id).result(STEP_TIMEOUT_S)
            newcomer.result(STEP_TIMEOUT_S)
        two = rejoined.generation_id
        assert commit(first, two, first_id, 8) == wire.REBALANCE_IN_PROGRESS  # not synced
        assert committed(third) == 7
    finally:
        for member in (first, second, third):
            member.close()


@pytest.mark.parametrize("group_id", ["bad\x00group", "g" * 256], ids=["nul", "256-chars"])
def test_a_join_to_a_group_id_no_group_can_have_is_invalid_group_id(
    kafka_server: ServeProcess, kafka: str, group_id: str
) -> None:
    # found by tests/kafka_listener/test_kafka_fuzz.py (seed 5): the first generation's
    # claim failed, the joiner heard COORDINATOR_NOT_AVAILABLE and the log an ERROR
    member = RawKafka(kafka)
    try:
        assert join(member, group_id=group_id).error_code == wire.INVALID_GROUP_ID
        assert join(member).error_code == wire.NONE  # the coordinator goes on
    finally:
        member.close()
    assert " ERROR " not in kafka_server.stderr_text(), kafka_server.stderr_text()


def test_a_generation_that_cannot_be_claimed_is_coordinator_not_available_and_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The claim of a group's next generation failing (the database full, say): its
    joiners hear COORDINATOR_NOT_AVAILABLE and join again; the listener's log says so,
    once, not asyncio's "Task exception was never retrieved" at ERROR."""

    async def failing(group_id: str) -> int:
        raise BrokerError(ErrorCode.STORAGE_FAILED, "database or disk is full")

    async def scenario() -> int:
        coordinator = Coordinator(failing)
        try:
            joined = coordinator.join(
                "g", "", None, "c", 10_000, 10_000, "consumer", [("range", b"")]
            )
            return (await asyncio.wait_for(joined, STEP_TIMEOUT_S)).error
        finally:
            await coordinator.stop()

    with caplog.at_level(logging.WARNING):
        error = asyncio.run(scenario())
    assert error == wire.COORDINATOR_NOT_AVAILABLE
    warned = [r for r in caplog.records if r.name == "fencelog.kafka"]
    assert [r.levelname for r in warned] == ["WARNING"]
    assert "next generation could not be claimed (database or disk is full)" in warned[0].message
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_static_member_that_goes_silent_is_gone_once_its_session_ends(
    kafka_server: ServeProcess, kafka: str
) -> None:
    """A static member leaves no LeaveGroup (KIP-345): it is removed when its session
    timeout has passed since its last request, as Kafka's timer removes it, so that a
    DeleteGroups just after that finds the group empty (librdkafka's 0081 deletes its
    groups six seconds after their static members, of a six-second session, closed;
    a check every half second had left them there)."""
    member = RawKafka(kafka)
    try:
        protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")
        joined = member.call(
            JoinGroupRequest(
                group_id="silent",
                session_timeout_ms=1_000,
                rebalance_timeout_ms=1_000,
                member_id="",
                group_instance_id="only",
                protocol_type="consumer",
                protocols=[protocol],
            ),
            5,
        )
        assert joined.error_code == wire.NONE
        synced = member.call(
            SyncGroupRequest(
                group_id="silent",
                generation_id=joined.generation_id,
                member_id=joined.member_id,
                group_instance_id="only",
                assignments=[
                    SyncGroupRequest.SyncGroupRequestAssignment(
                        member_id=joined.member_id, assignment=b"a"
                    )
                ],
            ),
            3,
        )
        last_request = time.monotonic()  # the server saw it before this answer came
        assert synced.error_code == wire.NONE
        delete = DeleteGroupsRequest(groups_names=["silent"])
        assert member.call(delete, 2).results[0].error_code == NON_EMPTY_GROUP
        time.sleep(max(0.0, last_request + 1.0 + 0.02 - time.monotonic()))
        assert member.call(delete, 2).results[0].error_code == wire.NONE
    finally:
        member.close()
