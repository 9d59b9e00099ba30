"""broker.client.keepalive: a process that keeps a transaction alive while another
process lives (the Spark connector starts one for each batch write, watching the
driver's JVM). It stops when the transaction ends, and when the process it watches is
gone, after which the broker times the transaction out as any abandoned one."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import keepalive
from broker.client.client import Client, connect
from broker.types import TxnInfo
from support.waiting import wait_until

TIMEOUT_MS = 4_500  # the keeper moves the deadline every 1.5 s


@pytest.fixture
def client(data_dir: Path) -> Iterator[Client]:
    with connect(data_dir) as opened:
        opened.create_topic("out")
        yield opened


@pytest.fixture
def watched() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing in for the Spark driver."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=30)


@contextlib.contextmanager
def keeper_for(
    data_dir: Path, txn: TxnInfo, watched: subprocess.Popen[bytes]
) -> Iterator[subprocess.Popen[bytes]]:
    """The keeper process, killed on the way out if it is still running."""
    keeper = keepalive.start(
        keepalive.Keeping(str(data_dir), txn.txn_id, TIMEOUT_MS, watched.pid, txn.group)
    )
    try:
        yield keeper
    finally:
        keeper.kill()
        keeper.wait(timeout=30)


def state_of(client: Client, txn_id: int) -> tuple[str, str | None]:
    [found] = [t for t in client.txn_list(include_ended=True) if t.txn_id == txn_id]
    return found.state, found.reason


def test_the_keeper_keeps_a_transaction_open_past_its_timeout_until_it_ends(
    client: Client, data_dir: Path, watched: subprocess.Popen[bytes]
) -> None:
    txn = client.txn_begin("spark-out", timeout_ms=TIMEOUT_MS)
    with keeper_for(data_dir, txn, watched) as keeper:
        client.produce("out", [b"journaled"], txn=txn.txn_id)
        # past the deadline it began with, and still open
        wait_until(
            lambda: time.time() * 1000 > txn.deadline_ms + 1_000,
            TIMEOUT_MS / 1000 + 30,
            interval_s=0.2,
            message="the first deadline passed",
        )
        assert state_of(client, txn.txn_id) == ("open", None)
        assert client.txn_commit(txn.txn_id).state == "committed"
        assert keeper.wait(timeout=30) == 0  # the broker refused a keepalive: it ended
    assert [r.value for r in client.consume("out")] == [b"journaled"]


def test_a_dead_driver_stops_the_keeper_and_the_transaction_times_out(
    client: Client, data_dir: Path, watched: subprocess.Popen[bytes]
) -> None:
    txn = client.txn_begin("spark-out", timeout_ms=TIMEOUT_MS)
    with keeper_for(data_dir, txn, watched) as keeper:
        wait_until(
            lambda: client.txn_show(txn.txn_id).info.deadline_ms > txn.deadline_ms,
            30,
            message="the keeper moved the deadline",
        )
        watched.kill()
        watched.wait(timeout=30)
        assert keeper.wait(timeout=30) == 0
    wait_until(
        lambda: state_of(client, txn.txn_id) == ("aborted", "timed out"),
        30,
        message="the abandoned transaction timed out",
    )
    assert list(client.consume("out")) == []


def test_the_keeper_stops_with_its_driver_not_at_its_next_keepalive(
    client: Client, data_dir: Path, watched: subprocess.Popen[bytes]
) -> None:
    """A long timeout (10 min: a keepalive every minute) does not keep the keeper
    running for a minute after the driver died: it waits on the driver itself."""
    txn = client.txn_begin("spark-out", timeout_ms=600_000)
    keeper = keepalive.start(
        keepalive.Keeping(str(data_dir), txn.txn_id, 600_000, watched.pid, txn.group)
    )
    try:
        wait_until(
            lambda: client.txn_show(txn.txn_id).info.deadline_ms > txn.deadline_ms,
            30,
            message="the keeper's first keepalive",
        )
        watched.kill()
        watched.wait(timeout=30)
        assert keeper.wait(timeout=20) == 0  # the old keeper slept out its minute
    finally:
        keeper.kill()
        keeper.wait(timeout=30)
    client.txn_abort(txn.txn_id)
