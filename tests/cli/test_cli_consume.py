"""fencelog consume, as a user sees it: which records, in what shape, and how --follow
behaves as a real process (new records as they arrive, --max, --timeout, SIGTERM)."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

import broker
from broker.errors import ErrorCode
from broker.types import NewRecord
from support.helpers import Invoke, Processes, expect, json_error, json_lines

RECORD_FIELDS = {
    "topic",
    "partition",
    "offset",
    "timestamp_ms",
    "key",
    "value",
    "headers",
    "epoch",
}


@pytest.fixture
def filled(data_dir: Path) -> Path:
    """orders: 4 partitions; partition 0 holds p0-0..p0-4, partition 2 holds p2-0..p2-1."""
    with broker.open(data_dir, clock=lambda: 1_700_000_000_000) as engine:
        engine.create_topic("orders", partitions=4)
        engine.produce("orders", [NewRecord(f"p0-{i}".encode(), partition=0) for i in range(5)])
        engine.produce(
            "orders",
            [
                NewRecord(b"p2-0", key=b"k1", partition=2, headers=(("trace", b"abc"),)),
                NewRecord(b"p2-1", key=b"", partition=2),
            ],
        )
    return data_dir


def offsets(stdout: str) -> list[tuple[int, int]]:
    return [(r["partition"], r["offset"]) for r in json_lines(stdout)]


def test_consume_one_partition_as_json(invoke: Invoke, filled: Path) -> None:
    result = invoke("consume", "orders", "--partition", "2", "--from", "0", "--max", "10", "--json")
    first, second = json_lines(expect(result, 0).stdout)
    assert set(first) == RECORD_FIELDS
    assert first == {
        "topic": "orders",
        "partition": 2,
        "offset": 0,
        "timestamp_ms": 1_700_000_000_000,
        "key": "k1",
        "value": "p2-0",
        "headers": [["trace", "abc"]],
        "epoch": 0,
    }
    assert (second["offset"], second["key"], second["value"]) == (1, "", "p2-1")
    assert result.stderr == ""


def test_key_null_and_empty_key_are_distinct(invoke: Invoke, filled: Path) -> None:
    records = json_lines(expect(invoke("consume", "orders", "--json"), 0).stdout)
    keys = {r["value"]: r["key"] for r in records}
    assert keys["p0-0"] is None
    assert keys["p2-1"] == ""
    assert keys["p2-0"] == "k1"


def test_a_null_header_value_is_null_in_json_and_a_bare_name_in_a_template(
    invoke: Invoke, data_dir: Path
) -> None:
    with broker.open(data_dir) as engine:
        engine.create_topic("heads")
        engine.produce("heads", [NewRecord(b"v", headers=(("gone", None), ("empty", b"")))])
    (line,) = json_lines(expect(invoke("consume", "heads", "--json"), 0).stdout)
    assert line["headers"] == [["gone", None], ["empty", ""]]
    shown = expect(invoke("consume", "heads", "--format", "%h\\n"), 0).stdout
    assert shown == "gone,empty=\n"


def test_consume_all_partitions_in_partition_order(invoke: Invoke, filled: Path) -> None:
    result = expect(invoke("consume", "orders", "--json"), 0)
    assert offsets(result.stdout) == [(0, i) for i in range(5)] + [(2, 0), (2, 1)]


def test_several_partitions(invoke: Invoke, filled: Path) -> None:
    result = expect(invoke("consume", "orders", "-p", "2", "-p", "1", "--json"), 0)
    assert offsets(result.stdout) == [(2, 0), (2, 1)]


def test_from_an_offset_applies_to_each_partition(invoke: Invoke, filled: Path) -> None:
    result = expect(invoke("consume", "orders", "--from", "3", "--json"), 0)
    assert offsets(result.stdout) == [(0, 3), (0, 4)]
    one = expect(invoke("consume", "orders", "-p", "2", "--from", "1", "--json"), 0)
    assert [r["value"] for r in json_lines(one.stdout)] == ["p2-1"]


def test_from_end_prints_nothing(invoke: Invoke, filled: Path) -> None:
    result = expect(invoke("consume", "orders", "--from", "end"), 0)
    assert result.stdout == ""
    assert result.stderr == ""


def test_from_beginning_is_the_default(invoke: Invoke, filled: Path) -> None:
    explicit = expect(invoke("consume", "orders", "--from", "beginning", "--json"), 0).stdout
    assert explicit == expect(invoke("consume", "orders", "--json"), 0).stdout
    assert len(json_lines(explicit)) == 7


def test_from_past_the_end_prints_nothing(invoke: Invoke, filled: Path) -> None:
    assert expect(invoke("consume", "orders", "--from", "99"), 0).stdout == ""


def test_max_zero_prints_nothing(invoke: Invoke, filled: Path) -> None:
    assert expect(invoke("consume", "orders", "--max", "0"), 0).stdout == ""


def test_max_stops_after_n_records(invoke: Invoke, filled: Path) -> None:
    result = expect(invoke("consume", "orders", "--max", "2", "--json"), 0)
    assert offsets(result.stdout) == [(0, 0), (0, 1)]
    across = expect(invoke("consume", "orders", "--from", "4", "-n", "2", "--json"), 0)
    assert offsets(across.stdout) == [(0, 4)]


def test_plain_output_is_tab_separated_without_escapes(invoke: Invoke, filled: Path) -> None:
    result = expect(invoke("consume", "orders", "-p", "2"), 0)
    assert result.stdout == "2\t0\tk1\tp2-0\n2\t1\t\tp2-1\n"
    assert "\x1b" not in result.stdout + result.stderr


def test_no_color_keeps_output_plain(invoke: Invoke, filled: Path) -> None:
    result = expect(invoke("consume", "orders", "-p", "2", env={"NO_COLOR": "1"}), 0)
    assert result.stdout == "2\t0\tk1\tp2-0\n2\t1\t\tp2-1\n"


# bytes that are not text --------------------------------------------------------------


@pytest.fixture
def binary(data_dir: Path) -> Path:
    with broker.open(data_dir) as engine:
        engine.create_topic("bin")
        engine.produce(
            "bin",
            [
                NewRecord(b"\x00\xff\n", key=b"\xfe", headers=(("h", b"\x80"),)),
                NewRecord(b"plain"),
            ],
        )
    return data_dir


def test_tab_separated_lines_keep_a_record_a_line(invoke: Invoke, data_dir: Path) -> None:
    """A value with a line break printed as two lines and a tab as a fifth field, so
    `consume | cut -f4` (README's pipeline) split or cut it; they are shown escaped."""
    with broker.open(data_dir) as engine:
        engine.create_topic("lines")
        engine.produce("lines", [NewRecord(b"one\ntwo", key=b"k\tk"), NewRecord(b"a\tb\r")])
        engine.produce("lines", [NewRecord(b"plain")])
    result = expect(invoke("consume", "lines"), 0)
    assert result.stdout.splitlines() == [
        "0\t0\tk\\tk\tone\\ntwo",
        "0\t1\t\ta\\tb\\r",
        "0\t2\t\tplain",
    ]
    assert result.stderr.startswith("warning: 3 fields held tabs or line breaks")
    exact = json_lines(expect(invoke("consume", "lines", "--json"), 0).stdout)
    assert [r["value"] for r in exact] == ["one\ntwo", "a\tb\r", "plain"]


def test_text_mode_shows_replacement_characters_and_warns(invoke: Invoke, binary: Path) -> None:
    result = expect(invoke("consume", "bin", "--json"), 0)
    first, second = json_lines(result.stdout)
    assert first["value"] == "\x00\ufffd\n"
    assert first["key"] == "\ufffd"
    assert second["value"] == "plain"
    # with --json, the warning is a JSON object on stderr, as errors are (it was text)
    [warning] = json_lines(result.stderr)
    assert "U+FFFD" in warning["warning"]
    assert "--format base64" in warning["warning"]
    plain = expect(invoke("consume", "bin"), 0)
    assert plain.stderr.startswith("warning: ") and "U+FFFD" in plain.stderr


def test_text_mode_warning_on_plain_output(invoke: Invoke, binary: Path) -> None:
    result = expect(invoke("consume", "bin"), 0)
    assert "\ufffd" in result.stdout
    assert "--format base64" in result.stderr


def test_base64_shows_exact_bytes_without_warning(invoke: Invoke, binary: Path) -> None:
    result = expect(invoke("consume", "bin", "--format", "base64", "--json"), 0)
    first, _ = json_lines(result.stdout)
    assert base64.b64decode(first["value"]) == b"\x00\xff\n"
    assert base64.b64decode(first["key"]) == b"\xfe"
    assert [[n, base64.b64decode(v)] for n, v in first["headers"]] == [["h", b"\x80"]]
    assert result.stderr == ""


def test_hex_shows_exact_bytes(invoke: Invoke, binary: Path) -> None:
    result = expect(invoke("consume", "bin", "--format", "hex"), 0)
    assert result.stdout.splitlines() == ["0\t0\tfe\t00ff0a", "0\t1\t\t706c61696e"]
    assert result.stderr == ""


# refusals -----------------------------------------------------------------------------


def test_unknown_topic_exits_20(invoke: Invoke, filled: Path) -> None:
    result = expect(invoke("consume", "nope"), ErrorCode.UNKNOWN_TOPIC)
    assert result.stdout == ""
    assert result.stderr.startswith("error: topic nope does not exist")
    assert json_error(invoke("consume", "nope", "--json"))["error"] == "UNKNOWN_TOPIC"


@pytest.mark.parametrize("partition", ["4", "-1"])
def test_partition_out_of_range_exits_21(invoke: Invoke, filled: Path, partition: str) -> None:
    result = expect(invoke("consume", "orders", "--partition", partition), 21)
    assert result.stdout == ""
    assert f"no partition {partition}" in result.stderr
    error = json_error(invoke("consume", "orders", "-p", partition, "--json"))
    assert error["error"] == "UNKNOWN_PARTITION"


@pytest.mark.parametrize(
    "where",
    ["-x", "abc", "1.5", "", "start", "\u00b2", "-\u00b2", "--1", "@yesterday", "@-5x"],
    ids=[
        "minus-word",
        "word",
        "fraction",
        "empty",
        "start",
        "superscript-two",
        "minus-superscript",
        "double-minus",
        "time-word",
        "time-bad-duration",
    ],
)
def test_bad_from_exits_10(invoke: Invoke, filled: Path, where: str) -> None:
    result = expect(invoke("consume", "orders", "--from", where), ErrorCode.INVALID_ARGUMENT)
    assert result.stdout == ""
    assert "--from" in result.stderr
    error = json_error(invoke("consume", "orders", "--from", where, "--json"))
    assert error["error"] == "INVALID_ARGUMENT"


@pytest.mark.parametrize("duration", ["5x", "-1s", "", "soon", "1,5s"])
def test_bad_timeout_duration_exits_10(invoke: Invoke, filled: Path, duration: str) -> None:
    result = expect(invoke("consume", "orders", "--follow", "--timeout", duration), 10)
    assert "is not a duration" in result.stderr
    assert result.stdout == ""
    error = json_error(invoke("consume", "orders", "-F", "--timeout", duration, "--json"))
    assert error["error"] == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    "args",
    [
        ["consume"],
        ["consume", "orders", "--max", "-1"],
        ["consume", "orders", "--max", "lots"],
        ["consume", "orders", "--partition", "x"],
        ["consume", "orders", "--format", "utf16"],
    ],
    ids=["missing-topic", "negative-max", "max-not-a-number", "partition-not-a-number", "format"],
)
def test_usage_errors_exit_2(invoke: Invoke, filled: Path, args: list[str]) -> None:
    result = expect(invoke(*args), 2)
    assert result.stdout == ""
    assert "Usage:" in result.stderr


