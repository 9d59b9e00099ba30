"""broker/protocol/ops.py: the table of operations that the server's dispatch and both
client transports are generic over.

The embedded transport hands a call's arguments to the engine method as they are; the
served one encodes them (args), sends them, and the server decodes them (decode_args)
into the engine method's keyword arguments. Both paths must call the engine the same
way, which is what these tests pin: the call signature of each entry is the engine
method's, and decode_args(args(...)) gives back the call's arguments by name, through
the msgpack frames the wire uses.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from broker.engine.engine import Engine
from broker.errors import BrokerError, ErrorCode
from broker.protocol import ops
from broker.protocol.frames import NEED_DATA, FrameConnection
from broker.protocol.messages import Op, Request
from broker.server.server import Server
from broker.types import Fence, NewRecord, TopicConfig

# One call per operation, with every argument given (positional, then keywords).
CALLS: dict[Op, tuple[tuple[Any, ...], dict[str, Any]]] = {
    Op.CREATE_TOPIC: (
        ("orders", 4),
        {"owner_group": "billing", "config": TopicConfig(3_600_000, 1 << 30, "delete")},
    ),
    Op.ALTER_TOPIC: (("orders",), {"partitions": 8, "config": TopicConfig(None, None, "compact")}),
    Op.CLEAN_TOPIC: (("orders",), {}),
    Op.DELETE_TOPIC: (("orders",), {}),
    Op.LIST_TOPICS: ((), {}),
    Op.DESCRIBE_TOPIC: (("orders",), {}),
    Op.STATUS: ((), {}),
    Op.READ_COMPACTED: (("orders", 2), {}),
    Op.LEASE_PID: (("orders", 1, 7), {}),
    Op.PRODUCERS: (("orders",), {}),
    Op.PRODUCER_SNAPSHOT: ((), {}),
    Op.PRODUCER_SNAPSHOTS: ((), {}),
    Op.COMMIT_OFFSETS: (("billing", "orders", {0: 5, 3: 9}, b"state", "resume-here"), {}),
    Op.COMMITTED_OFFSETS: (("billing", "orders"), {}),
    Op.CONSUMER_GROUPS: ((500,), {}),
    Op.OFFSET_FOR_TIME: (("orders", 2, 1_700_000_000_000), {}),
    Op.SESSIONS: ((20,), {}),
    Op.TOPIC_ACCESS: (("orders",), {}),
    Op.TXN_BEGIN: (("billing", "batch-7", 30_000), {}),
    Op.TXN_JOIN: ((12, "writer-1"), {}),
    Op.TXN_COMMIT: ((12, "billing", {"writer-1": 3}), {}),
    Op.TXN_ABORT: ((12, "billing"), {}),
    Op.TXN_KEEPALIVE: ((12, "billing", 60_000), {}),
    Op.TXN_BEGIN_PRODUCE: (
        ("billing", "orders", [NewRecord(b"v", b"k", (), 1, None)], 30_000),
        {"fences": (Fence("billing", "orders/1", 3),)},
    ),
    Op.TXN_LIST: ((True, 50), {}),
    Op.TXN_SHOW: ((12, 10), {}),
    Op.TXN_COMMIT_OFFSETS: ((12, "billing", "orders", {1: 4}, None), {}),
}


def _through_the_wire(op: Op, payload: dict[str, Any]) -> dict[str, Any]:
    """The payload as the server reads it: packed into a frame and parsed back."""
    sender, receiver = FrameConnection(1 << 20), FrameConnection(1 << 20)
    receiver.receive_data(sender.send(Request(1, op, payload)))
    request = receiver.next_message()
    assert request is not NEED_DATA
    assert isinstance(request, Request)
    return request.args


def test_every_operation_of_the_table_has_a_sample_call() -> None:
    assert set(CALLS) == set(ops.BY_OP)
    assert len(ops.BY_OP) == len(ops.OPERATIONS)  # no operation listed twice


@pytest.mark.parametrize("entry", ops.OPERATIONS, ids=lambda entry: entry.op.name)
def test_the_call_signature_is_the_engine_methods(entry: ops.Operation[Any, Any]) -> None:
    engine_method = inspect.signature(getattr(Engine, entry.method))
    engine_params = [p for name, p in engine_method.parameters.items() if name != "self"]
    call_params = list(inspect.signature(entry.args).parameters.values())
    assert [(p.name, p.kind, p.default) for p in call_params] == [
        (p.name, p.kind, p.default) for p in engine_params
    ]


@pytest.mark.parametrize("entry", ops.OPERATIONS, ids=lambda entry: entry.op.name)
def test_decoded_arguments_are_the_calls_by_the_engines_names(
    entry: ops.Operation[Any, Any],
) -> None:
    args, kwargs = CALLS[entry.op]
    bound = inspect.signature(entry.args).bind(*args, **kwargs)
    decoded = entry.decode_args(_through_the_wire(entry.op, entry.args(*args, **kwargs)))
    assert decoded == bound.arguments


@pytest.mark.parametrize(
    ("entry", "payload", "complaint"),
    [
        (ops.CREATE_TOPIC, {"name": "orders", "partitions": "4"}, "partitions"),
        (ops.LEASE_PID, {"topic": "orders", "partition": 0, "pid": "seven"}, "pid"),
        (ops.TXN_LIST, {"all": False, "limit": -1}, "limit"),
        (ops.COMMIT_OFFSETS, {"group": "g", "topic": "t", "offsets": [[0]]}, "[partition, offset]"),
        (ops.TXN_BEGIN_PRODUCE, {"group": "g", "topic": "t", "records": "x"}, "records"),
    ],
    ids=[
        "partitions as text",
        "pid as text",
        "negative limit",
        "offsets of one field",
        "records not an array",
    ],
)
def test_a_malformed_payload_is_an_error_that_names_the_field(
    entry: ops.Operation[Any, Any], payload: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(BrokerError) as raised:
        entry.decode_args(payload)
    assert raised.value.code in {ErrorCode.PROTOCOL_ERROR, ErrorCode.INVALID_ARGUMENT}
    assert complaint in raised.value.message


def test_the_server_answers_every_operation_number(tmp_path: Any) -> None:
    """Each op is the table's or has a handler of its own; HELLO and PRODUCE are read
    before the handlers (the handshake, the group commit)."""
    server = Server(tmp_path)
    served = set(server._handlers) | {Op.HELLO, Op.PRODUCE}
    assert served == set(Op) - {Op.NONE}
