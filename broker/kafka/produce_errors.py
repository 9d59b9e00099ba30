"""Which records of a refused Kafka produce were at fault (Produce v8+, KIP-467).

Kafka names the records it refused by their index in the batch (RecordErrors), so a
client fails those with INVALID_RECORD and the rest of the batch with its own
"a different record was invalid" error, free to send them again. fencelog refuses a
batch whole, as Kafka does; the engine's refusal names the records at fault in its
`record_indexes` detail (today: keyless records on a compacted topic). A refusal that
names none has no RecordErrors, as in Kafka for an error of the whole batch.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol import producer

from broker.errors import BrokerError

_PartitionResponse = producer.ProduceResponse.TopicProduceResponse.PartitionProduceResponse
_RecordError: Any = _PartitionResponse.BatchIndexAndErrorMessage


def record_errors(error: BrokerError, first_index: int) -> list[Any]:
    """The RecordErrors of a refused batch whose first record is the partition data's
    record first_index (a partition's data may hold several batches)."""
    indexes = error.details.get("record_indexes") or ()
    return [
        _RecordError(batch_index=first_index + index, batch_index_error_message=error.message)
        for index in indexes
    ]
