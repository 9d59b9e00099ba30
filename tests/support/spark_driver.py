"""A Spark driver program for tests/spark/test_spark.py's kill -9 test.

    python tests/support/spark_driver.py --broker DIR --checkpoint DIR [--per-trigger N]
        [--transaction-timeout MS]

A streaming query with trigger(availableNow=True): fencelog topic `orders` -> upper-case
-> fencelog topic `orders_upper` (the partition kept), checkpoint in --checkpoint, each
micro-batch one fencelog transaction with the given timeout. The test creates and fills
the topics, runs this in its own process group, kills the group with SIGKILL mid-run,
and restarts from the same checkpoint with examples/spark_pipeline.py (the same query
with the broker's default transaction timeout). It prints "done" when the query ended.
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession

import broker.spark

INPUT, OUTPUT = "orders", "orders_upper"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--per-trigger", type=int, default=200)
    parser.add_argument("--transaction-timeout", type=int, default=20_000)
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("fencelog-kill-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    broker.spark.register(spark)
    query = (
        spark.readStream.format("fencelog")
        .option("broker", args.broker)
        .option("topic", INPUT)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", args.per_trigger)
        .load()
        .selectExpr("key", "upper(cast(value as string)) as value", "partition")
        .writeStream.format("fencelog")
        .option("broker", args.broker)
        .option("topic", OUTPUT)
        .option("transactionTimeout", args.transaction_timeout)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
