"""Kafka's cluster and security admin APIs: DescribeCluster, DescribeLogDirs, and the ACL
and SCRAM APIs.

DescribeCluster names this one broker (node 0, the controller) and the data directory's
cluster id, as Metadata does. DescribeLogDirs names one log directory, the data
directory, holding every partition (no replica is moving: no lag, no future log): each
partition's size is the bytes of its records' keys and values (`fencelog topic
describe`'s), as every partition shares one SQLite file, and v4's total and usable bytes
are the data directory's filesystem's. fencelog has no authorizer and keeps no SCRAM credentials
(its Kafka listener authenticates with SASL/PLAIN and the server's auth token): the ACL
and SCRAM APIs answer as a Kafka broker without an authorizer does, SECURITY_DISABLED,
so admin tools say "security is disabled" rather than "unsupported version" (for SCRAM,
each user asked is SECURITY_DISABLED; the top level is not: librdkafka crashes on it).
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Any, Final

from kafka.protocol import admin

from broker.kafka import authorized_ops, wire
from broker.kafka.admin_codes import SECURITY_DISABLED, Handler
from broker.types import TopicInfo

if TYPE_CHECKING:
    from broker.kafka.api import KafkaApi
    from broker.kafka.listener import KafkaConnection

NODE_ID: Final = 0
NOT_ASKED: Final = None  # authorized operations not asked for (INT32_MIN on the wire)
NO_AUTHORIZER: Final = "fencelog has no authorizer: no ACLs are kept"
NO_SCRAM: Final = "fencelog keeps no SCRAM credentials (its Kafka listener takes SASL/PLAIN)"


class Cluster:
    def __init__(self, api: KafkaApi) -> None:
        self.api = api  # its host and port are known once the listener is bound

    def handlers(self) -> dict[int, Handler]:
        return {
            admin.DescribeClusterRequest.API_KEY: self.describe_cluster,
            admin.DescribeLogDirsRequest.API_KEY: self.describe_log_dirs,
            admin.DescribeAclsRequest.API_KEY: self.describe_acls,
            admin.CreateAclsRequest.API_KEY: self.create_acls,
            admin.DeleteAclsRequest.API_KEY: self.delete_acls,
            admin.DescribeUserScramCredentialsRequest.API_KEY: self.describe_scram,
            admin.AlterUserScramCredentialsRequest.API_KEY: self.alter_scram,
        }

    async def describe_cluster(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = admin.DescribeClusterResponse
        return response(
            version=version,
            throttle_time_ms=0,
            error_code=wire.NONE,
            error_message=None,
            endpoint_type=1,  # brokers
            cluster_id=self.api.cluster_id,
            controller_id=NODE_ID,
            brokers=[
                response.DescribeClusterBroker(
                    broker_id=NODE_ID,
                    host=self.api.host,
                    port=self.api.port,
                    rack=None,
                    is_fenced=False,
                )
            ],
            authorized_operations=authorized_ops.authorized(
                authorized_ops.CLUSTER, body.include_cluster_authorized_operations
            ),
        )

    async def describe_log_dirs(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        reader = self.api.backend.reader
        directory = reader.data_dir()
        topics, (total, _, usable) = await self.api.backend.read(
            lambda: (reader.list_topics(), shutil.disk_usage(directory))
        )
        asked = None if body.topics is None else {t.topic: set(t.partitions) for t in body.topics}
        response = admin.DescribeLogDirsResponse
        return response(
            version=version,
            throttle_time_ms=0,
            error_code=wire.NONE,
            results=[
                response.DescribeLogDirsResult(
                    error_code=wire.NONE,
                    log_dir=str(directory),
                    topics=_log_dir_topics(response, topics, asked),
                    total_bytes=total,
                    usable_bytes=usable,
                    is_cordoned=False,
                )
            ],
        )

    async def describe_acls(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        return admin.DescribeAclsResponse(
            version=version,
            throttle_time_ms=0,
            error_code=SECURITY_DISABLED,
            error_message=NO_AUTHORIZER,
            resources=[],
        )

    async def create_acls(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = admin.CreateAclsResponse
        return response(
            version=version,
            throttle_time_ms=0,
            results=[
                response.AclCreationResult(
                    error_code=SECURITY_DISABLED, error_message=NO_AUTHORIZER
                )
                for _ in body.creations
            ],
        )

    async def delete_acls(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = admin.DeleteAclsResponse
        return response(
            version=version,
            throttle_time_ms=0,
            filter_results=[
                response.DeleteAclsFilterResult(
                    error_code=SECURITY_DISABLED, error_message=NO_AUTHORIZER, matching_acls=[]
                )
                for _ in body.filters
            ],
        )

    async def describe_scram(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        # SECURITY_DISABLED for each user asked, none at the top: librdkafka 2.16 (and so
        # confluent-kafka) crashes on an answer with a top-level error; asked for every
        # user, the answer is that there are none
        response = admin.DescribeUserScramCredentialsResponse
        users = [user.name for user in body.users or ()]
        return response(
            version=version,
            throttle_time_ms=0,
            error_code=wire.NONE,
            error_message=None,
            results=[
                response.DescribeUserScramCredentialsResult(
                    user=user,
                    error_code=SECURITY_DISABLED,
                    error_message=NO_SCRAM,
                    credential_infos=[],
                )
                for user in dict.fromkeys(users)
            ],
        )

    async def alter_scram(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = admin.AlterUserScramCredentialsResponse
        users = [d.name for d in body.deletions] + [u.name for u in body.upsertions]
        return response(
            version=version,
            throttle_time_ms=0,
            results=[
                response.AlterUserScramCredentialsResult(
                    user=user, error_code=SECURITY_DISABLED, error_message=NO_SCRAM
                )
                for user in dict.fromkeys(users)
            ],
        )


def _log_dir_topics(
    response: Any, topics: list[TopicInfo], asked: dict[str, set[int]] | None
) -> list[Any]:
    """The topics of the one log directory: every partition, or those asked that exist
    (a topic or partition that does not is left out, as Kafka leaves out what a
    directory does not hold)."""
    topic_cls = response.DescribeLogDirsResult.DescribeLogDirsTopic
    found = []
    for topic in topics:
        wanted = None if asked is None else asked.get(topic.name)
        if asked is not None and wanted is None:
            continue
        partitions = [
            topic_cls.DescribeLogDirsPartition(
                partition_index=p.partition,
                partition_size=p.bytes,
                offset_lag=0,
                is_future_key=False,
            )
            for p in topic.partition_details
            if wanted is None or p.partition in wanted
        ]
        if partitions:
            found.append(topic_cls(name=topic.name, partitions=partitions))
    return found