# --follow, as a real process ----------------------------------------------------------


def test_follow_prints_records_as_they_arrive_and_stops_on_sigterm(
    processes: Processes, data_dir: Path
) -> None:
    with broker.open(data_dir) as engine:
        engine.create_topic("orders", partitions=2)
    consumer = processes.fencelog(
        "--broker", data_dir, "consume", "orders", "--follow", "--json", "--timeout", "5s"
    )
    # pacing, not synchronisation: most likely the records come while it follows (not
    # before it started), but what follows does not depend on it
    time.sleep(0.3)
    with broker.open(data_dir) as engine:
        engine.produce("orders", [NewRecord(b"first", key=b"k", partition=1)])
        # A record must reach a pipe while the consumer is still following, well before
        # its 5 s idle timeout would end it (and flush whatever it buffered).
        first = json.loads(consumer.line(timeout_s=3.0))
        assert consumer.popen.poll() is None, "consume --follow ended after one record"
        assert {k: first[k] for k in ("topic", "partition", "offset", "key", "value")} == {
            "topic": "orders",
            "partition": 1,
            "offset": 0,
            "key": "k",
            "value": "first",
        }
        engine.produce("orders", [NewRecord(b"second", partition=0)])
        second = json.loads(consumer.line(timeout_s=3.0))
        assert (second["partition"], second["offset"], second["value"]) == (0, 0, "second")

    consumer.signal(signal.SIGTERM)
    assert consumer.wait(timeout_s=4.0) == 0, consumer.stderr_text()  # at once, not at 5 s
    assert consumer.remaining_lines() == []


