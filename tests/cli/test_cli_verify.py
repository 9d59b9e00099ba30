"""fencelog verify, as a user checking a pipeline sees it: a clean log exits 0, each kind
of anomaly is reported (text and --json) and exits VERIFY_FAILED (90), bad input is a
one-line error with its own status.

Logs with anomalies the broker itself refuses to write (a sequence that skips, a zombie
generation, an older epoch, a gap) are made by editing the stored rows with SQLite, as a
broken broker or a broken copy of the data directory would leave them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from broker.discovery import DB_FILE
from broker.errors import ErrorCode
from support.helpers import Invoke, expect, json_error, json_lines
from support.servers import served
from support.stored import rewrite_record

FAILED = int(ErrorCode.VERIFY_FAILED)
VALUES = [f"v{i}" for i in range(1, 9)]


@pytest.fixture
def cli(invoke: Invoke) -> Invoke:
    """The CLI with topic `in` of 2 partitions."""
    expect(invoke("topic", "create", "in", "--partitions", "2"), 0)
    return invoke


def lines(values: list[str]) -> str:
    return "".join(f"{v}\n" for v in values)


@pytest.fixture
def expected(tmp_path: Path) -> Path:
    path = tmp_path / "values.txt"
    path.write_text(lines(VALUES))
    return path


def produce_acks(cli: Invoke, path: Path, *args: str, values: list[str] = VALUES) -> Path:
    """`produce --json` of values into `in`; its acks written to path."""
    result = expect(cli("produce", "in", "--json", *args, input=lines(values)), 0)
    path.write_text(result.stdout)
    return path


def report(result: Result) -> dict[str, Any]:
    """The one JSON object verify --json prints."""
    [obj] = json_lines(result.stdout)
    return obj


def anomalies(result: Result) -> dict[str, int]:
    """The kinds verify --json counted, without the zeros."""
    expect(result, FAILED)
    assert json_error(result)["error"] == "VERIFY_FAILED"
    obj = report(result)
    assert obj["clean"] is False
    return {kind: count for kind, count in obj["counts"].items() if count}


def examples(obj: dict[str, Any], kind: str) -> list[str]:
    return [
        example["message"]
        for section in [*obj["partitions"], {"examples": obj["topic_wide"]}]
        for example in section["examples"].get(kind, [])
    ]


@contextlib.contextmanager
def database(data_dir: Path) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(data_dir / DB_FILE)
    try:
        with connection:
            yield connection
    finally:
        connection.close()


def tamper(data_dir: Path, partition: int, offset: int, **columns: object) -> None:
    """Set fields of one stored record of `in`, as a broken broker would have."""
    rewrite_record(data_dir / DB_FILE, "in", partition, offset, columns)


def delete(data_dir: Path, partition: int, offset: int) -> None:
    rewrite_record(data_dir / DB_FILE, "in", partition, offset, None)


def produce_as(cli: Invoke, partition: int, values: list[str]) -> tuple[int, int]:
    """values written to a partition by a freshly leased pid, from sequence 1."""
    lease = json.loads(expect(cli("lease-pid", "in", str(partition), "--json"), 0).stdout)
    pid, generation = lease["pid"], lease["generation"]
    args = ["--pid", str(pid), "--generation", str(generation), "--sequence", "1"]
    expect(cli("produce", "in", "-p", str(partition), *args, input=lines(values)), 0)
    return pid, generation


# a clean log ---------------------------------------------------------------------------


def test_an_idempotent_producers_log_verifies_clean_against_its_acks_and_values(
    cli: Invoke, tmp_path: Path, expected: Path
) -> None:
    acks = produce_acks(cli, tmp_path / "acks.ndjson", "--idempotent")
    result = expect(cli("verify", "in", "--acks", str(acks)), 0)
    assert result.stdout.splitlines() == [
        "partition 0: 4 records (offsets 0-3): clean",
        "partition 1: 4 records (offsets 0-3): clean",
        "verify in: 8 records, 8 acks: clean",
    ]
    obj = report(expect(cli("verify", "in", "--expect", str(expected), "--json"), 0))
    assert obj["clean"] is True
    assert obj["anomalies"] == 0
    assert (obj["records"], obj["expected"]) == (8, 8)
    assert set(obj["counts"].values()) == {0}
    assert [p["records"] for p in obj["partitions"]] == [4, 4]


def test_produce_json_acks_carry_the_sha256_of_each_value(cli: Invoke, tmp_path: Path) -> None:
    acks = produce_acks(cli, tmp_path / "acks.ndjson", values=["a", "b"])
    digests = [obj["value_sha256"] for obj in json_lines(acks.read_text())]
    assert digests == [hashlib.sha256(v).hexdigest() for v in (b"a", b"b")]


def test_verify_works_through_a_server(cli: Invoke, data_dir: Path, tmp_path: Path) -> None:
    with served(data_dir):
        acks = produce_acks(cli, tmp_path / "acks.ndjson", "--idempotent")
        expect(cli("verify", "in", "--acks", str(acks)), 0)
        expect(cli("produce", "in", "-p", "1", "-v", "v1"), 0)
        counts = anomalies(cli("verify", "in", "--acks", str(acks), "--json"))
    assert counts == {"duplicate": 1}


# lost ----------------------------------------------------------------------------------


def test_an_acked_offset_missing_or_holding_other_bytes_is_lost(
    cli: Invoke, data_dir: Path, tmp_path: Path
) -> None:
    acks = produce_acks(cli, tmp_path / "acks.ndjson", "-p", "0")
    with acks.open("a") as file:  # an ack of a record the log does not have
        file.write(json.dumps({"topic": "in", "partition": 0, "offset": 8}) + "\n")
    tamper(data_dir, 0, 2, value=b"changed")
    result = cli("verify", "in", "--acks", str(acks))
    expect(result, FAILED)
    assert f"{acks}:3: offset 2 holds other bytes than were acknowledged" in result.stdout
    assert f"{acks}:9: offset 8 is not in the log" in result.stdout
    assert result.stdout.splitlines()[-1] == "verify in: 8 records, 9 acks: 2 anomalies (lost 2)"
    assert result.stderr == (
        "error: 2 anomalies in in: lost 2 (the report on stdout lists them) [VERIFY_FAILED]\n"
    )
    assert anomalies(cli("verify", "in", "--acks", str(acks), "--json")) == {"lost": 2}


def test_null_values_verify_clean_and_a_null_where_bytes_were_acked_is_lost(
    cli: Invoke, tmp_path: Path
) -> None:
    """A null value has no bytes to compare: its ack (value_sha256 null) holds its
    place, it is never a duplicate of another null; an ack of bytes where the log holds
    a null is lost."""
    values = ["a", "-", "b", "-"]
    acks = tmp_path / "acks.ndjson"
    produce_acks(cli, acks, "-p", "0", "--null-value", "-", values=values)
    assert [a["value_sha256"] is None for a in json_lines(acks.read_text())] == [0, 1, 0, 1]
    clean = cli("verify", "in", "--acks", str(acks))
    assert expect(clean, 0).stdout.splitlines()[-1] == "verify in: 4 records, 4 acks: clean"
    bytes_acked = acks.read_text().replace('"value_sha256":null', f'"value_sha256":"{"0" * 64}"', 1)
    acks.write_text(bytes_acked)
    assert anomalies(cli("verify", "in", "--acks", str(acks), "--json")) == {"lost": 1}


def test_an_expected_value_missing_from_the_log_is_lost(
    cli: Invoke, expected: Path, data_dir: Path
) -> None:
    expect(cli("produce", "in", "-p", "0", input=lines(VALUES[:-1])), 0)
    result = cli("verify", "in", "--expect", str(expected), "--json")
    assert anomalies(result) == {"lost": 1}
    assert examples(report(result), "lost") == ["expected #8 value 'v8' is not in the log"]


# duplicates ----------------------------------------------------------------------------


def test_values_stored_twice_are_duplicates(cli: Invoke, expected: Path) -> None:
    expect(cli("produce", "in", "-p", "0", input=lines(VALUES)), 0)
    expect(cli("produce", "in", "-p", "1", input=lines(VALUES[:3])), 0)
    result = cli("verify", "in", "--expect", str(expected), "--json")
    assert anomalies(result) == {"duplicate": 3}
    assert examples(report(result), "duplicate")[0] == "value 'v1' is stored 2 times: 0:0, 1:0"


def test_a_plain_retry_of_an_acked_record_is_a_duplicate(cli: Invoke, tmp_path: Path) -> None:
    acks = produce_acks(cli, tmp_path / "acks.ndjson", "--idempotent")
    expect(cli("produce", "in", "-p", "0", "-v", "v5", "-v", "unacked", "-v", "unacked"), 0)
    result = cli("verify", "in", "--acks", str(acks), "--json")
    assert anomalies(result) == {"duplicate": 1}  # values nobody acknowledged are not counted


def test_by_key_counts_keys_stored_twice(cli: Invoke, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("k1\nk2\n")
    entries = "k1=a\nk2=b\nk1=c\n"
    expect(cli("produce", "in", "-p", "0", "--key-separator", "=", input=entries), 0)
    expect(cli("verify", "in", "--expect", str(keys), "--by", "value"), FAILED)
    result = cli("verify", "in", "--expect", str(keys), "--by", "key", "--json")
    assert anomalies(result) == {"duplicate": 1}
    assert examples(report(result), "duplicate") == ["key 'k1' is stored 2 times: 0:0, 0:2"]


def test_the_report_lists_a_few_examples_and_counts_them_all(cli: Invoke, expected: Path) -> None:
    for _ in range(3):
        expect(cli("produce", "in", "-p", "0", input=lines(VALUES)), 0)
    result = cli("verify", "in", "--expect", str(expected), "--examples", "3")
    expect(result, FAILED)
    assert "  duplicate: 8\n" in result.stdout
    assert "    ... and 5 more\n" in result.stdout
    obj = report(cli("verify", "in", "--expect", str(expected), "--examples", "3", "--json"))
    assert obj["counts"]["duplicate"] == 8
    assert len(obj["partitions"][0]["examples"]["duplicate"]) == 3


# order ---------------------------------------------------------------------------------


def test_a_keys_values_stored_in_another_order_than_expected_are_out_of_order(
    cli: Invoke, expected: Path
) -> None:
    swapped = [VALUES[0], VALUES[2], VALUES[1], *VALUES[3:]]
    keyless = cli("produce", "in", "-p", "0", input=lines(swapped))
    expect(keyless, 0)  # no key: no order claimed across producers
    expect(cli("verify", "in", "--expect", str(expected)), 0)
    expect(cli("topic", "delete", "in"), 0)
    expect(cli("topic", "create", "in"), 0)
    keyed = lines([f"k={value}" for value in swapped])
    expect(cli("produce", "in", "--key-separator", "=", input=keyed), 0)
    result = cli("verify", "in", "--expect", str(expected), "--json")
    assert anomalies(result) == {"out_of_order": 1}
    assert examples(report(result), "out_of_order") == [
        "offset 2 (expected #2) comes after offset 1 (expected #3) for key 'k'"
    ]


def test_acks_of_one_producer_going_back_on_a_partition_are_out_of_order(
    cli: Invoke, tmp_path: Path
) -> None:
    acks = produce_acks(cli, tmp_path / "acks.ndjson", "-p", "1")
    acked = acks.read_text().splitlines()
    acks.write_text("\n".join([acked[1], acked[0], *acked[2:]]) + "\n")
    result = cli("verify", "in", "--acks", str(acks), "--json")
    assert anomalies(result) == {"out_of_order": 1}
    assert examples(report(result), "out_of_order") == [
        f"{acks}:2: offset 0 acknowledged after offset 1 ({acks}:1)"
    ]


# what the broker never writes ----------------------------------------------------------


def test_a_missing_offset_is_a_gap(cli: Invoke, data_dir: Path, tmp_path: Path) -> None:
    acks = produce_acks(cli, tmp_path / "acks.ndjson", "-p", "0")
    delete(data_dir, 0, 3)
    delete(data_dir, 0, 4)
    result = cli("verify", "in", "--acks", str(acks), "--json")
    assert anomalies(result) == {"gap": 1, "lost": 2}
    obj = report(result)
    assert examples(obj, "gap") == ["offsets 3-4 are missing"]
    assert obj["partitions"][0]["examples"]["gap"][0]["missing"] == 2


def test_sequences_that_skip_or_repeat_are_reported_per_pid_and_partition(
    cli: Invoke, data_dir: Path
) -> None:
    pid, _ = produce_as(cli, 1, ["a", "b", "c", "d"])
    expect(cli("verify", "in"), 0)
    tamper(data_dir, 1, 1, sequence=3)  # sequences 1, 3, 3, 4
    result = cli("verify", "in", "--json")
    assert anomalies(result) == {"sequence_skip": 1, "sequence_repeat": 1}
    obj = report(result)
    assert examples(obj, "sequence_skip") == [
        f"offset 1: pid {pid} sequence 3 follows 1 (offset 0)"
    ]
    assert examples(obj, "sequence_repeat") == [
        f"offset 2: pid {pid} sequence 3 follows 3 (offset 1)"
    ]


def test_a_fenced_generation_written_after_a_newer_one_is_reported(
    cli: Invoke, data_dir: Path
) -> None:
    pid, generation = produce_as(cli, 0, ["a", "b", "c"])
    tamper(data_dir, 0, 1, generation=generation + 1)  # the newer instance took over at 1
    result = cli("verify", "in", "--json")
    assert anomalies(result) == {"fenced_generation": 1}
    assert examples(report(result), "fenced_generation") == [
        f"offset 2: pid {pid} generation {generation} wrote after generation "
        f"{generation + 1} (from offset 1)"
    ]


def test_an_older_epoch_written_after_a_newer_one_is_reported(cli: Invoke, data_dir: Path) -> None:
    expect(cli("produce", "in", "-p", "0", input="a\nb\nc\n"), 0)
    tamper(data_dir, 0, 1, epoch=2)
    tamper(data_dir, 0, 2, epoch=1)
    result = cli("verify", "in", "--json")
    assert anomalies(result) == {"older_epoch": 1}
    assert examples(report(result), "older_epoch") == [
        "offset 2: epoch 1 after epoch 2 (from offset 1)"
    ]


# transactions --------------------------------------------------------------------------


def test_an_open_transaction_on_the_topic_is_reported_until_it_commits(cli: Invoke) -> None:
    begun = json.loads(expect(cli("txn-begin", "--group", "g", "--json"), 0).stdout)
    txn = str(begun["txn_id"])
    expect(cli("produce", "in", "--txn", txn, "-p", "1", "-v", "x", "-v", "y"), 0)
    result = cli("verify", "in", "--json")
    assert anomalies(result) == {"open_txn": 1}
    assert examples(report(result), "open_txn") == [
        f"transaction {txn} of group g is open (partition 1, 2 records)"
    ]
    text = cli("verify", "in")
    assert f"topic in:\n  open_txn: 1\n    transaction {txn} of group g" in text.stdout
    expect(cli("txn-commit", txn), 0)
    expect(cli("verify", "in"), 0)


def test_a_transaction_of_members_verifies_clean(cli: Invoke) -> None:
    """Members' records carry their pid and no sequence (the transaction orders them):
    they are judged as the transaction's, not as an idempotent producer's."""
    expect(cli("topic", "create", "o", "--partitions", "2"), 0)
    begun = json.loads(expect(cli("txn-begin", "-g", "billing", "--json"), 0).stdout)
    txn = str(begun["txn_id"])
    as_m1 = ("--txn", txn, "--member", "m1", "-p", "0")
    expect(cli("produce", "o", *as_m1, "-v", "a", "-v", "b"), 0)
    expect(cli("produce", "o", "--txn", txn, "--member", "m2", "-p", "1", "-v", "c"), 0)
    expect(cli("txn-commit", txn), 0)
    result = expect(cli("verify", "o", "--json"), 0)
    assert (report(result)["clean"], report(result)["records"]) == (True, 3)


# bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json\n", "is not a JSON object: b'not json'"),
        ("[1, 2]\n", "is not a JSON object"),
        ('{"partition": 0}\n', "needs a partition and an offset (integers >= 0)"),
        ('{"partition": 0, "offset": -1}\n', "needs a partition and an offset"),
        ('{"topic": "out", "partition": 0, "offset": 1}\n', "is an ack of topic 'out', not 'in'"),
        ('{"partition": 0, "offset": 1, "value_sha256": "xyz"}\n', "not a SHA-256 hex digest"),
    ],
)
def test_a_bad_ack_line_is_a_one_line_error(
    cli: Invoke, tmp_path: Path, content: str, message: str
) -> None:
    acks = tmp_path / "acks.ndjson"
    acks.write_text('{"partition": 0, "offset": 0}\n\n' + content)
    result = expect(cli("verify", "in", "--acks", str(acks)), int(ErrorCode.INVALID_ARGUMENT))
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: ack {acks}:3 ")
    assert message in line
    assert line.endswith("[INVALID_ARGUMENT]")


def test_missing_files_unknown_topics_and_bad_options_are_one_line_errors(
    cli: Invoke, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere.ndjson"
    result = expect(cli("verify", "in", "--acks", str(missing)), int(ErrorCode.INVALID_ARGUMENT))
    assert result.stderr == (
        f"error: cannot read ack file '{missing}': No such file or directory [INVALID_ARGUMENT]\n"
    )
    result = expect(cli("verify", "in", "--expect", str(missing), "--json"), 10)
    assert json_error(result)["message"].startswith("cannot read expected file")
    result = expect(cli("verify", "nope", "--json"), int(ErrorCode.UNKNOWN_TOPIC))
    assert json_error(result)["error"] == "UNKNOWN_TOPIC"
    result = expect(cli("verify", "in", "--by", "offset"), int(ErrorCode.INVALID_ARGUMENT))
    assert "--by 'offset' is not value or key" in result.stderr
    hexed = tmp_path / "hex.txt"
    hexed.write_text("zz\n")
    result = expect(cli("verify", "in", "--expect", str(hexed), "--format", "hex"), 10)
    assert "line 1 is not valid hex" in result.stderr
