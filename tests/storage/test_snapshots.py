"""fencelog snapshot create | list | restore, and producer state across restarts.

- Producer-state snapshots: created, listed newest first, only the newest few kept; a
  start loads the newest and replays the log after it, and deleting every snapshot
  changes nothing but replay time.
- One-file copies of the whole broker (`snapshot create --out`), taken online while a
  writer process keeps producing (embedded and through `fencelog serve`): every copy
  opens, passes SQLite's integrity check, holds a prefix of the final log with
  contiguous offsets, and producer state that matches its own records.
- Restores: into an empty directory; a directory that holds a broker only with --force;
  never garbage, another application's database, a newer schema, a served address, a
  directory a running server owns, or a directory of someone else's files, each with
  its own exit status and nothing changed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import broker
from broker.client.client import connect
from broker.discovery import DB_FILE
from broker.storage import producers as producer_store
from broker.storage.database import APPLICATION_ID
from broker.types import NewRecord, ProducerFields, Record
from cli.main import command
from support.helpers import Invoke, Process, Processes, expect, json_error, json_lines
from support.producing import state_rows, states_from_records
from support.servers import served, serving
from support.waiting import wait_until

TOPIC = "orders"


def fencelog(runner: CliRunner, target: str | Path, *args: str) -> Result:
    return runner.invoke(command(), ["--broker", str(target), *args])


def records_of(data_dir: Path) -> list[Record]:
    """Every record of every partition, page after page."""
    found: list[Record] = []
    with broker.open(data_dir, durability="normal") as engine:
        for topic in engine.list_topics():
            for p in range(topic.partitions):
                offset = 0
                while page := engine.read(topic.name, p, offset):
                    found += page
                    offset = page[-1].offset + 1
    return found


def delete_snapshots(data_dir: Path) -> int:
    conn = sqlite3.connect(data_dir / DB_FILE)
    try:
        with conn:
            return producer_store.delete_snapshots(conn)
    finally:
        conn.close()


def produce_idempotently(data_dir: Path, rounds: int, start: int = 0) -> None:
    """Two pids on two partitions; each round one batch of each."""
    with broker.open(data_dir, durability="normal") as engine:
        if not engine.list_topics():
            engine.create_topic(TOPIC, partitions=2)
        for partition in (0, 1):
            lease = engine.lease_pid(TOPIC, partition)
            for round_ in range(start, start + rounds):
                fields = ProducerFields(
                    lease.producer_id, lease.generation, 2 * (round_ - start) + 1
                )
                batch = [NewRecord(f"{partition}.{round_}.{i}".encode(), partition=partition)
                         for i in range(2)]  # fmt: skip
                engine.produce(TOPIC, batch, producer=fields)


# producer-state snapshots -------------------------------------------------------------------


def test_snapshot_create_and_list_producer_snapshots(invoke: Invoke, data_dir: Path) -> None:
    produce_idempotently(data_dir, rounds=2)
    result = expect(invoke("snapshot", "create"), 0)
    assert result.stdout.startswith("producer snapshot ")
    first = int(result.stdout.split()[-1])
    ids = [first]
    for _ in range(3):
        (created,) = json_lines(expect(invoke("snapshot", "create", "--json"), 0).stdout)
        ids.append(created["snapshot_id"])
    assert ids == sorted(ids) and len(set(ids)) == 4
    rows = json_lines(expect(invoke("snapshot", "list", "--json"), 0).stdout)
    assert [r["snapshot_id"] for r in rows] == ids[::-1][:3]  # newest first, three kept
    for row in rows:
        assert set(row) == {"snapshot_id", "created_ms", "producers", "evictions", "bytes"}
        assert (row["producers"], row["evictions"]) == (2, 0)
        assert row["bytes"] > 0
    plain = expect(invoke("snapshot", "list"), 0).stdout.splitlines()
    assert [int(line.split("\t")[0]) for line in plain] == ids[::-1][:3]


def test_snapshot_list_of_a_broker_without_snapshots_is_empty(invoke: Invoke) -> None:
    expect(invoke("topic", "create", TOPIC), 0)
    assert expect(invoke("snapshot", "list", "--json"), 0).stdout == ""


def test_state_from_the_newest_snapshot_plus_the_log_after_it_and_from_the_log_alone(
    invoke: Invoke, data_dir: Path
) -> None:
    produce_idempotently(data_dir, rounds=3)
    expect(invoke("snapshot", "create"), 0)
    produce_idempotently(data_dir, rounds=2, start=3)  # new pids, after the snapshot
    truth = states_from_records(records_of(data_dir))
    assert len(truth) == 4

    def listed() -> list[tuple[int, ...]]:
        rows = json_lines(expect(invoke("producers", "list", TOPIC, "--json"), 0).stdout)
        return sorted(
            (r["partition"], r["pid"], r["generation"], r["sequence"], r["first_record_ms"],
             r["last_offset"])
            for r in rows
        )  # fmt: skip

    def status() -> tuple[int, int]:
        shown = json_lines(expect(invoke("status", "--json"), 0).stdout)[0]
        return shown["producer_ids"], shown["producer_evictions"]

    assert listed() == truth  # every command is a fresh start: snapshot + log after it
    assert status() == (4, 0)
    assert delete_snapshots(data_dir) == 1
    assert listed() == truth  # the log alone
    assert status() == (4, 0)
    with broker.open(data_dir, durability="normal") as engine:
        assert state_rows(engine.producer_states(TOPIC)) == truth


# one-file copies ---------------------------------------------------------------------------


def test_snapshot_create_out_writes_a_copy_that_restores_everything(
    runner: CliRunner, data_dir: Path, tmp_path: Path
) -> None:
    produce_idempotently(data_dir, rounds=3)
    with connect(data_dir, durability="normal") as client:
        client.commit_offsets("copier", TOPIC, {0: 4, 1: 2})
        client.snapshot_producers()
        lease = client.lease_pid(TOPIC, 0)
        fields = ProducerFields(lease.producer_id, lease.generation, 1)
        (original,) = client.produce(TOPIC, [NewRecord(b"once", partition=0)], producer=fields)
    fixture = tmp_path / "fixture.db"
    (written,) = json_lines(
        expect(
            fencelog(runner, data_dir, "snapshot", "create", "--out", str(fixture), "--json"), 0
        ).stdout
    )
    assert written == {"file": str(fixture.resolve()), "bytes": fixture.stat().st_size}
    plain = expect(
        fencelog(runner, data_dir, "snapshot", "create", "-o", str(tmp_path / "b.db")), 0
    )
    assert plain.stdout.startswith(f"wrote {(tmp_path / 'b.db').resolve()} (")
    with contextlib.closing(sqlite3.connect(f"file:{fixture}?mode=ro", uri=True)) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # one file
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("fixture")) == [
        "fixture.db"
    ], "no -wal or -shm beside a copy"
    sandbox = tmp_path / "sandbox"
    (restored,) = json_lines(
        expect(fencelog(runner, sandbox, "snapshot", "restore", str(fixture), "--json"), 0).stdout
    )
    assert restored == {"data_dir": str(sandbox.resolve()), "bytes": fixture.stat().st_size}
    assert records_of(sandbox) == records_of(data_dir)
    with connect(sandbox, durability="normal") as copy, connect(data_dir) as source:
        assert state_rows(copy.producer_states(TOPIC)) == state_rows(source.producer_states(TOPIC))
        assert copy.committed_offsets("copier", TOPIC) == source.committed_offsets("copier", TOPIC)
        assert len(copy.producer_snapshots()) == 1
        (retry,) = copy.produce(TOPIC, [NewRecord(b"once", partition=0)], producer=fields)
    assert (retry.offset, retry.duplicate) == (original.offset, True)


def test_snapshot_create_out_never_overwrites_a_file(
    runner: CliRunner, data_dir: Path, tmp_path: Path
) -> None:
    produce_idempotently(data_dir, rounds=1)
    taken = tmp_path / "taken.db"
    taken.write_bytes(b"precious")
    result = expect(
        fencelog(runner, data_dir, "snapshot", "create", "--out", str(taken), "--json"), 10
    )
    assert json_error(result)["error"] == "INVALID_ARGUMENT"
    assert taken.read_bytes() == b"precious"


# restores that are refused -----------------------------------------------------------------


@pytest.fixture
def fixture_file(runner: CliRunner, data_dir: Path, tmp_path: Path) -> Path:
    produce_idempotently(data_dir, rounds=2)
    path = tmp_path / "fixture.db"
    expect(fencelog(runner, data_dir, "snapshot", "create", "--out", str(path)), 0)
    return path


def tree(directory: Path) -> dict[str, bytes]:
    return (
        {p.name: p.read_bytes() for p in sorted(directory.iterdir())} if directory.exists() else {}
    )


def test_restore_into_a_broker_needs_force(
    runner: CliRunner, fixture_file: Path, tmp_path: Path
) -> None:
    sandbox = tmp_path / "sandbox"
    with broker.open(sandbox) as other:
        other.create_topic("other-topic")
    before = records_of(sandbox), tree(sandbox)
    refused = expect(
        fencelog(runner, sandbox, "snapshot", "restore", str(fixture_file), "--json"), 10
    )
    assert json_error(refused)["error"] == "INVALID_ARGUMENT"
    assert "--force" in json_error(refused)["hint"]
    assert (records_of(sandbox), tree(sandbox)) == before
    expect(fencelog(runner, sandbox, "snapshot", "restore", str(fixture_file), "--force"), 0)
    with broker.open(sandbox) as engine:
        assert [t.name for t in engine.list_topics()] == [TOPIC]
    assert len(records_of(sandbox)) == 8


def foreign_sqlite(path: Path) -> Path:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('not a broker')")
        conn.commit()
    return path


def newer_schema(fixture: Path, path: Path) -> Path:
    path.write_bytes(fixture.read_bytes())
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA user_version = 999")
        conn.commit()
    return path


BAD_FILES: dict[str, tuple[Callable[[Path, Path], Path], int]] = {
    "garbage": (lambda fixture, tmp: _write(tmp / "garbage.db", os.urandom(8192)), 31),
    "text": (lambda fixture, tmp: _write(tmp / "notes.txt", b"hello\n" * 100), 31),
    "empty": (lambda fixture, tmp: _write(tmp / "empty.db", b""), 31),
    "another app": (lambda fixture, tmp: foreign_sqlite(tmp / "app.db"), 31),
    "newer schema": (lambda fixture, tmp: newer_schema(fixture, tmp / "future.db"), 32),
    "truncated": (lambda fixture, tmp: _write(tmp / "cut.db", _half(fixture)), 37),
    "missing": (lambda fixture, tmp: tmp / "missing.db", 10),
    "a directory": (lambda fixture, tmp: tmp, 10),
}


def _half(path: Path) -> bytes:
    data = path.read_bytes()
    return data[: len(data) // 2]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_restore_refuses_what_is_not_a_fencelog_snapshot(
    runner: CliRunner, fixture_file: Path, tmp_path: Path, kind: str
) -> None:
    make, status = BAD_FILES[kind]
    (tmp_path / "bad").mkdir()
    bad = make(fixture_file, tmp_path / "bad")
    sandbox = tmp_path / "sandbox"
    result = expect(
        fencelog(runner, sandbox, "snapshot", "restore", str(bad), "--force", "--json"), status
    )
    error = json_error(result)
    assert error["code"] == status and error["message"]
    assert result.stdout == ""
    assert not (sandbox / DB_FILE).exists()
    plain = fencelog(runner, sandbox, "snapshot", "restore", str(bad))
    assert plain.exit_code == status
    assert plain.stderr.startswith("error: ") and f"[{error['error']}]" in plain.stderr


def test_a_snapshot_cut_short_is_said_to_be_truncated_not_foreign(
    runner: CliRunner, fixture_file: Path, tmp_path: Path
) -> None:
    cut = _write(tmp_path / "cut.db", _half(fixture_file))
    result = expect(fencelog(runner, tmp_path / "sandbox", "snapshot", "restore", str(cut)), 37)
    size = fixture_file.stat().st_size
    assert f"truncated: {size // 2} of {size} bytes" in result.stderr
    assert "DATA_CORRUPT" in result.stderr


def test_restore_refuses_a_directory_of_someone_elses_files(
    runner: CliRunner, fixture_file: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    for force in ((), ("--force",)):
        result = expect(
            fencelog(runner, home, "snapshot", "restore", str(fixture_file), *force), 31
        )
        assert "FOREIGN_DATA_DIR" in result.stderr
    assert tree(home) == {"thesis.tex": b"years of work"}


def test_restore_refuses_a_served_address_and_a_directory_a_server_owns(
    runner: CliRunner, fixture_file: Path, tmp_path: Path
) -> None:
    sandbox = tmp_path / "sandbox"
    with broker.open(sandbox) as engine:
        engine.create_topic("live")
    with served(sandbox) as server:
        remote = expect(
            fencelog(runner, server.address, "snapshot", "restore", str(fixture_file)), 10
        )
        assert "INVALID_ARGUMENT" in remote.stderr
        owned = expect(
            fencelog(
                runner, sandbox, "snapshot", "restore", str(fixture_file), "--force", "--json"
            ),
            35,
        )
        assert json_error(owned)["error"] == "DATA_DIR_IN_USE"
    with broker.open(sandbox) as engine:
        assert [t.name for t in engine.list_topics()] == ["live"]


def test_snapshot_usage_errors_exit_2(invoke: Invoke) -> None:
    expect(invoke("snapshot", "restore"), 2)
    expect(invoke("snapshot", "bogus"), 2)
    expect(invoke("snapshot", "create", "--out"), 2)
    # an empty --out (an unset variable) said the current directory "already exists"
    for where in ("", "."):
        named = expect(invoke("snapshot", "create", "--out", where), 10)
        assert "--out names a directory" in named.stderr


# an online copy while a writer keeps producing ------------------------------------------------

WRITER = r"""
import sys
from pathlib import Path
from broker.client.client import connect
from broker.types import NewRecord, ProducerFields