def test_follow_with_max_exits_by_itself(processes: Processes, data_dir: Path) -> None:
    with broker.open(data_dir) as engine:
        engine.create_topic("orders")
    consumer = processes.fencelog(
        "--broker", data_dir, "consume", "orders", "--follow", "--max", "2", "--json",
        "--timeout", "20s",
    )  # fmt: skip
    time.sleep(0.3)  # pacing, as above: the records most likely come while it follows
    with broker.open(data_dir) as engine:
        engine.produce("orders", [NewRecord(b"one")])
        engine.produce("orders", [NewRecord(b"two"), NewRecord(b"three")])
    # well before the 20 s idle timeout: it is --max that ends it
    assert consumer.wait(timeout_s=8.0) == 0, consumer.stderr_text()
    lines = consumer.remaining_lines()
    assert [json.loads(line)["value"] for line in lines] == ["one", "two"]


def test_follow_timeout_exits_after_no_records(processes: Processes, data_dir: Path) -> None:
    with broker.open(data_dir) as engine:
        engine.create_topic("orders")
    consumer = processes.fencelog(
        "--broker", data_dir, "consume", "orders", "--follow", "--timeout", "1s"
    )
    assert consumer.wait(timeout_s=10.0) == 0, consumer.stderr_text()
    assert consumer.remaining_lines() == []
    assert consumer.stderr_text() == ""


def test_output_that_cannot_be_written_is_one_line_and_a_closed_pipe_no_failure(
    data_dir: Path,
) -> None:
    """`consume > /dev/full` ended in a Python traceback (exit 1, "a bug"), and
    `consume | head -1` in exit 1 with no word: the handler of a closed pipe came after
    the one of every other exception, and never ran."""
    with broker.open(data_dir) as engine:
        engine.create_topic("many")
        engine.produce("many", [NewRecord(b"v%d" % i) for i in range(5000)])
    command = ["fencelog", "--broker", str(data_dir), "consume", "many"]
    with open("/dev/full", "w") as full:
        refused = subprocess.run(
            command, check=False, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60
        )
    assert refused.returncode == int(ErrorCode.STORAGE_FAILED)
    assert (
        refused.stderr
        == "error: cannot write the output: No space left on device [STORAGE_FAILED]\n"
    )
    reader = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert reader.stdout is not None
        reader.stdout.readline()
        reader.stdout.close()  # as `head -1` does once it has its line
        assert reader.wait(timeout=60) == 0
        assert reader.stderr is not None and reader.stderr.read() == b""
    finally:
        reader.kill()
        reader.wait(timeout=10)
        if reader.stderr is not None:
            reader.stderr.close()
