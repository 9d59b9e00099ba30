"""fencelog lease-pid, produce --pid/--generation/--sequence and --idempotent, producers
list and the producer lines of status, through CliRunner, as a user sees them: the JSON
objects, what is stored, and a distinct exit status for each kind of bad input."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from msgspec.structs import replace

import broker
from broker.errors import ErrorCode
from broker.limits import DEFAULT_LIMITS
from broker.types import NewRecord, ProducerFields
from cli.main import command
from support.helpers import Invoke, expect, json_error, json_lines
from support.servers import ServerThread, served
from support.values import present

DAY_MS = 24 * 3600 * 1000


@pytest.fixture
def orders(invoke: Invoke) -> Invoke:
    expect(invoke("topic", "create", "orders", "--partitions", "2"), 0)
    return invoke


def lease(invoke: Invoke, partition: int = 0) -> dict[str, Any]:
    (leased,) = json_lines(
        expect(invoke("lease-pid", "orders", str(partition), "--json"), 0).stdout
    )
    return leased


def produce_as(
    invoke: Invoke, leased: dict[str, Any], sequence: int, *values: str, **options: Any
) -> Result:
    generation = options.get("generation", leased["generation"])
    args = ["--partition", str(options.get("partition", 0)), "--pid", str(leased["pid"])]
    args += ["--generation", str(generation), "--sequence", str(sequence)]
    for value in values:
        args += ["--value", value]
    return invoke("produce", "orders", *args, "--json")


def stored(data_dir: Path, partition: int = 0) -> list[broker.Record]:
    with broker.open(data_dir) as engine:
        return engine.read("orders", partition, 0)


# lease-pid ------------------------------------------------------------------------------


def test_lease_pid_prints_a_new_pid_at_sequence_zero_with_its_lease(orders: Invoke) -> None:
    before_ms = time.time_ns() // 1_000_000
    first = lease(orders)
    after_ms = time.time_ns() // 1_000_000
    assert set(first) == {"pid", "generation", "sequence", "expire_ms"}
    assert first["sequence"] == 0
    assert first["pid"] >= 1 and first["generation"] >= 1
    assert before_ms + DAY_MS <= first["expire_ms"] <= after_ms + DAY_MS
    second = lease(orders, 1)
    assert second["pid"] != first["pid"]
    # piped, the table is one tab-separated line: pid, generation, sequence, expire_ms
    pid, generation, sequence, expire_ms = expect(
        orders("lease-pid", "orders", "0"), 0
    ).stdout.split("\t")
    assert int(pid) not in (first["pid"], second["pid"])
    assert int(generation) >= 1 and int(sequence) == 0
    assert int(expire_ms) >= after_ms + DAY_MS


def test_lease_pid_of_an_existing_pid_prints_its_state_on_that_partition(orders: Invoke) -> None:
    leased = lease(orders)
    expect(produce_as(orders, leased, 1, "a", "b"), 0)
    result = expect(orders("lease-pid", "orders", "0", "--pid", str(leased["pid"]), "--json"), 0)
    (state,) = json_lines(result.stdout)
    assert (state["pid"], state["generation"], state["sequence"]) == (
        leased["pid"],
        leased["generation"],
        2,
    )


LEASE_REFUSALS = [
    (["lease-pid", "orders", "0", "--pid", "999999"], ErrorCode.UNKNOWN_PID),
    (["lease-pid", "orders", "0", "--pid", "0"], ErrorCode.INVALID_ARGUMENT),
    (["lease-pid", "orders", "7"], ErrorCode.UNKNOWN_PARTITION),
    (["lease-pid", "nope", "0"], ErrorCode.UNKNOWN_TOPIC),
]


@pytest.mark.parametrize(("args", "code"), LEASE_REFUSALS)
def test_lease_pid_refuses_bad_input_with_its_own_status(
    orders: Invoke, args: list[str], code: ErrorCode
) -> None:
    result = expect(orders(*args, "--json"), int(code))
    assert json_error(result)["error"] == code.name
    assert result.stdout == ""


def test_lease_pid_usage_errors_exit_2(orders: Invoke) -> None:
    for args in (["lease-pid", "orders"], ["lease-pid", "orders", "zero"]):
        expect(orders(*args), 2)


# produce --pid --generation --sequence -----------------------------------------------


def test_a_retry_with_the_same_numbers_answers_the_original_offset_as_a_duplicate(
    orders: Invoke, data_dir: Path
) -> None:
    expect(orders("produce", "orders", "-p", "0", "-v", "someone else"), 0)
    leased = lease(orders)
    first = json_lines(expect(produce_as(orders, leased, 1, "a"), 0).stdout)
    digest = hashlib.sha256(b"a").hexdigest()
    assert first == [
        {"topic": "orders", "partition": 0, "offset": 1, "value_sha256": digest, "duplicate": False}
    ]
    retry = json_lines(expect(produce_as(orders, leased, 1, "a"), 0).stdout)
    assert retry == [
        {"topic": "orders", "partition": 0, "offset": 1, "value_sha256": digest, "duplicate": True}
    ]
    records = stored(data_dir)
    assert [r.value for r in records] == [b"someone else", b"a"]
    assert (records[1].producer_id, records[1].generation, records[1].sequence) == (
        leased["pid"],
        leased["generation"],
        1,
    )


def test_a_retry_says_in_text_that_nothing_new_was_appended(orders: Invoke) -> None:
    leased = lease(orders)
    numbers = ["--pid", str(leased["pid"]), "--generation", str(leased["generation"])]
    once = ["produce", "orders", "-p", "0", *numbers, "--sequence", "1", "-v", "a", "-v", "b"]
    first = expect(orders(*once), 0).stdout
    assert first == "produced 2 records to orders: partition 0 offsets 0-1\n"
    # the retry's records are not appended again; the text said "produced 2 records"
    retry = expect(orders(*once), 0).stdout
    assert retry == (
        "nothing new in orders: the records were there already (a retry's duplicates, "
        "not appended again): partition 0 offsets 0-1\n"
    )


def test_empty_input_says_nothing_was_sent(orders: Invoke) -> None:
    # it said the records "were there already", of a produce that had none
    nothing = expect(orders("produce", "orders", input=""), 0).stdout
    assert nothing == "produced nothing to orders: there was no record to send\n"


def test_several_values_take_consecutive_sequences(orders: Invoke, data_dir: Path) -> None:
    leased = lease(orders)
    expect(produce_as(orders, leased, 1, "a", "b", "c"), 0)
    replay = json_lines(expect(produce_as(orders, leased, 2, "b", "c"), 0).stdout)
    assert [(r["offset"], r["duplicate"]) for r in replay] == [(1, True), (2, True)]
    expect(produce_as(orders, leased, 4, "d"), 0)
    assert [r.sequence for r in stored(data_dir)] == [1, 2, 3, 4]
    plain = expect(
        orders(
            "produce", "orders", "-p", "0", "--pid", str(leased["pid"]), "--generation",
            str(leased["generation"]), "--sequence", "5", "-v", "e",
        ),
        0,
    )  # fmt: skip
    assert plain.stdout == "produced 1 record to orders: partition 0 offset 4\n"


def test_a_sequence_gap_is_out_of_order_with_both_numbers_and_stores_nothing(
    orders: Invoke, data_dir: Path
) -> None:
    leased = lease(orders)
    expect(produce_as(orders, leased, 1, "a"), 0)
    result = expect(produce_as(orders, leased, 3, "c"), 50)
    error = json_error(result)
    assert error["error"] == "OUT_OF_ORDER_SEQUENCE"
    assert (error["expected_sequence"], error["received_sequence"]) == (2, 3)
    assert error["producer_id"] == leased["pid"]
    assert [r.value for r in stored(data_dir)] == [b"a"]
    plain = orders(
        "produce", "orders", "-p", "0", "--pid", str(leased["pid"]), "--generation",
        str(leased["generation"]), "--sequence", "3", "-v", "c",
    )  # fmt: skip
    assert plain.exit_code == 50
    assert plain.stderr.startswith("error: ") and "[OUT_OF_ORDER_SEQUENCE]" in plain.stderr
    assert "expected 2" in plain.stderr


@pytest.mark.parametrize(
    ("step", "code"), [(-1, ErrorCode.FENCED), (2, ErrorCode.INVALID_GENERATION)]
)
def test_a_wrong_generation_names_the_stored_and_the_received_one(
    orders: Invoke, data_dir: Path, step: int, code: ErrorCode
) -> None:
    leased = lease(orders)
    expect(produce_as(orders, leased, 1, "a"), 0)
    generation = leased["generation"] + step
    error = json_error(expect(produce_as(orders, leased, 2, "x", generation=generation), code))
    assert error["error"] == code.name
    assert (error["stored_generation"], error["received_generation"]) == (
        leased["generation"],
        generation,
    )
    assert [r.value for r in stored(data_dir)] == [b"a"]


def test_a_pid_never_leased_is_unknown_pid(orders: Invoke, data_dir: Path) -> None:
    fake = {"pid": 424242, "generation": 1}
    error = json_error(expect(produce_as(orders, fake, 1, "a"), 53))
    assert (error["error"], error["producer_id"]) == ("UNKNOWN_PID", 424242)
    assert stored(data_dir) == []


def test_a_pid_inside_the_reserved_block_that_nobody_was_given_is_unknown(
    orders: Invoke, data_dir: Path
) -> None:
    leased = lease(orders)
    squatter = {"pid": leased["pid"] + 1, "generation": 1}
    error = json_error(expect(produce_as(orders, squatter, 1, "mine"), ErrorCode.UNKNOWN_PID))
    assert (error["error"], error["producer_id"]) == ("UNKNOWN_PID", leased["pid"] + 1)
    assert stored(data_dir) == []
    expect(orders("lease-pid", "orders", "0", "--pid", str(leased["pid"] + 1)), 53)


def test_lease_pid_of_a_pid_leased_a_moment_ago_shows_its_lease(orders: Invoke) -> None:
    leased = lease(orders)
    again = expect(orders("lease-pid", "orders", "0", "--pid", str(leased["pid"]), "--json"), 0)
    (shown,) = json_lines(again.stdout)
    assert (shown["pid"], shown["generation"], shown["sequence"]) == (
        leased["pid"],
        leased["generation"],
        0,
    )
    assert shown["expire_ms"] >= leased["expire_ms"]


def test_a_pid_whose_lease_ended_is_pid_expired(orders: Invoke, data_dir: Path) -> None:
    # Its first record was written by a broker whose clock read 1 second after the epoch:
    # by today's clock its lease ended long ago.
    with broker.Engine.open(data_dir, clock=lambda: 1_000) as engine:
        leased = engine.lease_pid("orders", 0)
        fields = ProducerFields(leased.producer_id, leased.generation, 1)
        engine.produce("orders", [NewRecord(b"old", partition=0)], producer=fields)
    who = {"pid": leased.producer_id, "generation": leased.generation}
    error = json_error(expect(produce_as(orders, who, 2, "late"), 52))
    assert error["error"] == "PID_EXPIRED"
    assert error["expired_ms"] == 1_000 + DAY_MS
    expect(orders("lease-pid", "orders", "0", "--pid", str(leased.producer_id)), 52)
    assert [r.value for r in stored(data_dir)] == [b"old"]


PRODUCE_MISUSE = [
    ["-p", "0", "--pid", "1", "-v", "a"],  # no --generation, no --sequence
    ["-p", "0", "--pid", "1", "--generation", "1", "-v", "a"],  # no --sequence
    ["--pid", "1", "--generation", "1", "--sequence", "1", "-v", "a"],  # no --partition
    ["-p", "0", "--pid", "1", "--generation", "1", "--sequence", "1", "--idempotent", "-v", "a"],
    ["-p", "0", "--pid", "-1", "--generation", "1", "--sequence", "1", "-v", "a"],
]


@pytest.mark.parametrize("args", PRODUCE_MISUSE)
def test_producer_options_that_do_not_go_together_are_invalid_arguments(
    orders: Invoke, data_dir: Path, args: list[str]
) -> None:
    result = expect(orders("produce", "orders", *args, "--json"), 10)
    assert json_error(result)["error"] == "INVALID_ARGUMENT"
    assert stored(data_dir) == [] and stored(data_dir, 1) == []


def test_a_producer_option_that_is_not_a_number_is_a_usage_error(orders: Invoke) -> None:
    expect(orders("produce", "orders", "-p", "0", "--pid", "one", "-v", "a"), 2)
    expect(orders("produce", "orders", "-p", "0", "--pid", "1", "--sequence", "x"), 2)


# produce --idempotent ------------------------------------------------------------------


def test_idempotent_produce_from_stdin_numbers_each_partitions_records(
    orders: Invoke, data_dir: Path
) -> None:
    lines = [f"line-{i}" for i in range(10)]
    result = expect(
        orders("produce", "orders", "--idempotent", "--json", input="\n".join(lines)), 0
    )
    landed = json_lines(result.stdout)
    assert len(landed) == 10
    assert all(r["duplicate"] is False for r in landed)
    by_partition: dict[int, list[broker.Record]] = {p: stored(data_dir, p) for p in (0, 1)}
    assert sorted(present(r.value) for p in (0, 1) for r in by_partition[p]) == sorted(
        line.encode() for line in lines
    )
    for records in by_partition.values():
        assert records, "round robin reaches both partitions"
        (pid,) = {r.producer_id for r in records}
        assert pid >= 1
        assert [r.sequence for r in records] == list(range(1, len(records) + 1))
        sent_order = [
            line.encode() for line in lines if line.encode() in {r.value for r in records}
        ]
        assert [r.value for r in records] == sent_order
    assert by_partition[0][0].producer_id != by_partition[1][0].producer_id


def test_idempotent_produce_to_one_partition_prints_a_summary(
    orders: Invoke, data_dir: Path
) -> None:
    result = expect(orders("produce", "orders", "--idempotent", "-p", "1", input="a\nb\n"), 0)
    assert result.stdout == "produced 2 records to orders: partition 1 offsets 0-1\n"
    assert [(r.value, r.sequence) for r in stored(data_dir, 1)] == [(b"a", 1), (b"b", 2)]


def test_plain_produce_json_has_no_duplicate_field(orders: Invoke) -> None:
    (landed,) = json_lines(
        expect(orders("produce", "orders", "-p", "0", "-v", "a", "--json"), 0).stdout
    )
    digest = hashlib.sha256(b"a").hexdigest()
    assert landed == {"topic": "orders", "partition": 0, "offset": 0, "value_sha256": digest}


# producers list and status ---------------------------------------------------------------


def test_producers_list_shows_every_pid_with_its_numbers(orders: Invoke, data_dir: Path) -> None:
    assert expect(orders("producers", "list", "orders", "--json"), 0).stdout == ""
    one, two = lease(orders), lease(orders, 1)
    expect(produce_as(orders, one, 1, "a", "b"), 0)
    expect(produce_as(orders, two, 1, "c", partition=1), 0)
    expect(produce_as(orders, one, 3, "d", generation=one["generation"] + 1), 0)
    rows = json_lines(expect(orders("producers", "list", "orders", "--json"), 0).stdout)
    shown = [
        (r["topic"], r["partition"], r["pid"], r["generation"], r["sequence"], r["last_offset"])
        for r in rows
    ]
    assert shown == [
        ("orders", 0, one["pid"], one["generation"] + 1, 3, 2),
        ("orders", 1, two["pid"], two["generation"], 1, 0),
    ]
    for row in rows:
        assert row["expire_ms"] == row["first_record_ms"] + DAY_MS
    assert rows[0]["first_record_ms"] == stored(data_dir)[0].timestamp_ms
    # piped: partition, pid, generation, sequence, last offset, expire_ms
    plain = expect(orders("producers", "list", "orders"), 0).stdout.splitlines()
    assert [line.split("\t") for line in plain] == [
        [str(r["partition"]), str(r["pid"]), str(r["generation"]), str(r["sequence"]),
         str(r["last_offset"]), str(r["expire_ms"])]
        for r in rows
    ]  # fmt: skip
    expect(orders("producers", "list", "nope"), 20)


def test_status_counts_producer_ids(orders: Invoke) -> None:
    for partition in (0, 1, 0):
        leased = lease(orders, partition)
        expect(produce_as(orders, leased, 1, "x", partition=partition), 0)
    status = json_lines(expect(orders("status", "--json"), 0).stdout)[0]
    assert (status["producer_ids"], status["producer_evictions"]) == (3, 0)
    plain = expect(orders("status"), 0).stdout
    assert "producer ids" in plain and "producer evictions" in plain


@pytest.fixture
def small_server(data_dir: Path) -> Iterator[ServerThread]:
    limits = replace(DEFAULT_LIMITS, producer_ids_max=2, pid_lease_ms=5_000)
    with served(data_dir, limits=limits) as server:
        yield server


def run(runner: CliRunner, server: ServerThread, *args: str) -> Result:
    return runner.invoke(command(), ["--broker", server.address, *args])


def test_a_served_broker_shows_its_evictions_in_status(
    runner: CliRunner, small_server: ServerThread
) -> None:
    expect(run(runner, small_server, "topic", "create", "orders"), 0)
    for index in range(5):
        (leased,) = json_lines(
            expect(run(runner, small_server, "lease-pid", "orders", "0", "--json"), 0).stdout
        )
        args = ["--pid", str(leased["pid"]), "--generation", str(leased["generation"])]
        expect(
            run(
                runner,
                small_server,
                "produce",
                "orders",
                "-p",
                "0",
                *args,
                "--sequence",
                "1",
                "-v",
                f"v{index}",
            ),
            0,
        )
    status = json_lines(expect(run(runner, small_server, "status", "--json"), 0).stdout)[0]
    assert (status["producer_ids"], status["producer_evictions"]) == (2, 3)
    rows = json_lines(
        expect(run(runner, small_server, "producers", "list", "orders", "--json"), 0).stdout
    )
    assert len(rows) == 2


def test_producers_list_of_a_served_broker_uses_the_brokers_lease(
    runner: CliRunner, small_server: ServerThread
) -> None:
    expect(run(runner, small_server, "topic", "create", "orders"), 0)
    (leased,) = json_lines(
        expect(run(runner, small_server, "lease-pid", "orders", "0", "--json"), 0).stdout
    )
    args = ["--pid", str(leased["pid"]), "--generation", str(leased["generation"])]
    expect(
        run(
            runner,
            small_server,
            "produce",
            "orders",
            "-p",
            "0",
            *args,
            "--sequence",
            "1",
            "-v",
            "a",
        ),
        0,
    )
    (state,) = json_lines(
        expect(
            run(
                runner,
                small_server,
                "lease-pid",
                "orders",
                "0",
                "--pid",
                str(leased["pid"]),
                "--json",
            ),
            0,
        ).stdout
    )
    (row,) = json_lines(
        expect(run(runner, small_server, "producers", "list", "orders", "--json"), 0).stdout
    )
    assert row["expire_ms"] == state["expire_ms"] == row["first_record_ms"] + 5_000
