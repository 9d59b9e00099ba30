"""How the Kafka listener logs the connections it refuses (broker/kafka/refusals.py,
issue 39): per client host, the first refusal of each kind is a WARNING; the rest within
the interval are counted, at debug, and the next warning says how many.

The rules on their own with the time passed in; then a served broker refusing many
connections from one host, read in its log as an operator reads it.
"""

from __future__ import annotations

import socket
import struct
from typing import Final

from broker.kafka.refusals import (
    REFUSED_MALFORMED,
    REFUSED_TOO_LARGE,
    REFUSED_UNAUTHENTICATED,
    Refusals,
    Verdict,
    host_of,
)
from support.servers import HOST, ServeProcess
from support.waiting import wait_until

STEP_S: Final = 20.0
MINUTE_S: Final = 60.0


def test_the_first_refusal_of_a_host_is_warned_of_and_the_rest_counted() -> None:
    refusals = Refusals(MINUTE_S, hosts_max=8)
    assert refusals.refused("10.0.0.1", REFUSED_MALFORMED, 0.0) == Verdict(True, 0)
    for second in range(1, 50):
        assert refusals.refused("10.0.0.1", REFUSED_MALFORMED, float(second)).warn is False
    # a minute after the warning: warned of again, with the 49 counted since
    assert refusals.refused("10.0.0.1", REFUSED_MALFORMED, MINUTE_S) == Verdict(True, 49)
    assert refusals.refused("10.0.0.1", REFUSED_MALFORMED, MINUTE_S + 1) == Verdict(False, 0)
    assert refusals.refused("10.0.0.1", REFUSED_MALFORMED, 3 * MINUTE_S) == Verdict(True, 1)


def test_each_kind_and_each_host_has_its_own_first_warning() -> None:
    refusals = Refusals(MINUTE_S, hosts_max=8)
    for kind in (REFUSED_MALFORMED, REFUSED_TOO_LARGE, REFUSED_UNAUTHENTICATED):
        assert refusals.refused("10.0.0.1", kind, 0.0).warn
        assert not refusals.refused("10.0.0.1", kind, 1.0).warn
    assert refusals.refused("10.0.0.2", REFUSED_MALFORMED, 1.0).warn


def test_the_hosts_remembered_are_bounded() -> None:
    refusals = Refusals(MINUTE_S, hosts_max=3)
    for host in range(10):
        assert refusals.refused(f"10.0.0.{host}", REFUSED_MALFORMED, 0.0).warn
        assert len(refusals) <= 3
    # a host forgotten when the table started afresh is warned of again: more warnings,
    # never more memory
    assert refusals.refused("10.0.0.9", REFUSED_MALFORMED, 1.0) == Verdict(False, 0)


def test_a_peer_is_counted_by_its_host() -> None:
    assert host_of("127.0.0.1:51234") == "127.0.0.1"
    assert host_of("[::1]:51234") == "[::1]"
    assert host_of("?") == "?"


def refused_connection(port: int, data: bytes, source: str = HOST) -> None:
    """Send data from source on a new connection; return once the broker closed it."""
    with socket.create_connection((HOST, port), timeout=STEP_S, source_address=(source, 0)) as sock:
        sock.sendall(data)
        try:
            while sock.recv(4096):
                pass
        except ConnectionResetError:
            pass


def test_a_flood_of_refused_connections_is_one_warning_of_each_kind(
    kafka_server: ServeProcess,
) -> None:
    port = int(kafka_server.kafka.rpartition(":")[2])
    garbage = struct.pack(">i", 8) + b"\xff" * 8  # a frame too short to be a Kafka request
    too_large = struct.pack(">i", 1 << 30)
    for _ in range(40):
        refused_connection(port, garbage)
        refused_connection(port, too_large)
    # another host's first refusal: logged after every line above, so once it is read,
    # they all are
    refused_connection(port, garbage, source="127.0.0.2")

    def warnings() -> list[str]:
        return [line for line in kafka_server.stderr_text().splitlines() if " WARNING " in line]

    wait_until(
        lambda: any("127.0.0.2" in line for line in warnings()),
        STEP_S,
        message=lambda: f"a warning of 127.0.0.2: {warnings()}",
    )
    ours = [line for line in warnings() if "connection 127.0.0.1:" in line]
    assert len(ours) == 2, warnings()
    malformed, large = sorted(ours, key=lambda line: "(the limit is" in line)
    assert "shorter than its header" in malformed and "a frame of 1073741824 bytes" in large
    for line in ours:
        assert "more such from 127.0.0.1 within 60 s are logged at debug" in line
