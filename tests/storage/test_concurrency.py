"""Several real OS processes writing to one data directory at once.

A checker reads the stored log straight from SQLite and counts what must be 0: gaps or
duplicates in a partition's offsets, lost or duplicated values, and records of one
producer out of the order it appended them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import broker
from broker.discovery import DB_FILE
from support.helpers import Processes
from support.stored import stored_records

PROCESSES = 4
BATCHES = 50
BATCH_RECORDS = 20

# argv: data_dir topic producer_name batches batch_records routing
PRODUCER = r"""
import sys
import broker
from broker.types import NewRecord

data_dir, topic, name, batches, size, routing = sys.argv[1:7]
with broker.open(data_dir) as engine:
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    for batch in range(int(batches)):
        records = []
        for index in range(int(size)):
            value = f"{name}:{batch}:{index}".encode()
            if routing == "keyed":
                records.append(NewRecord(value, key=f"{name}/{batch}/{index}".encode()))
            elif routing == "round-robin":
                records.append(NewRecord(value))
            else:
                records.append(NewRecord(value, partition=int(routing)))
        results = engine.produce(topic, records)
        assert [r.topic for r in results] == [topic] * len(records)
print("done", flush=True)
"""

# argv: parent_dir rounds. Each round, four forked processes open one new data directory
# and create the same topic; a line per round of what each saw, sorted.
FIRST_OPENERS = r"""
import multiprocessing
import sys
from pathlib import Path
import broker
from broker.errors import BrokerError

def open_and_create(data_dir, answers):
    try:
        with broker.open(data_dir) as engine:
            engine.create_topic("orders", partitions=3)
            answers.put("created")
    except BrokerError as error:
        answers.put(error.code.name)
    except Exception as error:
        answers.put(repr(error))

parent, rounds = Path(sys.argv[1]), int(sys.argv[2])
context = multiprocessing.get_context("fork")
for round_number in range(rounds):
    answers = context.Queue()
    openers = [
        context.Process(target=open_and_create, args=(parent / str(round_number), answers))
        for _ in range(4)
    ]
    for opener in openers:
        opener.start()
    for opener in openers:
        opener.join(60)
    print(" ".join(sorted(answers.get(timeout=5) for _ in openers)), flush=True)
"""


def check_log(data_dir: Path, topic: str, partitions: int, expected: set[bytes]) -> None:
    rows = stored_records(data_dir / DB_FILE, topic)
    by_partition: dict[int, list[dict[str, object]]] = {p: [] for p in range(partitions)}
    for row in rows:
        partition = row["partition"]
        assert isinstance(partition, int)
        by_partition[partition].append(row)

    with broker.open(data_dir) as engine:
        ends = engine.end_offsets(topic)
    for partition, found in by_partition.items():
        offsets = [row["offset"] for row in found]
        assert offsets == list(range(len(found))), f"partition {partition}: gap or duplicate"
        assert ends[partition] == len(found), f"partition {partition}: end offset"

    counts = Counter(row["value"] for row in rows)
    duplicated = [value for value, count in counts.items() if count > 1]
    lost = expected - set(counts)
    unexpected = set(counts) - expected
    assert (duplicated, lost, unexpected) == ([], set(), set())

    for partition, found in by_partition.items():
        last: dict[str, tuple[int, int]] = {}
        for row in found:
            value = row["value"]
            assert isinstance(value, bytes)
            name, batch, index = value.decode().split(":")
            position = (int(batch), int(index))
            assert position > last.get(name, (-1, -1)), f"{name} out of order in {partition}"
            last[name] = position


@pytest.mark.slow
@pytest.mark.parametrize(
    ("partitions", "routing"),
    [(1, "0"), (4, "keyed"), (4, "round-robin")],
    ids=["one-partition", "several-partitions-keyed", "several-partitions-round-robin"],
)
def test_concurrent_producers_keep_offsets_contiguous(
    processes: Processes, data_dir: Path, partitions: int, routing: str
) -> None:
    with broker.open(data_dir) as engine:
        engine.create_topic("orders", partitions=partitions)
    names = [f"p{n}" for n in range(PROCESSES)]
    settings = [str(BATCHES), str(BATCH_RECORDS), routing]
    producers = [
        processes.python(PRODUCER, data_dir, "orders", name, *settings, stdin=True)
        for name in names
    ]
    for producer in producers:
        assert producer.line(timeout_s=30) == "ready\n"
    for producer in producers:
        producer.stdin.write(b"go\n")
        producer.stdin.flush()
    for producer in producers:
        assert producer.wait(timeout_s=60) == 0, producer.stderr_text()
        assert producer.remaining_lines() == ["done\n"]

    expected = {
        f"{name}:{batch}:{index}".encode()
        for name in names
        for batch in range(BATCHES)
        for index in range(BATCH_RECORDS)
    }
    check_log(data_dir, "orders", partitions, expected)
    if partitions > 1:
        with broker.open(data_dir) as engine:
            assert all(end > 0 for end in engine.end_offsets("orders"))


@pytest.mark.slow
def test_concurrent_first_open_and_topic_create(processes: Processes, data_dir: Path) -> None:
    """Processes racing to create the same topic in a directory none has opened yet:
    the schema is applied once and exactly one create wins."""
    creators = [
        processes.fencelog("--broker", data_dir, "topic", "create", "orders", "-p", "3", "--json")
        for _ in range(PROCESSES)
    ]
    statuses = [creator.wait(timeout_s=60) for creator in creators]
    assert sorted(statuses) == [0] + [22] * (PROCESSES - 1), [c.stderr_text() for c in creators]
    for creator, status in zip(creators, statuses, strict=True):
        if status == 22:
            assert json.loads(creator.stderr_text())["error"] == "TOPIC_EXISTS"
        else:
            [line] = creator.remaining_lines()
            assert json.loads(line)["partitions"] == 3
    with broker.open(data_dir) as engine:
        assert [(t.name, t.partitions) for t in engine.list_topics()] == [("orders", 3)]


@pytest.mark.slow
@pytest.mark.timeout(300)  # its own wait is 240 s: a loaded host must reach that first
def test_processes_opening_a_new_directory_at_once_never_see_it_as_foreign(
    processes: Processes, tmp_path: Path
) -> None:
    """Round after round of four processes on one new directory: each opens it, and
    exactly one creates the topic. Two reads of the first open once saw another
    process's schema commit in between (FOREIGN_DATA_DIR), and a switch to WAL could
    meet SQLite's deadlock refusal (a traceback): each in about one round of thirty, so
    100 rounds find either one back in 29 runs of 30."""
    rounds = 100
    openers = processes.python(FIRST_OPENERS, tmp_path, str(rounds))
    assert openers.wait(timeout_s=240) == 0, openers.stderr_text()
    outcomes = Counter(openers.remaining_lines())
    assert outcomes == {"TOPIC_EXISTS TOPIC_EXISTS TOPIC_EXISTS created\n": rounds}
