"""Kafka's config APIs on fencelog's topic configs: DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs (the names and values: broker/kafka/topic_configs.py).

- A topic's configs are what `fencelog topic alter` sets (cleanup.policy, retention.ms,
  retention.bytes) and the read-only ones Kafka tools expect to see; an alter is one
  write that reads the current config and stores the new one (Engine.alter_topic).
- AlterConfigs replaces the topic's configs (what it leaves out goes back to its
  default, as in Kafka); IncrementalAlterConfigs sets, deletes, appends and subtracts.
- The broker (resource 4, named "0", or "" for the cluster's defaults) is described,
  read-only; other resources (broker loggers, groups, client metrics) are
  INVALID_REQUEST: fencelog keeps none.
- validate_only checks and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from kafka.protocol import admin

from broker.errors import BrokerError, ErrorCode
from broker.kafka import topic_configs as names
from broker.kafka import wire
from broker.kafka.admin_codes import Handler
from broker.types import TopicConfig

if TYPE_CHECKING:
    from broker.kafka.api import KafkaApi
    from broker.kafka.listener import KafkaConnection

TOPIC: Final = 2
BROKER: Final = 4
BROKER_NAMES: Final = ("0", "")
Changes = Callable[[TopicConfig], dict[str, str | None]]


class Configs:
    def __init__(self, api: KafkaApi) -> None:
        self.backend = api.backend
        self.default_partitions = api.default_partitions
        self.auto_create = api.auto_create

    def handlers(self) -> dict[int, Handler]:
        return {
            admin.DescribeConfigsRequest.API_KEY: self.describe_configs,
            admin.AlterConfigsRequest.API_KEY: self.alter_configs,
            admin.IncrementalAlterConfigsRequest.API_KEY: self.incremental_alter_configs,
        }

    # DescribeConfigs ----------------------------------------------------------------

    async def describe_configs(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = admin.DescribeConfigsResponse
        results = []
        for resource in body.resources:
            keys = (
                None if resource.configuration_keys is None else list(resource.configuration_keys)
            )
            error, message, found = await self._describe(
                resource.resource_type, resource.resource_name, keys
            )
            results.append(
                response.DescribeConfigsResult(
                    error_code=error,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=[_entry(response, config, version) for config in found],
                )
            )
        return response(version=version, throttle_time_ms=0, results=results)

    async def _describe(
        self, resource_type: int, name: str, keys: list[str] | None
    ) -> tuple[int, str | None, list[names.Described]]:
        limits = self.backend.writer.limits
        if resource_type == BROKER:
            if name not in BROKER_NAMES:
                return wire.INVALID_REQUEST, f"fencelog is one broker, 0: not {name!r}", []
            found = names.broker_configs(limits, self.default_partitions, self.auto_create)
            return wire.NONE, None, [c for c in found if keys is None or c.name in keys]
        if resource_type != TOPIC:
            return wire.INVALID_REQUEST, _not_kept(resource_type, name), []
        reader = self.backend.reader
        try:
            info = await self.backend.read(lambda: reader.describe_topic(name))
        except BrokerError as error:
            return _topic_error(error), error.message, []
        return wire.NONE, None, names.described(info.config, limits, keys)

    # AlterConfigs and IncrementalAlterConfigs ---------------------------------------

    async def alter_configs(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        def replaced(configs: list[tuple[str, str | None]]) -> Changes:
            # what the request leaves out goes back to its default
            return lambda current: {name: None for name in names.TOPIC_CONFIGS} | dict(configs)

        answers = [
            await self._alter(
                resource.resource_type,
                resource.resource_name,
                replaced([(c.name, c.value) for c in resource.configs]),
                bool(body.validate_only),
            )
            for resource in body.resources
        ]
        return _altered(admin.AlterConfigsResponse, version, body.resources, answers)

    async def incremental_alter_configs(
        self, connection: KafkaConnection, body: Any, version: int
    ) -> Any:
        limits = self.backend.writer.limits

        def operations(configs: list[tuple[str, int, str | None]]) -> Changes:
            return lambda current: names.incremental(current, configs, limits)

        answers = [
            await self._alter(
                resource.resource_type,
                resource.resource_name,
                operations([(c.name, c.config_operation, c.value) for c in resource.configs]),
                bool(body.validate_only),
            )
            for resource in body.resources
        ]
        return _altered(admin.IncrementalAlterConfigsResponse, version, body.resources, answers)

    async def _alter(
        self, resource_type: int, name: str, changes: Changes, validate_only: bool
    ) -> tuple[int, str | None]:
        if resource_type == BROKER:
            return wire.INVALID_CONFIG, "the broker's configs are read-only in fencelog"
        if resource_type != TOPIC:
            return wire.INVALID_REQUEST, _not_kept(resource_type, name)
        writer = self.backend.writer

        def alter() -> None:
            current = writer.describe_topic(name).config
            new = names.altered(current, changes(current), writer.limits)
            if not validate_only and new != current:
                writer.alter_topic(name, config=new)

        try:
            await self.backend.write(alter)
        except names.ConfigRefused as refused:
            return wire.INVALID_CONFIG, str(refused)
        except BrokerError as error:
            return _topic_error(error), error.message
        return wire.NONE, None


def _entry(response: Any, config: names.Described, version: int) -> Any:
    entry_cls = response.DescribeConfigsResult.DescribeConfigsResourceResult
    return entry_cls(
        name=config.name,
        value=config.value,
        read_only=config.read_only,
        config_source=config.source,
        is_default=config.source == names.DEFAULT_CONFIG,
        is_sensitive=False,
        synonyms=[
            entry_cls.DescribeConfigsSynonym(
                name=config.name, value=config.value, source=config.source
            )
        ],
        config_type=config.config_type,
        documentation=config.documentation or None,
    )


def _altered(response: Any, version: int, resources: Any, answers: list[Any]) -> Any:
    return response(
        version=version,
        throttle_time_ms=0,
        responses=[
            response.AlterConfigsResourceResponse(
                error_code=error,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
            for resource, (error, message) in zip(resources, answers, strict=True)
        ],
    )


def _topic_error(error: BrokerError) -> int:
    if error.code is ErrorCode.UNKNOWN_TOPIC:
        return wire.UNKNOWN_TOPIC_OR_PARTITION
    if error.code is ErrorCode.INVALID_ARGUMENT:
        return wire.INVALID_CONFIG
    return wire.UNKNOWN_SERVER_ERROR


def _not_kept(resource_type: int, name: str) -> str:
    return f"fencelog keeps no configs of resource type {resource_type} ({name!r})"
