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
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import broker.spark
from broker.client import connect
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

    with connect(args.broker, token=token) as client:
        for topic in (source, sink):
            try:
                client.create_topic(topic, partitions=2)
            except BrokerError as error:
                if error.code is not ErrorCode.TOPIC_EXISTS:
                    raise
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
    query.awaitTermination()
    spark.stop()

    with connect(args.broker, token=token) as client:
        inputs = [r.value.upper() for r in client.consume(source)]
        outputs = [r.value for r in client.consume(sink)]
    duplicates = sum(n - 1 for n in collections.Counter(outputs).values() if n > 1)
    missing = len(set(inputs) - set(outputs))
    print(f"input {len(inputs)}, output {len(outputs)}, duplicates {duplicates}, missing {missing}")
    return 0 if duplicates == 0 and missing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
