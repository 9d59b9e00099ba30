"""An exactly-once pipeline on Spark: read a topic, transform, write a topic.

    python examples/spark_pipeline.py                       # embedded ./.fencelog, local[2]
    python examples/spark_pipeline.py --broker tcp://127.0.0.1:7420 --master spark://HOST:7077

It seeds the input topic (--input, default `orders`; when empty) with --records unique
values, then runs a streaming query with trigger(availableNow=True): fencelog --input ->
upper-case -> fencelog --output (default `orders_upper`), each micro-batch one fencelog
transaction, progress kept in --checkpoint. Run it again and it picks up only records
added since; kill it (even with kill -9) and run it again and the output still holds
every input value exactly once.
It ends by counting input, output and duplicates.

On a cluster, point --broker at a `fencelog serve` every executor can reach, e.g.
`fencelog serve --listen 0.0.0.0:7420 --auth-token-file token` and
`--broker tcp://BROKER_HOST:7420 --auth-token-file token` here.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import broker.spark
from broker.client import Client, connect
from broker.errors import BrokerError, ErrorCode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=os.environ.get("FENCELOG_BROKER", "./.fencelog"))
    parser.add_argument("--auth-token-file", default=None)
    parser.add_argument("--input", default="orders", help="topic to read")
    parser.add_argument("--output", default="orders_upper", help="topic to write")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--per-trigger", type=int, default=2_500)
    parser.add_argument("--checkpoint", default="spark-checkpoint")
    args = parser.parse_args()
    token = Path(args.auth_token_file).read_text().strip() if args.auth_token_file else None
    source, sink = args.input, args.output

    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        print(
            "error: Spark needs Java 17: install openjdk-17-jre-headless (Debian/Ubuntu) "
            "or set JAVA_HOME",
            file=sys.stderr,
        )
        return 2
    with connect(args.broker, token=token) as client:
        partitions = _create(client, source, 2)
        # the output keeps each record's partition: it needs as many as the input has
        if _create(client, sink, partitions) < partitions:
            print(
                f"error: topic {sink} has fewer partitions than {source} ({partitions}): "
                f"choose another --output, or delete it (fencelog topic delete {sink})",
                file=sys.stderr,
            )
            return 2
        if client.describe_topic(source).records == 0:
            client.produce(source, [f"order-{i}" for i in range(args.records)])

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("fencelog-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    broker.spark.register(spark)
    options = {"broker": args.broker, **({"authTokenFile": args.auth_token_file} if token else {})}
    query = (
        spark.readStream.format("fencelog")
        .options(**options)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", args.per_trigger)
        .load()
        .selectExpr("key", "upper(cast(value as string)) as value", "partition")
        .writeStream.format("fencelog")
        .options(**options)
        .option("topic", sink)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    except Exception as failed:  # shown as fencelog's own line if it is one, else raised
        found = _FENCELOG_ERROR.search(str(failed))
        if found is None:
            raise
        print(f"error: {found.group(1)}", file=sys.stderr)
        return 1
    finally:
        spark.stop()

    with connect(args.broker, token=token) as client:
        inputs = [r.value.upper() for r in client.consume(source)]
        outputs = [r.value for r in client.consume(sink)]
    duplicates = sum(n - 1 for n in collections.Counter(outputs).values() if n > 1)
    missing = len(set(inputs) - set(outputs))
    print(f"input {len(inputs)}, output {len(outputs)}, duplicates {duplicates}, missing {missing}")
    return 0 if duplicates == 0 and missing == 0 else 1


# A fencelog error raised in a Spark task, as the JVM's report of it quotes it.
_FENCELOG_ERROR = re.compile(r"broker\.errors\.BrokerError: ([^\n]+)")


def _create(client: Client, topic: str, partitions: int) -> int:
    """Create topic with partitions unless it exists; how many partitions it has."""
    try:
        return client.create_topic(topic, partitions=partitions).partitions
    except BrokerError as error:
        if error.code is not ErrorCode.TOPIC_EXISTS:
            raise
    return client.describe_topic(topic).partitions


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C: the checkpoint keeps what was committed
        print("interrupted; run again to go on from the checkpoint", file=sys.stderr)
        sys.exit(130)
