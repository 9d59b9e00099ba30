"""Every bound fencelog keeps, named with its unit last.

A limit is a plain number in one frozen dataclass so that a test, a benchmark or an
operator can build a `Limits` with other values and hand it to the engine. Nothing in
fencelog is unbounded: names, values, batches, frames and waits all stop somewhere.
"""

from __future__ import annotations

from msgspec import Struct
from msgspec.structs import replace


class Limits(Struct, frozen=True):
    topic_name_chars_max: int = 249
    topic_partitions_max: int = 1024
    # a record's bounds on the native protocol; a Kafka producer's batch is bounded as
    # Kafka bounds it, by its bytes (append_bytes_max) alone
    record_key_bytes_max: int = 64 * 1024
    record_value_bytes_max: int = 1024 * 1024
    record_headers_max: int = 64
    header_key_chars_max: int = 256
    header_value_bytes_max: int = 64 * 1024
    append_records_max: int = 10_000
    append_bytes_max: int = 32 * 1024 * 1024
    # a Kafka producer's record batch is appended whole, as Kafka bounds it: by bytes
    # (append_bytes_max), with no count of its own; this only caps what one may hold
    # (librdkafka's batch.num.messages goes up to 1,000,000)
    kafka_batch_records_max: int = 1_000_000
    # cleaning (retention and compaction): records one step examines in one write
    # transaction, and how long a compacted topic keeps a tombstone (a keyed record with
    # an empty value) as the newest of its key before it goes too.
    clean_step_records: int = 2_000
    clean_interval_ms: int = 30_000  # serve cleans topics with a retention this often
    tombstone_retention_ms: int = 24 * 3600 * 1000
    # an offset commit's metadata text (Kafka's offset.metadata.max.bytes)
    offset_metadata_chars_max: int = 4096
    read_records_max: int = 10_000
    read_bytes_max: int = 8 * 1024 * 1024
    busy_timeout_ms: int = 30_000
    # idempotent producers
    producer_ids_max: int = 100_000
    pid_lease_ms: int = 24 * 3600 * 1000
    pid_block_size: int = 100
    producer_snapshot_every_records: int = 100_000
    producer_snapshots_kept: int = 3
    # ownership
    ownership_audit_rows_max: int = 100_000
    own_resources_max: int = 1_000
    # transactions
    txn_timeout_ms: int = 60_000
    txn_timeout_max_ms: int = 24 * 3600 * 1000
    txn_journals: int = 16
    txn_id_block_size: int = 100
    txn_history_max: int = 10_000
    txn_show_records_max: int = 1_000
    txn_apply_records_max: int = 100_000  # records copied per SQLite transaction at commit
    # the server and its connections
    frame_bytes_max: int = 48 * 1024 * 1024
    connections_max: int = 512
    inflight_requests_max: int = 128
    connection_buffer_bytes_max: int = 64 * 1024 * 1024
    session_timeout_ms: int = 15_000
    fetch_wait_ms_max: int = 30_000
    group_commit_requests_max: int = 512
    group_commit_split_requests: int = 16  # twice this or more waiting: commit in halves
    group_commit_bytes_max: int = 64 * 1024 * 1024
    shutdown_grace_ms: int = 10_000
    connect_timeout_ms: int = 5_000
    # A served request's deadline (its own wait added for a long poll): past it the
    # connection is taken for dead, closed, and what was in flight has an unknown outcome.
    request_timeout_ms: int = 30_000
    # Kafka's connections.max.idle.ms: a Kafka client's connection with no request in
    # flight and none begun for this long is closed (the client connects again when it
    # needs to). A frame begun and never finished counts as none.
    kafka_idle_ms: int = 10 * 60 * 1000
    # What a Kafka admin listing (ListGroups' offset rows, ListTransactions' transactional
    # ids) reads at most.
    kafka_listed_rows_max: int = 10_000
    # a Kafka connection refused (a bad frame, no SASL first, the listener full): the first
    # of each kind from a client host is warned of, the rest within this interval counted
    # (broker/kafka/refusals.py), for at most this many hosts at once
    kafka_refusal_warn_interval_ms: int = 60_000
    kafka_refusal_hosts_max: int = 1024


DEFAULT_LIMITS = Limits()

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # what a stored integer holds (SQLite)

# How long `fencelog serve` keeps polling its sockets after a request before it sleeps
# (broker.event_loop.BusyPoll says why). A Server used as a library does not poll unless
# asked: in a process it shares with other threads, a polling loop holds the GIL they
# are waiting for.
BUSY_POLL_US_DEFAULT = 500
BUSY_POLL_US_MAX = 100_000

# The bounds a server tells a client in HELLO, so the client splits batches to fit.
CLIENT_LIMIT_NAMES = (
    "append_records_max",
    "append_bytes_max",
    "read_records_max",
    "read_bytes_max",
    "frame_bytes_max",
    "session_timeout_ms",
    "fetch_wait_ms_max",
    "pid_lease_ms",
    "txn_timeout_ms",
)


def limits_for_client(limits: Limits) -> dict[str, int]:
    return {name: getattr(limits, name) for name in CLIENT_LIMIT_NAMES}


def limits_from_server(told: dict[str, object]) -> Limits:
    known = {k: v for k, v in told.items() if k in CLIENT_LIMIT_NAMES and isinstance(v, int)}
    return replace(DEFAULT_LIMITS, **known)
