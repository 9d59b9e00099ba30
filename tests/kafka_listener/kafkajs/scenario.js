// KafkaJS against fencelog's Kafka listener: administers, produces (idempotent and in
// transactions), consumes in a group, and prints what it saw as one JSON object.
// Usage: node scenario.js HOST:PORT  (run by tests/kafka_listener/test_kafkajs.py)
"use strict";
const { Kafka, logLevel } = require("kafkajs");

const broker = process.argv[2];
const kafka = new Kafka({
  clientId: "kafkajs-test",
  brokers: [broker],
  logLevel: logLevel.ERROR,
  retry: { retries: 3 },
});

async function consumeAll(topic, groupId, count) {
  const consumer = kafka.consumer({ groupId, readUncommitted: false });
  const seen = [];
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`only ${seen.length} of ${count}`)), 30000);
    consumer.run({
      eachMessage: async ({ partition, message }) => {
        seen.push({
          partition,
          offset: Number(message.offset),
          key: message.key === null ? null : message.key.toString(),
          value: message.value === null ? null : message.value.toString(),
          headers: Object.fromEntries(
            Object.entries(message.headers || {}).map(([k, v]) => [k, v === null ? null : v.toString()])
          ),
        });
        if (seen.length >= count) {
          clearTimeout(timer);
          resolve();
        }
      },
    });
  });
  await consumer.disconnect();
  return seen;
}

async function main() {
  const out = {};
  const admin = kafka.admin();
  await admin.connect();
  out.created = await admin.createTopics({
    topics: [
      { topic: "js-orders", numPartitions: 2 },
      { topic: "js-gone", numPartitions: 1 },
    ],
    waitForLeaders: true,
  });
  out.topics = (await admin.listTopics()).filter((t) => t.startsWith("js-")).sort();
  await admin.createPartitions({ topicPartitions: [{ topic: "js-orders", count: 3 }] });
  const metadata = await admin.fetchTopicMetadata({ topics: ["js-orders"] });
  out.partitions = metadata.topics[0].partitions.map((p) => p.partitionId).sort();
  await admin.alterConfigs({
    resources: [
      { type: 2, name: "js-orders", configEntries: [{ name: "retention.ms", value: "86400000" }] },
    ],
  });
  const configs = await admin.describeConfigs({
    resources: [{ type: 2, name: "js-orders", configNames: ["retention.ms", "cleanup.policy"] }],
  });
  out.configs = Object.fromEntries(
    configs.resources[0].configEntries.map((e) => [e.configName, e.configValue])
  );

  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  const acks = await producer.send({
    topic: "js-orders",
    messages: Array.from({ length: 10 }, (_, i) => ({
      key: `k${i % 3}`,
      value: `v${i}`,
      partition: i % 3,
      headers: { trace: `t${i}` },
    })),
  });
  out.acked_partitions = acks.map((a) => a.partition).sort();
  await producer.disconnect();

  const txnProducer = kafka.producer({
    transactionalId: "js-copier",
    idempotent: true,
    maxInFlightRequests: 1,
  });
  await txnProducer.connect();
  const committed = await txnProducer.transaction();
  await committed.send({
    topic: "js-orders",
    messages: [0, 1, 2, 3, 4].map((i) => ({ value: `txn-${i}`, partition: 0 })),
  });
  await committed.commit();
  const aborted = await txnProducer.transaction();
  await aborted.send({ topic: "js-orders", messages: [{ value: "never", partition: 1 }] });
  await aborted.abort();
  await txnProducer.disconnect();

  out.consumed = await consumeAll("js-orders", "js-group", 15);
  out.offsets = (await admin.fetchOffsets({ groupId: "js-group", topics: ["js-orders"] }))[0]
    .partitions.map((p) => [p.partition, Number(p.offset)])
    .sort((a, b) => a[0] - b[0]);
  out.groups = (await admin.listGroups()).groups.map((g) => g.groupId).filter((g) => g.startsWith("js-"));
  out.topic_offsets = (await admin.fetchTopicOffsets("js-orders"))
    .map((p) => [p.partition, Number(p.low), Number(p.high)])
    .sort((a, b) => a[0] - b[0]);
  await admin.deleteTopicRecords({ topic: "js-orders", partitions: [{ partition: 0, offset: "2" }] });
  out.after_delete_records = (await admin.fetchTopicOffsets("js-orders"))
    .filter((p) => p.partition === 0)
    .map((p) => [Number(p.low), Number(p.high)])[0];
  await admin.deleteGroups(["js-group"]);
  await admin.deleteTopics({ topics: ["js-gone"] });
  out.topics_after = (await admin.listTopics()).filter((t) => t.startsWith("js-")).sort();
  await admin.disconnect();
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((error) => {
  process.stderr.write(`kafkajs: ${error && error.stack ? error.stack : error}\n`);
  process.exit(1);
});
