"""The differential test's world: its clients, groups, topics and limits, the same for
both brokers. See tests/support/differential/__init__.py."""

from __future__ import annotations

import importlib.util

from msgspec.structs import replace

from broker.limits import DEFAULT_LIMITS

# The Arrow forms (fencelog[spark]) are compared where pyarrow is installed.
ARROW = importlib.util.find_spec("pyarrow") is not None

OWNERS = 3  # clients 0..2 claim and write fenced records
WORKERS = 2  # clients 3..4 produce idempotently, exclusively and in transactions
OWNER_GROUP = "owners"  # the owner group of FENCED_TOPIC: its writes need its fences
GROUPS = (OWNER_GROUP, "others")
FENCED_TOPIC = "owned"
RESOURCES = (f"{FENCED_TOPIC}/0", f"{FENCED_TOPIC}/1")
PLAIN_TOPIC = "plain"  # 2 partitions: idempotent, plain and transactional records
LEDGER_TOPIC = "ledger"  # 1 partition: a transaction's second topic
EXCLUSIVE_TOPIC = "excl"  # 1 partition: producers attached shared or exclusive
KEYED_TOPIC = "keyed"  # 2 partitions, compacted: the newest record of each key stays
TOPICS = {FENCED_TOPIC: 2, PLAIN_TOPIC: 2, LEDGER_TOPIC: 1, EXCLUSIVE_TOPIC: 1, KEYED_TOPIC: 2}
TXN_TARGETS = ((PLAIN_TOPIC, 0), (PLAIN_TOPIC, 1), (LEDGER_TOPIC, 0))
TXN_GROUPS = ("billing", "audit")
MEMBERS = ("m1", "m2")
PRODUCER_SLOTS = 3  # exclusive/shared producers open at once, at most
SESSION_END_S = 15.0  # served: a closed connection's session ends soon after; a bound
COUNT_MAX = 5  # records a write sends, at most: more than one append takes (LIMITS)
# Both brokers take at most 4 records an append: a larger write is split into appends.
LIMITS = replace(DEFAULT_LIMITS, append_records_max=COUNT_MAX - 1)
GIVEN_TIMESTAMPS_BELOW = 10**9  # a timestamp the plan gave, not the broker's clock

Answer = tuple[object, ...]  # a step's answer, normalised
