"""`fencelog topic create/alter/clean` with retention and compaction, and `serve`
cleaning in the background, as a user runs them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from broker.client.client import connect
from broker.errors import ErrorCode
from broker.types import NewRecord, TopicConfig
from support.helpers import Invoke, expect
from support.servers import serving
from support.waiting import wait_until


def test_create_alter_describe_and_clean(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "events", "-p", "2", "--retention", "7d",
                  "--retention-bytes", "1GiB"), 0)  # fmt: skip
    described = json.loads(expect(invoke("topic", "describe", "events", "--json"), 0).stdout)
    assert described["config"] == {
        "retention_ms": 7 * 24 * 3600 * 1000,
        "retention_bytes": 1 << 30,
        "cleanup": "delete",
    }
    altered = expect(invoke("topic", "alter", "events", "--retention", "none", "-p", "3"), 0)
    assert altered.stdout.strip() == (
        "topic events: 3 partitions, cleanup delete, at most 1073741824 bytes per partition"
    )
    day = expect(invoke("topic", "alter", "events", "--retention", "1d"), 0)
    assert "retention 1d," in day.stdout  # as given, not 86400000 ms
    ninety = expect(invoke("topic", "alter", "events", "--retention", "90s"), 0)
    assert "retention 90s," in ninety.stdout
    expect(invoke("topic", "create", "state", "--cleanup", "compact"), 0)
    expect(invoke("produce", "state", "-K", "=", input="a=1\nb=2\na=3\n"), 0)
    cleaned = json.loads(expect(invoke("topic", "clean", "state", "--json"), 0).stdout)
    assert cleaned["deleted"] == 1
    consumed = expect(invoke("consume", "state"), 0).stdout.splitlines()
    assert consumed == ["0\t1\tb\t2", "0\t2\ta\t3"]
    compacted = expect(invoke("consume", "state", "--compacted"), 0).stdout.splitlines()
    assert compacted == consumed


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (("topic", "create", "t", "--retention", "soon"), "'soon' is not a duration"),
        (("topic", "create", "t", "--retention-bytes", "lots"), "'lots' is not a size"),
        (("topic", "create", "t", "--cleanup", "tidy"), "cleanup is one of delete, compact"),
        (("topic", "alter", "events", "-p", "1"), "partitions are never removed"),
        (("topic", "alter", "events"), "nothing to alter"),
        (("produce", "state", "--value", "no key"), "every record needs a key"),
    ],
)
def test_bad_retention_input_is_one_line_and_changes_nothing(
    invoke: Invoke, args: tuple[str, ...], complaint: str
) -> None:
    expect(invoke("topic", "create", "events", "-p", "2"), 0)
    expect(invoke("topic", "create", "state", "--cleanup", "compact"), 0)
    before = expect(invoke("topic", "list", "--json"), 0).stdout
    refused = expect(invoke(*args), int(ErrorCode.INVALID_ARGUMENT))
    assert complaint in refused.stderr and refused.stderr.count("\n") == 1
    assert expect(invoke("topic", "list", "--json"), 0).stdout == before


def test_serve_cleans_in_the_background(tmp_path: Path) -> None:
    args = ("--no-unix", "--clean-interval", "200ms")
    with (
        serving(tmp_path / "data", tmp_path / "ready.json", serve_args=args) as server,
        connect(server.address) as client,
    ):
        client.create_topic("events")
        old = int(time.time() * 1000) - 10_000
        client.produce("events", [NewRecord(b"old", None, (), 0, old) for _ in range(5)])
        client.produce("events", [b"new"])
        client.alter_topic("events", config=TopicConfig(retention_ms=5_000))

        def cleaned() -> bool:
            return client.describe_topic("events").partition_details[0].start_offset == 5

        wait_until(cleaned, 15.0, message="the server cleaned the old records")
        values = [r.value for r in client.consume("events", partition=0, start="beginning")]
        assert values == [b"new"]


def test_describe_shows_each_groups_committed_offset_and_lag(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "orders", "-p", "2"), 0)
    expect(invoke("produce", "orders", "-p", "1", "--value", "a", "--value", "b"), 0)
    expect(invoke("consume", "orders", "--group", "billing", "-p", "1", "--max", "1"), 0)
    described = json.loads(expect(invoke("topic", "describe", "orders", "--json"), 0).stdout)
    assert described["groups"] == [
        {"group": "billing", "partition": 1, "committed_offset": 1, "lag": 1}
    ]


def test_a_read_below_the_log_start_is_offset_out_of_range(invoke: Invoke, data_dir: Path) -> None:
    old = int(time.time() * 1000) - 7_200_000
    with connect(data_dir) as client:
        client.create_topic("events", config=TopicConfig(retention_ms=3_600_000))
        client.produce("events", [NewRecord(b"old", None, (), 0, old) for _ in range(3)])
        client.produce("events", [b"new"])
    assert (
        json.loads(expect(invoke("topic", "clean", "events", "--json"), 0).stdout)["deleted"] == 3
    )
    refused = expect(invoke("consume", "events", "--from", "1"), int(ErrorCode.OFFSET_OUT_OF_RANGE))
    assert "below the log start offset 3" in refused.stderr
    assert refused.stderr.count("\n") == 1
    assert expect(invoke("consume", "events"), 0).stdout == "0\t3\t\tnew\n"


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (("serve", "--log-format", "xml"), "--log-format 'xml' is not one of text, json"),
        (("serve", "--clean-interval", "0s"), "--clean-interval must be positive"),
        (("serve", "--kafka-idle-timeout", "0s"), "--kafka-idle-timeout must be positive"),
        (("serve", "--http-listen", "nowhere"), "--http-listen 'nowhere' is not HOST:PORT"),
        (("wait-ready", "--timeout", "0s"), "--timeout must be positive"),
        (("--request-timeout", "0s", "topic", "list"), "--request-timeout must be positive"),
        (("--broker", "", "topic", "create", "t"), "--broker is empty"),
        (("topic", "create", "t", "--retention-bytes", "1" + "0" * 22), "past the largest size"),
        (("topic", "create", "t", "--retention", "9999999999999d"), "past the longest duration"),
        (("lease-pid", "t", "0", "--pid", "9" * 20), "producer ids are 1..2^63-1"),
        (("serve", "--ready-file", "/nonexistent/r.json"), "its directory does not exist"),
    ],
)
def test_bad_operator_options_are_one_line_errors(
    invoke: Invoke, args: tuple[str, ...], complaint: str
) -> None:
    refused = expect(invoke(*args), int(ErrorCode.INVALID_ARGUMENT))
    assert complaint in refused.stderr and refused.stderr.count("\n") == 1
