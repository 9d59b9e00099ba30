"""The one SparkSession of tests/spark, and the brokers its workers reach.

One SparkSession for the whole run (master local[2,3]: two threads, three attempts a
task, so a failed task is retried), UI off, one shuffle partition, bound to 127.0.0.1,
PYSPARK_PYTHON set to this interpreter before it starts so the Python workers import
pyarrow and broker. All data source code runs in those workers, so the broker is a data
directory they open themselves (embedded) or a ServerThread on 127.0.0.1 (served).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

import broker.spark
from broker.client.client import connect
from support.servers import served
from support.spark_jobs import Broker, read, write


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_PYTHON", sys.executable)
        patch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        patch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        warehouse = tmp_path_factory.mktemp("spark-warehouse")
        session = (
            SparkSession.builder.master("local[2,3]")
            .appName("fencelog-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "1")
            .config("spark.default.parallelism", "2")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.sql.warehouse.dir", str(warehouse))
            .getOrCreate()
        )
        try:
            session.sparkContext.setLogLevel("ERROR")
            broker.spark.register(session)
            warm_up(session, tmp_path_factory.mktemp("warm-up") / "data")
            yield session
        finally:
            session.stop()
            stop_jvm()


def stop_jvm() -> None:
    """spark.stop() leaves the JVM running until this process exits; the rest of the test
    run has no use for it. It exits when its stdin closes."""
    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = gateway.proc
    gateway.shutdown()
    SparkContext._gateway = None  # a later session launches a new JVM
    SparkContext._jvm = None
    if process is None:
        return
    process.stdin.close()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


def warm_up(session: SparkSession, data_dir: Path) -> None:
    """One fencelog read and write, so the first test does not pay for the workers."""
    with connect(data_dir) as client:
        client.create_topic("warm", 1)
        client.produce("warm", [b"w"])
    url = str(data_dir)
    df = read(session, url, "warm")
    assert df.count() == 1
    write(df.select("value"), url, "warm")


@pytest.fixture
def embedded(tmp_path: Path) -> Broker:
    data_dir = tmp_path / "data"
    connect(data_dir).close()  # created, so every worker opens the same directory
    return Broker(str(data_dir))


@pytest.fixture(params=["embedded", "served"])
def any_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    data_dir = tmp_path / "data"
    if request.param == "embedded":
        connect(data_dir).close()
        yield Broker(str(data_dir))
        return
    with served(data_dir) as server:
        yield Broker(server.address)
