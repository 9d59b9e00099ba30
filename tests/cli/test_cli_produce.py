"""fencelog produce, as a user sees it: where records land, what is stored (read back with
consume or straight from SQLite), and how bad input is refused without storing anything."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import broker
from broker.errors import ErrorCode
from support.helpers import Invoke, expect, json_error, json_lines, stored_rows
from support.values import present

MIB = 1024 * 1024
ENCODERS: dict[str, Callable[[bytes], str]] = {
    "base64": lambda data: base64.b64encode(data).decode("ascii"),
    "hex": bytes.hex,
}
AWKWARD_VALUES = [b"\x00\xff\n", b"", bytes(range(256)), b"tab\there\r\n", "\u00e9".encode()]


@pytest.fixture
def orders(invoke: Invoke) -> Invoke:
    expect(invoke("topic", "create", "orders", "--partitions", "4"), 0)
    return invoke


def read_all(data_dir: Path, topic: str = "orders") -> list[broker.Record]:
    with broker.open(data_dir) as engine:
        partitions = engine.describe_topic(topic).partitions
        return [r for p in range(partitions) for r in engine.read(topic, p, 0)]


def test_stdin_lines_with_one_key_share_a_partition(orders: Invoke, data_dir: Path) -> None:
    result = expect(orders("produce", "orders", "--key", "k1", "--json", input="a\nb\nc\n"), 0)
    landed = json_lines(result.stdout)
    assert [r["topic"] for r in landed] == ["orders"] * 3
    assert len({r["partition"] for r in landed}) == 1
    assert [r["offset"] for r in landed] == [0, 1, 2]
    stored = read_all(data_dir)
    assert [(r.key, r.value, r.offset) for r in stored] == [
        (b"k1", b"a", 0),
        (b"k1", b"b", 1),
        (b"k1", b"c", 2),
    ]


def test_plain_output_summarises_where_records_went(orders: Invoke) -> None:
    result = expect(orders("produce", "orders", "--key", "k1", input="a\nb\nc\n"), 0)
    partition = json_lines(expect(orders("consume", "orders", "--json"), 0).stdout)[0]["partition"]
    assert result.stdout == f"produced 3 records to orders: partition {partition} offsets 0-2\n"
    one = expect(orders("produce", "orders", "-p", "0", "-v", "x"), 0)
    assert one.stdout == "produced 1 record to orders: partition 0 offset 0\n"


def test_value_partition_and_header(orders: Invoke) -> None:
    result = orders(
        "produce",
        "orders",
        "--partition",
        "2",
        "--value",
        "hello",
        "--header",
        "trace=abc",
        "--json",
    )
    assert json_lines(expect(result, 0).stdout) == [
        {
            "topic": "orders",
            "partition": 2,
            "offset": 0,
            "value_sha256": hashlib.sha256(b"hello").hexdigest(),
        }
    ]
    [record] = json_lines(expect(orders("consume", "orders", "--json"), 0).stdout)
    assert (record["partition"], record["value"], record["key"]) == (2, "hello", None)
    assert record["headers"] == [["trace", "abc"]]


def test_repeated_values_and_headers_keep_their_order(orders: Invoke, data_dir: Path) -> None:
    result = orders(
        "produce", "orders", "-p", "1", "-v", "one", "-v", "two", "-v", "three",
        "-H", "a=1", "-H", "b=", "-H", "a=x=y", "--json",
    )  # fmt: skip
    assert [r["offset"] for r in json_lines(expect(result, 0).stdout)] == [0, 1, 2]
    stored = read_all(data_dir)
    assert [r.value for r in stored] == [b"one", b"two", b"three"]
    assert {r.headers for r in stored} == {(("a", b"1"), ("b", b""), ("a", b"x=y"))}


def test_records_without_key_go_round_robin(orders: Invoke) -> None:
    values = [arg for i in range(8) for arg in ("-v", str(i))]
    landed = json_lines(expect(orders("produce", "orders", *values, "--json"), 0).stdout)
    per_partition = [sum(1 for r in landed if r["partition"] == p) for p in range(4)]
    assert per_partition == [2, 2, 2, 2]


def test_last_stdin_line_needs_no_newline(orders: Invoke, data_dir: Path) -> None:
    expect(orders("produce", "orders", "-p", "0", input="a\n\nlast"), 0)
    assert [r.value for r in read_all(data_dir)] == [b"a", b"", b"last"]


def test_a_refused_line_is_named_and_what_landed_before_it_is_said(
    orders: Invoke, data_dir: Path
) -> None:
    """stdin is appended batch by batch, so lines before a refused one may have landed:
    the error names the refused line by its number in the input, and the summary says
    what landed (a rerun of the whole input would repeat those)."""
    big = "a" * (broker.limits.DEFAULT_LIMITS.record_value_bytes_max + 1)
    lines = "".join(f"{i}\n" for i in range(1, 101)) + big + "\n"
    result = expect(orders("produce", "orders", "-p", "0", input=lines), ErrorCode.RECORD_TOO_LARGE)
    landed = len(read_all(data_dir))
    assert "line 101: value is" in result.stderr
    assert result.stderr.count("\n") == 1
    if landed:
        assert f"produced {landed} records to orders" in result.stdout
    else:
        assert result.stdout == ""
    assert [r.value for r in read_all(data_dir)] == [b"%d" % i for i in range(1, landed + 1)]


def test_key_separator_splits_each_line(orders: Invoke, data_dir: Path) -> None:
    result = orders(
        "produce", "orders", "--key-separator", ":", "--json", input="k1:v1\nk2:v:2\nk1:v3\n"
    )
    landed = json_lines(expect(result, 0).stdout)
    assert landed[0]["partition"] == landed[2]["partition"]
    stored = {(r.key, r.value) for r in read_all(data_dir)}
    assert stored == {(b"k1", b"v1"), (b"k2", b"v:2"), (b"k1", b"v3")}


def test_line_without_key_separator_exits_10(orders: Invoke, data_dir: Path) -> None:
    before = stored_rows(data_dir)
    result = expect(
        orders("produce", "orders", "--key-separator", ":", input="k:v\nno separator\n"),
        ErrorCode.INVALID_ARGUMENT,
    )
    # named by its input line, as every refused line is (it showed the line's bytes only)
    assert "error: line 2: no key separator ':' in b'no separator'" in result.stderr
    assert stored_rows(data_dir) == before
    bad_hex = expect(
        orders("produce", "orders", "--format", "hex", input="6869\nzz\n"),
        ErrorCode.INVALID_ARGUMENT,
    )
    assert "error: line 2: value is not valid hex" in bad_hex.stderr


def test_empty_key_is_stored_as_an_empty_key(orders: Invoke, data_dir: Path) -> None:
    # The log keeps None and b"" apart (consume shows null and ""); an empty --key is
    # the empty key, as an empty key before --key-separator already is.
    expect(orders("produce", "orders", "-p", "0", "--key-separator", ":", input=":x\n"), 0)
    expect(orders("produce", "orders", "-p", "0", "--key", "", "--value", "y"), 0)
    expect(orders("produce", "orders", "-p", "0", "--format", "hex", "--key", "", "-v", "7a"), 0)
    assert [(r.key, r.value) for r in read_all(data_dir)] == [(b"", b"x"), (b"", b"y"), (b"", b"z")]
    shown = json_lines(expect(orders("consume", "orders", "--json"), 0).stdout)
    assert [r["key"] for r in shown] == ["", "", ""]


def test_key_and_key_separator_exclude_each_other(orders: Invoke) -> None:
    result = expect(
        orders("produce", "orders", "--key", "k", "--key-separator", ":", input="a:b\n"), 10
    )
    assert "--key and --key-separator" in result.stderr


# binary-safe formats ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["base64", "hex"])
def test_format_round_trips_arbitrary_bytes_from_values(
    orders: Invoke, data_dir: Path, fmt: str
) -> None:
    encode = ENCODERS[fmt]
    args = [a for value in AWKWARD_VALUES for a in ("--value", encode(value))]
    key = b"\x00k\xff"
    expect(orders("produce", "orders", "-p", "3", "--format", fmt, "--key", encode(key), *args), 0)
    # stored exactly
    stored = read_all(data_dir)
    assert [(r.key, r.value) for r in stored] == [(key, v) for v in AWKWARD_VALUES]
    # and shown exactly
    shown = json_lines(expect(orders("consume", "orders", "--format", fmt, "--json"), 0).stdout)
    assert [(r["key"], r["value"]) for r in shown] == [
        (encode(key), encode(v)) for v in AWKWARD_VALUES
    ]


@pytest.mark.parametrize("fmt", ["base64", "hex"])
def test_format_round_trips_arbitrary_bytes_from_stdin(
    orders: Invoke, data_dir: Path, fmt: str
) -> None:
    encode = ENCODERS[fmt]
    lines = "".join(
        f"{encode(b'key-' + bytes([i]))}|{encode(v)}\n" for i, v in enumerate(AWKWARD_VALUES)
    )
    expect(orders("produce", "orders", "--format", fmt, "--key-separator", "|", input=lines), 0)
    stored = {(r.key, r.value) for r in read_all(data_dir)}
    assert stored == {(b"key-" + bytes([i]), v) for i, v in enumerate(AWKWARD_VALUES)}
    plain = expect(orders("consume", "orders", "--format", fmt), 0).stdout
    shown = {tuple(line.split("\t")[2:]) for line in plain.splitlines()}
    assert shown == {(encode(k), encode(present(v))) for k, v in stored if k is not None}


@pytest.mark.parametrize(
    ("fmt", "bad"),
    [("hex", "zz"), ("hex", "abc"), ("base64", "!!!!"), ("base64", "abc"), ("hex", "\u00e9e9")],
    ids=["hex-letters", "hex-odd-length", "base64-symbols", "base64-padding", "hex-non-ascii"],
)
def test_bad_format_data_exits_10(orders: Invoke, data_dir: Path, fmt: str, bad: str) -> None:
    before = stored_rows(data_dir)
    result = expect(orders("produce", "orders", "--format", fmt, "--value", bad), 10)
    assert f"not valid {fmt}" in result.stderr
    stdin_result = expect(orders("produce", "orders", "--format", fmt, input=f"{bad}\n"), 10)
    assert f"not valid {fmt}" in stdin_result.stderr
    key_result = expect(orders("produce", "orders", "--format", fmt, "-k", bad, "-v", "00"), 10)
    assert "--key" in key_result.stderr
    assert stored_rows(data_dir) == before


# sizes --------------------------------------------------------------------------------


def test_value_of_exactly_one_mebibyte_is_accepted(orders: Invoke, data_dir: Path) -> None:
    expect(orders("produce", "orders", "-p", "0", "--format", "hex", "--value", "ab" * MIB), 0)
    [record] = read_all(data_dir)
    assert record.value == b"\xab" * MIB


def test_value_over_one_mebibyte_from_hex_value_exits_11(orders: Invoke, data_dir: Path) -> None:
    before = stored_rows(data_dir)
    too_big = "ab" * (MIB + 1)
    result = expect(orders("produce", "orders", "--format", "hex", "--value", too_big), 11)
    assert result.stdout == ""
    assert f"{MIB + 1} bytes" in result.stderr
    assert f"limit is {MIB}" in result.stderr
    error = json_error(orders("produce", "orders", "--format", "hex", "-v", too_big, "--json"))
    assert error["error"] == "RECORD_TOO_LARGE"
    assert stored_rows(data_dir) == before


def test_value_over_one_mebibyte_from_stdin_exits_11(orders: Invoke, data_dir: Path) -> None:
    before = stored_rows(data_dir)
    result = expect(orders("produce", "orders", input=b"x" * (MIB + 1) + b"\n"), 11)
    assert "[RECORD_TOO_LARGE]" in result.stderr
    assert stored_rows(data_dir) == before


# refusals -----------------------------------------------------------------------------


def test_unknown_topic_exits_20(invoke: Invoke) -> None:
    result = expect(invoke("produce", "nope", "--value", "x"), ErrorCode.UNKNOWN_TOPIC)
    assert result.stdout == ""
    assert "topic nope does not exist" in result.stderr
    error = json_error(expect(invoke("produce", "nope", "-v", "x", "--json"), 20))
    assert error["error"] == "UNKNOWN_TOPIC"
    assert error["hint"] == "create it with: fencelog topic create nope"


@pytest.mark.parametrize("partition", ["4", "-1"])
def test_partition_out_of_range_exits_21(orders: Invoke, partition: str) -> None:
    result = expect(orders("produce", "orders", "--partition", partition, "--value", "x"), 21)
    assert "partitions 0..3" in result.stderr
    error = json_error(orders("produce", "orders", "-p", partition, "-v", "x", "--json"))
    assert error["error"] == "UNKNOWN_PARTITION"


@pytest.mark.parametrize("header", ["novalue", "=value", ""])
def test_bad_header_exits_10(orders: Invoke, header: str) -> None:
    result = expect(orders("produce", "orders", "--header", header, "--value", "x"), 10)
    assert "NAME=VALUE" in result.stderr
    error = json_error(orders("produce", "orders", "-H", header, "-v", "x", "--json"))
    assert error["error"] == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (["produce", "nope", "-v", "x"], None),
        (["produce", "orders", "-p", "9", "-v", "x"], None),
        (["produce", "orders", "-p", "9"], "a\nb\n"),
        (["produce", "orders", "-H", "bad", "-v", "x"], None),
        (["produce", "orders", "--format", "hex", "-v", "00", "-v", "zz"], None),
        (["produce", "orders", "--format", "base64"], "!!\nAAAA\n"),
        (
            ["produce", "orders", "-p", "1", "--format", "hex", "-v", "00", "-v", "ab" * (MIB + 1)],
            None,
        ),
        (["produce", "orders", "--key-separator", "="], "no separator\nk=v\n"),
    ],
    ids=[
        "unknown-topic",
        "bad-partition",
        "bad-partition-stdin",
        "bad-header",
        "bad-hex-in-batch",
        "bad-base64-stdin",
        "too-large-in-batch",
        "missing-separator",
    ],
)
def test_failed_produce_stores_nothing(
    orders: Invoke, data_dir: Path, args: list[str], stdin: str | None
) -> None:
    # stdin is appended batch by batch as lines arrive, so each bad line here comes
    # first: the failing batch is then the first one and nothing may be stored.
    expect(orders("produce", "orders", "-p", "1", "-v", "kept", "-H", "h=1"), 0)
    before = stored_rows(data_dir)
    result = orders(*args, input=stdin)
    assert result.exit_code >= 10, result.stderr
    assert result.stdout == ""
    assert stored_rows(data_dir) == before
    assert [r.value for r in read_all(data_dir)] == [b"kept"]


@pytest.mark.parametrize(
    "args",
    [
        ["produce"],
        ["produce", "orders", "--partition", "two", "-v", "x"],
        ["produce", "orders", "--format", "rot13", "-v", "x"],
        ["produce", "orders", "--no-such-option"],
        ["--durability", "sometimes", "produce", "orders", "-v", "x"],
    ],
    ids=[
        "missing-topic",
        "partition-not-a-number",
        "unknown-format",
        "unknown-option",
        "durability",
    ],
)
def test_usage_errors_exit_2(orders: Invoke, data_dir: Path, args: list[str]) -> None:
    before = stored_rows(data_dir)
    result = expect(orders(*args), 2)
    assert "Usage:" in result.stderr
    assert stored_rows(data_dir) == before


# --arrow: the rows of an Arrow or Parquet file -----------------------------------------

ROWS: dict[str, list[Any]] = {
    "value": [f"v{i}" for i in range(6)],
    "key": ["a", None, "b", None, "a", None],
    "partition": [None, 0, None, 3, None, 2],
}


def arrow_files(tmp_path: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.ipc as pa_ipc
    import pyarrow.parquet as pq

    table = pa.table(ROWS)
    paths = {kind: tmp_path / f"rows.{kind}" for kind in ("parquet", "arrow", "stream")}
    pq.write_table(table, paths["parquet"])
    with pa_ipc.new_file(paths["arrow"], table.schema) as writer:
        writer.write_table(table)
    with pa_ipc.new_stream(paths["stream"], table.schema) as writer:
        writer.write_table(table)
    return paths


@pytest.mark.parametrize("kind", ["parquet", "arrow", "stream", "stdin"])
def test_arrow_appends_a_files_rows_with_their_keys_and_partitions(
    orders: Invoke, data_dir: Path, tmp_path: Path, kind: str
) -> None:
    paths = arrow_files(tmp_path)
    if kind == "stdin":
        result = orders(
            "produce", "orders", "--arrow", "-", "--json", input=paths["stream"].read_bytes()
        )
    else:
        result = orders("produce", "orders", "--arrow", str(paths[kind]), "--json")
    landed = json_lines(expect(result, 0).stdout)
    values = [v.encode() for v in ROWS["value"]]
    assert [r["value_sha256"] for r in landed] == [hashlib.sha256(v).hexdigest() for v in values]
    stored = {r.value: (r.partition, r.key) for r in read_all(data_dir)}
    assert stored[b"v1"] == (0, None) and stored[b"v3"] == (3, None) and stored[b"v5"] == (2, None)
    assert stored[b"v0"][1] == b"a" and stored[b"v4"] == stored[b"v0"]  # one key, one partition
    assert {(r["partition"], r["offset"]) for r in landed} == {
        (partition, offset)
        for partition, offset in ((r.partition, r.offset) for r in read_all(data_dir))
    }


def test_arrow_into_a_transaction_lands_at_commit(
    orders: Invoke, data_dir: Path, tmp_path: Path
) -> None:
    paths = arrow_files(tmp_path)
    begun = json_lines(expect(orders("txn-begin", "--group", "g", "--json"), 0).stdout)[0]
    txn = str(begun["txn_id"])
    result = expect(orders("produce", "orders", "--arrow", str(paths["arrow"]), "--txn", txn), 0)
    assert result.stdout.startswith("journaled 6 records to orders (partitions ")
    assert read_all(data_dir) == []
    expect(orders("txn-commit", txn), 0)
    assert sorted(present(r.value) for r in read_all(data_dir)) == [
        v.encode() for v in ROWS["value"]
    ]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"not arrow at all", "as Parquet, an Arrow IPC file or an IPC stream"),
        (None, "cannot read"),
    ],
)
def test_arrow_refuses_a_file_it_cannot_read_and_stores_nothing(
    orders: Invoke, data_dir: Path, tmp_path: Path, content: bytes | None, said: str
) -> None:
    path = tmp_path / "rows.bin"
    if content is not None:
        path.write_bytes(content)
    result = expect(orders("produce", "orders", "--arrow", str(path)), 10)
    assert said in result.stderr
    assert read_all(data_dir) == []


def test_arrow_refuses_other_columns_and_record_options(
    orders: Invoke, data_dir: Path, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "topic.parquet"
    pq.write_table(pa.table({"value": [b"a"], "topic": ["x"]}), path)
    result = expect(orders("produce", "orders", "--arrow", str(path)), 10)
    assert "it has 'topic'" in result.stderr
    result = expect(orders("produce", "orders", "--arrow", str(path), "--key", "k", "-p", "1"), 10)
    assert "--arrow does not combine with --key, --partition" in result.stderr
    result = expect(orders("produce", "orders", "--arrow", str(path), "--format", "hex"), 10)
    assert "--arrow does not combine with --format" in result.stderr
    result = expect(orders("produce", "orders", "--arrow", str(path), "--generation", "1"), 10)
    assert "--arrow does not combine with --generation" in result.stderr
    assert read_all(data_dir) == []


def test_arrow_cuts_a_large_batch_into_appends_and_a_bad_one_stops_it(
    orders: Invoke, data_dir: Path, tmp_path: Path
) -> None:
    """A batch of the file larger than one append is cut as stdin's lines are: every
    append that landed is reported, then the refused one stops the command."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    count = 25_000  # three appends of at most 10,000; the last names a missing partition
    partitions = [0] * 20_000 + [99] * 5_000
    path = tmp_path / "big.parquet"
    pq.write_table(
        pa.table({"value": [b"v%d" % i for i in range(count)], "partition": partitions}), path
    )
    result = expect(orders("produce", "orders", "--arrow", str(path), "--json"), 21)
    assert len(json_lines(result.stdout)) == 20_000
    with broker.open(data_dir) as engine:
        assert [p.end_offset for p in engine.describe_topic("orders").partition_details] == [
            20_000,
            0,
            0,
            0,
        ]
    plain = expect(orders("produce", "orders", "--arrow", str(path)), 21)
    assert plain.stdout == "produced 20000 records to orders: partition 0 offsets 20000-39999\n"


