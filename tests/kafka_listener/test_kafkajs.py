"""KafkaJS against the Kafka listener: a client with its own implementation of Kafka's
protocol, in JavaScript (not librdkafka's, not kafka-python's), administering, producing
idempotently and in transactions, and consuming in a group, as a Node application's
test fixture does. kafkajs/scenario.js drives it; `make test` installs KafkaJS from npm
(tests/kafka_listener/kafkajs/package-lock.json); without Node or KafkaJS it skips.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Final

import pytest

from support.servers import ServeProcess

SCENARIO: Final = Path(__file__).parent / "kafkajs" / "scenario.js"
SCENARIO_TIMEOUT_S: Final = 120


def run_scenario(kafka: str) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed")
    if not (SCENARIO.parent / "node_modules" / "kafkajs").is_dir():
        pytest.skip("KafkaJS is not installed (`make test` installs it with npm)")
    done = subprocess.run(
        [node, str(SCENARIO), kafka],
        capture_output=True,
        text=True,
        timeout=SCENARIO_TIMEOUT_S,
        check=False,
        cwd=SCENARIO.parent,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_kafkajs_administers_produces_and_consumes_exactly_once(
    kafka_server: ServeProcess, kafka: str
) -> None:
    seen = run_scenario(kafka)
    # admin: created, grown to 3 partitions, a config altered and described
    assert seen["created"] is True
    assert seen["topics"] == ["js-gone", "js-orders"]
    assert seen["partitions"] == [0, 1, 2]
    assert seen["configs"] == {"retention.ms": "86400000", "cleanup.policy": "delete"}
    # 10 idempotent records with keys and headers, 5 in a committed transaction, 1 aborted
    consumed = seen["consumed"]
    assert sorted(r["value"] for r in consumed) == sorted(
        [f"v{i}" for i in range(10)] + [f"txn-{i}" for i in range(5)]
    )
    assert all(r["headers"] == {"trace": f"t{r['value'][1:]}"} for r in consumed if r["key"])
    by_partition: dict[int, list[int]] = {}
    for record in consumed:
        by_partition.setdefault(record["partition"], []).append(record["offset"])
    assert by_partition == {0: list(range(9)), 1: [0, 1, 2], 2: [0, 1, 2]}  # no gaps, once
    # the group's commits, its listing, the watermarks, DeleteRecords, deletes
    assert seen["offsets"] == [[0, 9], [1, 3], [2, 3]]
    assert seen["groups"] == ["js-group"]
    assert seen["topic_offsets"] == [[0, 0, 9], [1, 0, 3], [2, 0, 3]]
    assert seen["after_delete_records"] == [2, 9]
    assert seen["topics_after"] == ["js-orders"]

    # fencelog sees what KafkaJS did, through its own CLI
    def fencelog(*args: str) -> str:
        command = ["fencelog", "--broker", kafka_server.address, *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    described = json.loads(fencelog("topic", "describe", "js-orders", "--json"))
    assert described["partitions"] == 3
    assert "js-gone" not in fencelog("topic", "list")
    verified = json.loads(fencelog("verify", "js-orders", "--json"))
    assert verified["clean"] is True, verified
