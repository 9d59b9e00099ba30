"""The pytest plugin's fixtures, as a user's test run sees them: pytester runs small test
files that use fencelog_broker and fencelog_server (and their module and session
variants), and these tests look at the outcomes, the report, and what is left on the
machine afterwards: no server process, no data directory, also after a Ctrl-C. When
pytest itself is killed, its servers stop on their own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.client import connect
from support.helpers import ctrl_c_as_at_a_terminal
from support.waiting import wait_until

pytest_plugins = ["pytester"]

# The inner runs' conftest: `record(**facts)` appends one JSON line to seen.jsonl, which
# the outer test reads back after the run.
RECORDING_CONFTEST = """
import json
from pathlib import Path

import pytest

SEEN = Path(__file__).parent / "seen.jsonl"


@pytest.fixture
def record():
    def write(**facts):
        with SEEN.open("a") as seen:
            seen.write(json.dumps(facts) + "\\n")
    return write
"""
PROCESS_END_S = 20.0
RUN_END_S = 60.0


@pytest.fixture
def recording(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(RECORDING_CONFTEST)
    return pytester


def seen(pytester: pytest.Pytester) -> list[dict[str, Any]]:
    path = pytester.path / "seen.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def alive(pid: int) -> bool:
    """The process exists and is no zombie (a zombie has stopped, only its parent has not
    reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def assert_nothing_left(facts: list[dict[str, Any]]) -> None:
    for fact in facts:
        if "pid" in fact:
            assert not alive(fact["pid"]), f"the server {fact} still runs"
        for key in ("path", "data_dir"):
            if key in fact:
                assert not Path(fact[key]).exists(), f"{fact[key]} is left behind"


def test_each_test_gets_a_fresh_broker_and_server_and_nothing_is_left(
    recording: pytest.Pytester,
) -> None:
    recording.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("run", [1, 2])
        def test_fresh(fencelog_broker, fencelog_server, record, run):
            embedded = fencelog_broker.client()
            served = fencelog_server.client()
            assert embedded.list_topics() == [] and served.list_topics() == []
            embedded.create_topic("orders")
            served.create_topic("orders")
            assert served.served and not embedded.served
            assert fencelog_server.url.startswith("tcp://127.0.0.1:")
            assert fencelog_server.kafka_url.startswith("127.0.0.1:")
            record(
                path=str(fencelog_broker.path),
                url=fencelog_broker.url,
                data_dir=str(fencelog_server.data_dir),
                pid=fencelog_server.pid,
                served=fencelog_server.url,
            )
        """
    )
    recording.runpytest().assert_outcomes(passed=2)
    facts = seen(recording)
    assert len({f["path"] for f in facts}) == 2
    assert len({f["served"] for f in facts}) == 2
    assert all(f["url"] == f["path"] for f in facts)
    assert_nothing_left(facts)


def test_module_and_session_variants_are_shared_as_their_scope_says(
    recording: pytest.Pytester,
) -> None:
    body = """
        def test_a(fencelog_server_module, fencelog_server_session,
                   fencelog_broker_module, fencelog_broker_session, record):
            record(module="{name}", server_module=fencelog_server_module.url,
                   server_session=fencelog_server_session.url,
                   broker_module=fencelog_broker_module.url,
                   broker_session=fencelog_broker_session.url,
                   pid=fencelog_server_module.pid, data_dir=str(fencelog_broker_module.path))

        def test_b(fencelog_server_module, fencelog_server_session,
                   fencelog_broker_module, fencelog_broker_session, record):
            test_a(fencelog_server_module, fencelog_server_session,
                   fencelog_broker_module, fencelog_broker_session, record)
        """
    recording.makepyfile(
        test_one=body.replace("{name}", "one"), test_two=body.replace("{name}", "two")
    )
    recording.runpytest().assert_outcomes(passed=4)
    facts = seen(recording)
    for kind in ("server", "broker"):
        per_module = {f["module"]: {f[f"{kind}_module"] for f in facts} for f in facts}
        by_module = {
            m: {f[f"{kind}_module"] for f in facts if f["module"] == m} for m in per_module
        }
        assert all(len(urls) == 1 for urls in by_module.values()), by_module
        assert by_module["one"] != by_module["two"]
        assert len({f[f"{kind}_session"] for f in facts}) == 1
    assert_nothing_left(facts)


def test_options_from_ini_command_line_and_marker_apply(
    recording: pytest.Pytester, tmp_path: Path
) -> None:
    with connect(tmp_path / "known") as client:  # the known state a snapshot holds
        client.create_topic("ledger", partitions=2)
        client.produce("ledger", [b"opening balance"], partition=1)
        client.backup(recording.path / "known.db")
    recording.makeini(
        """
        [pytest]
        fencelog_durability = full
        fencelog_topics = events:2 audit
        """
    )
    recording.makepyfile(
        """
        import pytest
        from broker.client import connect
        from broker.errors import BrokerError

        def partitions(client):
            return {t.name: t.partitions for t in client.list_topics()}

        def test_ini_and_command_line(fencelog_server, fencelog_broker):
            for broker in (fencelog_server, fencelog_broker):
                client = broker.client()
                assert partitions(client) == {"events": 2, "audit": 1, "extra": 3}
                assert client.status().durability == "full"

        TOKEN = "a-token-of-32-characters-or-more"

        @pytest.mark.fencelog(durability="normal", topics={"orders": 4}, auth_token=TOKEN)
        def test_marker(fencelog_server, fencelog_broker):
            assert partitions(fencelog_server.client()) == {"orders": 4}
            assert fencelog_server.client().status().durability == "normal"
            assert fencelog_broker.client().status().durability == "normal"
            with pytest.raises(BrokerError, match="authentication failed"):
                connect(fencelog_server.url).close()

        @pytest.mark.fencelog(restore="known.db", topics=["ledger:2", "more"])
        def test_restore(fencelog_server, fencelog_broker):
            for broker in (fencelog_server, fencelog_broker):
                client = broker.client()
                assert partitions(client) == {"ledger": 2, "more": 1}
                assert [r.value for r in client.consume("ledger")] == [b"opening balance"]

        @pytest.mark.fencelog(topics={"orders": 3})
        class TestMarkersAddUp:
            @pytest.mark.fencelog(durability="full")
            def test_kafka_clients_see_the_topics(self, fencelog_server):
                from confluent_kafka.admin import AdminClient
                admin = AdminClient({"bootstrap.servers": fencelog_server.kafka_url})
                metadata = admin.list_topics(timeout=10)
                assert {t: len(m.partitions) for t, m in metadata.topics.items()} == {"orders": 3}
                assert fencelog_server.client().status().durability == "full"
        """
    )
    result = recording.runpytest("--fencelog-topics", "events:2 audit extra:3")
    result.assert_outcomes(passed=4)


def test_a_marker_with_an_unknown_keyword_or_value_fails_saying_which(
    recording: pytest.Pytester,
) -> None:
    recording.makepyfile(
        """
        import pytest

        @pytest.mark.fencelog(partitions=4)
        def test_typo(fencelog_broker):
            pass

        @pytest.mark.fencelog(durability="fast", topics="orders:many")
        def test_values(fencelog_server):
            pass
        """
    )
    result = recording.runpytest()
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.fencelog takes the keywords *; not ?'partitions'?",  # ? for [ ]
            "fencelog options: unknown durability 'fast'",
        ]
    )
    assert "During handling" not in result.stdout.str()


def test_a_failing_test_report_holds_the_server_log_of_that_test(
    recording: pytest.Pytester,
) -> None:
    recording.makepyfile(
        """
        def test_passes(fencelog_server_session):
            fencelog_server_session.client().create_topic("first")

        def test_fails(fencelog_server_session, fencelog_server):
            fencelog_server.client().create_topic("orders")
            fencelog_server_session.client().create_topic("second")
            assert False, "the service under test misbehaved"
        """
    )
    result = recording.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*the service under test misbehaved*",
            "*- fencelog serve log (fencelog_server_session, tcp://127.0.0.1:*) -*",
            "*connection * from 127.0.0.1:*",
            "*- fencelog serve log (fencelog_server, tcp://127.0.0.1:*) -*",
            "*fencelog serving *",
        ]
    )
    # the session server's section starts where test_fails began: test_passes's
    # connection, and the server's start, are not in it
    output = result.stdout.str()
    session_section = output.split("fencelog serve log (fencelog_server_session")[1]
    session_section = session_section.split("fencelog serve log (fencelog_server,")[0]
    assert session_section.count("connection ") == 1, session_section
    assert "fencelog serving" not in session_section


def test_a_server_that_cannot_start_fails_the_fixture_with_its_log(
    recording: pytest.Pytester,
) -> None:
    (recording.path / "not-a-snapshot.db").write_bytes(b"garbage")
    recording.makepyfile(
        """
        import pytest

        @pytest.mark.fencelog(restore="not-a-snapshot.db")
        def test_restore(fencelog_server):
            pass
        """
    )
    result = recording.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*not-a-snapshot.db*"])


def run_inner(pytester: pytest.Pytester, test: str) -> subprocess.Popen[str]:
    """pytest on the test file in a process of its own, whose output is piped."""
    pytester.makepyfile(test)
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(pytester.path)],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


WAITS_TO_BE_INTERRUPTED = """
import time

def test_interrupted(fencelog_server, fencelog_broker_session, record):
    fencelog_server.client().create_topic("orders")
    record(pid=fencelog_server.pid, data_dir=str(fencelog_server.data_dir),
           path=str(fencelog_broker_session.path))
    time.sleep(60)  # until the outer test interrupts the run
"""


def test_a_ctrl_c_stops_the_servers_and_removes_the_directories(
    recording: pytest.Pytester,
) -> None:
    with ctrl_c_as_at_a_terminal():
        inner = run_inner(recording, WAITS_TO_BE_INTERRUPTED)
    try:
        wait_until((recording.path / "seen.jsonl").exists, RUN_END_S)
        inner.send_signal(signal.SIGINT)  # as Ctrl-C in a terminal would
        output, _ = inner.communicate(timeout=RUN_END_S)
    finally:
        inner.kill()
        inner.communicate()
    assert "KeyboardInterrupt" in output, output
    assert_nothing_left(seen(recording))


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("setpriv") is None,
    reason="a server stops with a killed pytest through util-linux's setpriv, on Linux",
)
def test_a_killed_pytest_leaves_no_server_running(recording: pytest.Pytester) -> None:
    inner = run_inner(recording, WAITS_TO_BE_INTERRUPTED)
    try:
        wait_until((recording.path / "seen.jsonl").exists, RUN_END_S)
        os.kill(inner.pid, signal.SIGKILL)  # no teardown can run
    finally:
        inner.kill()
        inner.communicate()
    (fact,) = seen(recording)
    wait_until(lambda: not alive(fact["pid"]), PROCESS_END_S, message="the server has stopped")