def test_arrow_checks_the_file_before_joining_as_a_member(
    orders: Invoke, data_dir: Path, tmp_path: Path
) -> None:
    """Joining again discards a member's earlier records: a file refused at once must
    not join."""
    begun = json_lines(expect(orders("txn-begin", "--group", "g", "--json"), 0).stdout)[0]
    txn = str(begun["txn_id"])
    expect(orders("produce", "orders", "--txn", txn, "--member", "m", "-p", "1", "-v", "kept"), 0)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    expect(orders("produce", "orders", "--arrow", str(empty), "--txn", txn, "--member", "m"), 10)
    expect(orders("txn-commit", txn), 0)
    assert [r.value for r in read_all(data_dir)] == [b"kept"]


def test_null_value_marker_writes_null_values_that_consume_shows_as_null(
    orders: Invoke, data_dir: Path
) -> None:
    """--null-value MARKER: a value that is exactly MARKER is a null value (Kafka's
    tombstone), distinct from an empty one, in JSON, text and templates; --format
    decodes every other value as usual."""
    lines = "a:NULL\nb:\nc:NULLS\n"
    produced = orders(
        "produce", "orders", "-p", "1", "-K", ":", "--null-value", "NULL", "--json", input=lines
    )
    digests = [r["value_sha256"] for r in json_lines(expect(produced, 0).stdout)]
    assert digests[0] is None and None not in digests[1:]
    marked = ("--null-value", "-", "-v", "-", "-v", "aGk=")  # "-" is not base64: never decoded
    expect(orders("produce", "orders", "-p", "1", "--format", "base64", *marked), 0)
    assert [r.value for r in read_all(data_dir)] == [None, b"", b"NULLS", None, b"hi"]

    consumed = json_lines(expect(orders("consume", "orders", "-p", "1", "--json"), 0).stdout)
    assert [(r["key"], r["value"]) for r in consumed] == [
        ("a", None),
        ("b", ""),
        ("c", "NULLS"),
        (None, None),
        (None, "hi"),
    ]
    text = expect(orders("consume", "orders", "-p", "1", "--max", "2"), 0).stdout
    assert text.splitlines() == ["1\t0\ta\t(null)", "1\t1\tb\t"]
    sizes = expect(orders("consume", "orders", "-p", "1", "--format", "%S,"), 0).stdout
    assert sizes == "-1,0,5,-1,2,"
