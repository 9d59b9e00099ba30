"""The plugin's helpers (broker/testing.py) as a user's failing or passing test shows them:
pytester runs small test files, and these tests read the outcomes and the failure
messages: a wait that ends with what the topic held, produce-and-collect through a
pipeline, and `fencelog verify` as an assertion whose diff says what is missing and
what is extra."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_a_wait_for_records_that_times_out_says_what_the_topic_held(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        def test_holds_enough(fencelog_broker):
            fencelog_broker.client().create_topic("orders", 2)
            fencelog_broker.client().produce("orders", ["a", "b", "c"], key="k")
            records = fencelog_broker.wait_for_records("orders", 3)
            assert [r.value for r in records] == [b"a", b"b", b"c"]

        def test_holds_too_few(fencelog_broker):
            fencelog_broker.client().create_topic("orders", 2)
            fencelog_broker.client().produce("orders", ["a"], partition=1)
            fencelog_broker.wait_for_records("orders", 3, timeout_s=0.2)

        def test_no_topic(fencelog_broker):
            fencelog_broker.wait_for_records("missing", 1, timeout_s=0.1)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "E*AssertionError: topic orders holds 1 of 3 records after 0.2s "
            "(partition 0: 0, partition 1: 1)",
            "E*AssertionError: topic missing does not exist after 0.1s (waited for 1 records)",
        ]
    )
    # the failure points at the test's line, not inside the helper
    result.stdout.fnmatch_lines(['>*fencelog_broker.wait_for_records("orders", 3, timeout_s=0.2)'])


def test_produce_and_collect_feeds_a_pipeline_and_returns_only_new_output(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import threading

        import pytest

        pytestmark = pytest.mark.fencelog(topics=["in", "out"])  # module-scoped too

        @pytest.fixture
        def upper_service(fencelog_server_module):
            # the service under test: copies `in` to `out`, upper-cased, until stopped
            stop = threading.Event()
            client = fencelog_server_module.client()
            (start,) = client.end_offsets("in")

            def run():
                for record in client.consume("in", start=start, follow=True, timeout_s=5):
                    client.produce("out", [record.value.upper()])
                    if stop.is_set():
                        return

            thread = threading.Thread(target=run)
            thread.start()
            yield
            stop.set()
            client.produce("in", [b"stop"])
            thread.join(10)

        @pytest.mark.parametrize("values", [["a", "b"], ["c"]])
        def test_pipeline(fencelog_server_module, upper_service, values):
            out = fencelog_server_module.produce_and_collect("in", values, collect_from="out")
            assert [r.value for r in out] == [v.upper().encode() for v in values]

        def test_same_topic(fencelog_broker):
            fencelog_broker.client().create_topic("t")
            records = fencelog_broker.produce_and_collect("t", [b"x"], key="k")
            assert [(r.key, r.value, r.offset) for r in records] == [(b"k", b"x", 0)]
        """
    )
    pytester.runpytest().assert_outcomes(passed=3)


def test_assert_exactly_once_passes_a_clean_log_and_diffs_a_broken_one(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        def test_clean(fencelog_broker):
            client = fencelog_broker.client()
            client.create_topic("orders", 2)
            values = [f"v{i}" for i in range(10)]
            results = client.produce("orders", values)
            report = fencelog_broker.assert_exactly_once(
                "orders", expected=values, acks=list(zip(values, results))
            )
            assert report.clean and report.records == 10

        def test_broken(fencelog_server):
            client = fencelog_server.client()
            client.create_topic("out")
            client.produce("out", ["v1", "v2", "v2", "stray"])
            fencelog_server.assert_exactly_once("out", expected=["v1", "v2", "v3"])

        def test_acks_that_do_not_match(fencelog_broker):
            client = fencelog_broker.client()
            client.create_topic("in")
            (result,) = client.produce("in", ["what was stored"])
            fencelog_broker.assert_exactly_once("in", acks=[("what was acked", result)])
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "E*AssertionError: fencelog verify out: not exactly once",
            "E*values: - expected but missing, + in the log but not expected*",
            "E*+ b'v2'  expected once, in the log twice (at 0:1, 0:2)",
            "E*- b'v3'  expected once, in the log 0 times",
            "E*+ b'stray'  not expected, in the log once (at 0:3)",
            "E*fencelog verify's report:",
            "E*verify out: 4 records, 3 expected: 3 anomalies (lost 1, duplicate 1, unexpected 1)",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "E*AssertionError: fencelog verify in: not exactly once",
            "E*acks:1: offset 0 holds other bytes than were acknowledged",
        ]
    )