target, stop = sys.argv[1], Path(sys.argv[2])
with connect(target, durability="normal") as client:
    leases = {p: client.lease_pid("orders", p) for p in (0, 1)}
    sequence = {0: 1, 1: 1}
    batches = 0
    while not stop.exists() and batches < 100_000:
        partition = batches % 2
        lease = leases[partition]
        fields = ProducerFields(lease.producer_id, lease.generation, sequence[partition])
        records = [NewRecord(f"{partition}-{sequence[partition] + i}".encode() * 40,
                             partition=partition) for i in range(5)]
        client.produce("orders", records, producer=fields)
        sequence[partition] += len(records)
        batches += 1
        if batches == 20:
            print("writing", flush=True)
print("stopped", batches, flush=True)
"""


@contextlib.contextmanager
def writer(processes: Processes, target: str, stop: Path) -> Iterator[Process]:
    process = processes.python(WRITER, target, stop)
    try:
        assert process.line(20).strip() == "writing"
        yield process
    finally:
        stop.touch()
    assert process.wait(20) == 0, process.stderr_text()
    assert process.line(5).startswith("stopped")


def copied_records(copy: Path) -> int:
    """How many records a one-file copy holds, read straight from it."""
    with contextlib.closing(sqlite3.connect(f"file:{copy}?mode=ro", uri=True)) as conn:
        return int(conn.execute("SELECT coalesce(sum(records), 0) FROM log").fetchone()[0])


def check_copy(runner: CliRunner, copy: Path, sandbox: Path, final: list[Record]) -> int:
    """The copy restores, is intact, holds a prefix of the final log, and its producer
    state (from its snapshots or from its log alone) is what its own records say."""
    with contextlib.closing(sqlite3.connect(f"file:{copy}?mode=ro", uri=True)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    expect(fencelog(runner, sandbox, "snapshot", "restore", str(copy)), 0)
    records = records_of(sandbox)
    for partition in (0, 1):
        mine = [r for r in records if r.partition == partition]
        assert [r.offset for r in mine] == list(range(len(mine)))
        theirs = [r for r in final if r.partition == partition][: len(mine)]
        assert [(r.value, r.producer_id, r.sequence) for r in mine] == [
            (r.value, r.producer_id, r.sequence) for r in theirs
        ]
    truth = states_from_records(records)
    with broker.open(sandbox, durability="normal") as engine:
        ends = engine.end_offsets(TOPIC)
        assert ends == [len([r for r in records if r.partition == p]) for p in (0, 1)]
        assert state_rows(engine.producer_states(TOPIC)) == truth
    delete_snapshots(sandbox)
    with broker.open(sandbox, durability="normal") as engine:
        assert state_rows(engine.producer_states(TOPIC)) == truth
    return len(records)


@pytest.mark.parametrize("how", ["embedded", "served"])
def test_copies_taken_while_a_writer_produces_are_consistent(
    runner: CliRunner, data_dir: Path, tmp_path: Path, processes: Processes, how: str
) -> None:
    with broker.open(data_dir, durability="normal") as engine:
        engine.create_topic(TOPIC, partitions=2)
        engine.snapshot_producers()
    copies = [tmp_path / f"copy-{i}.db" for i in range(3)]
    with contextlib.ExitStack() as stack:
        target = str(data_dir)
        if how == "served":
            target = stack.enter_context(serving(data_dir, tmp_path / "ready.json")).address
        with writer(processes, target, tmp_path / "stop"), connect(target) as observer:
            for index, copy in enumerate(copies):
                if index == 1:  # a producer snapshot in the middle of the stream, too
                    expect(fencelog(runner, target, "snapshot", "create"), 0)
                expect(fencelog(runner, target, "snapshot", "create", "--out", str(copy)), 0)
                held = copied_records(copy)
                wait_until(  # the writer moves on past this copy before the next one
                    lambda: observer.describe_topic(TOPIC).records > held,  # noqa: B023 - at once
                    message=f"the log grew past the {held} records of {copy.name}",
                )
        final = records_of(data_dir) if how == "embedded" else _records_served(target)
    sizes = [
        check_copy(runner, copy, tmp_path / f"sandbox-{i}", final) for i, copy in enumerate(copies)
    ]
    assert sizes == sorted(sizes) and 0 < sizes[0] < sizes[-1] <= len(final)  # it kept writing


def _records_served(address: str) -> list[Record]:
    with connect(address) as client:
        return list(client.consume(TOPIC))


def test_a_restored_copy_is_not_tied_to_the_server_that_took_it(
    runner: CliRunner, fixture_file: Path, tmp_path: Path
) -> None:
    sandbox = tmp_path / "sandbox"
    expect(fencelog(runner, sandbox, "snapshot", "restore", str(fixture_file)), 0)
    status = json_lines(expect(fencelog(runner, sandbox, "status", "--json"), 0).stdout)[0]
    assert status["data_dir"] == str(sandbox.resolve())
    assert status["producer_ids"] == 2
    names = {p.name for p in sandbox.iterdir()}
    assert DB_FILE in names and not any(name.endswith(".tmp") for name in names)


def test_relative_paths_mean_the_users_directory_even_through_a_server(
    runner: CliRunner, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    produce_idempotently(data_dir, rounds=2)
    with serving(data_dir, tmp_path / "ready.json") as server:
        work = tmp_path / "work"
        work.mkdir()
        monkeypatch.chdir(work)  # the server runs elsewhere
        expect(fencelog(runner, server.address, "snapshot", "create", "--out", "fixture.db"), 0)
    assert (work / "fixture.db").is_file()
    expect(fencelog(runner, "./sandbox", "snapshot", "restore", "fixture.db"), 0)
    assert records_of(work / "sandbox") == records_of(data_dir)


def test_a_copy_leaves_out_the_space_a_deleted_topic_freed(data_dir: Path, tmp_path: Path) -> None:
    with connect(data_dir, durability="normal") as client:
        client.create_topic("scratch")
        client.create_topic("kept")
        client.produce("scratch", [bytes(1000)] * 5_000)
        client.produce("kept", [b"small"] * 10)
        client.delete_topic("scratch")  # its pages go to SQLite's free list
        client.backup(tmp_path / "compact.db")
        client.produce("kept", [bytes(1000)] * 5_000)  # fills the freed pages again
        client.backup(tmp_path / "paged.db")
    database = (data_dir / DB_FILE).stat().st_size
    assert (tmp_path / "compact.db").stat().st_size < database / 2
    assert (tmp_path / "paged.db").stat().st_size > database / 2
    for copy in ("compact.db", "paged.db"):
        with contextlib.closing(sqlite3.connect(tmp_path / copy)) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
