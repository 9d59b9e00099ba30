"""README's cluster section, run as written: a Spark standalone cluster on this machine
(a master and two workers, each a process of its own on 127.0.0.1), a broker served
with a token, and examples/spark_pipeline.py given `--master spark://...`, `--broker
tcp://...` and `--auth-token-file`. One worker is killed with SIGKILL (with its
executor and Python workers) once the pipeline has committed a micro-batch: Spark runs
the lost tasks again on the other worker, and the output still holds every input value
exactly once."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from broker.client.client import connect
from support import EXAMPLES
from support.helpers import user_env
from support.producing import free_port
from support.servers import ServeProcess, serving
from support.values import present
from support.waiting import wait_until

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
EXAMPLE = EXAMPLES / "spark_pipeline.py"
START_S = 90.0  # a JVM of the cluster up and registered
PIPELINE_S = 240.0
RECORDS = 20_000
PER_TRIGGER = 2_000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(START_S * 3 + PIPELINE_S + 60),
    pytest.mark.skipif(not SPARK_CLASS.exists(), reason="pyspark ships no bin/spark-class"),
]


def spark_env() -> dict[str, str]:
    return user_env(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
    )


class Daemon:
    """A master or worker JVM in a session of its own (the executors and Python workers
    a worker starts join its process group), its output in a log file."""

    def __init__(self, name: str, args: list[str], log: Path) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                [str(SPARK_CLASS), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=spark_env(),
                start_new_session=True,
            )

    def wait_for(self, pattern: str) -> None:
        def seen() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.tail()}")
            return re.search(pattern, self.log.read_text(errors="replace")) is not None

        wait_until(seen, START_S, interval_s=0.2, message=lambda: f"{self.name}: {pattern}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """SIGKILL to the whole process group: the JVM, its executors, their Python."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=30)


@contextlib.contextmanager
def cluster(work: Path) -> Iterator[tuple[str, list[Daemon]]]:
    """A master and two workers of one core each: spark://127.0.0.1:PORT."""
    daemons: list[Daemon] = []
    try:
        port = free_port()
        master = Daemon(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(port), "--webui-port", "0"),
            ],
            work / "master.log",
        )
        daemons.append(master)
        master.wait_for(r"Successfully started service 'sparkMaster'")
        url = f"spark://127.0.0.1:{port}"
        for n in (1, 2):
            worker = Daemon(
                f"worker-{n}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
                    *("--webui-port", "0", "--work-dir", str(work / f"worker-{n}")),
                ],
                work / f"worker-{n}.log",
            )
            daemons.append(worker)
        for worker in daemons[1:]:
            worker.wait_for(r"Successfully registered with master")
        yield url, daemons[1:]
    finally:
        for daemon in reversed(daemons):
            daemon.kill()


def executor_of(worker: Daemon) -> bool:
    """True once the worker runs an executor of the pipeline."""
    return "Asked to launch executor" in worker.log.read_text(errors="replace")


def test_readme_cluster_pipeline_survives_a_worker_killed_mid_batch(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("cluster-secret-token\n")
    token.chmod(0o600)
    served: ServeProcess
    with (
        cluster(tmp_path) as (master_url, workers),
        serving(
            tmp_path / "data",
            tmp_path / "ready.json",
            serve_args=["--auth-token-file", str(token)],
        ) as served,
    ):
        broker_url = served.address
        log = tmp_path / "pipeline.log"
        with log.open("wb") as out:
            driver = subprocess.Popen(
                [
                    sys.executable,
                    str(EXAMPLE),
                    *("--master", master_url, "--broker", broker_url),
                    *("--auth-token-file", str(token)),
                    *("--records", str(RECORDS), "--per-trigger", str(PER_TRIGGER)),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=tmp_path,
                env=spark_env(),
                start_new_session=True,
            )
        try:
            with connect(broker_url, token=token.read_text().strip()) as client:

                def output() -> int:
                    topics = {t.name: t for t in client.list_topics()}
                    return topics["orders_upper"].records if "orders_upper" in topics else 0

                # a micro-batch committed, the next one under way: kill a worker
                wait_until(
                    lambda: output() >= PER_TRIGGER and all(executor_of(w) for w in workers),
                    PIPELINE_S,
                    interval_s=0.2,
                    message=lambda: (
                        f"a first micro-batch: {log.read_text(errors='replace')[-2000:]}"
                    ),
                )
                assert output() < RECORDS, "the pipeline ended before a worker could be killed"
                workers[0].kill()
                assert driver.wait(timeout=PIPELINE_S) == 0, log.read_text(errors="replace")[-4000:]
                values = [present(r.value) for r in client.consume("orders_upper")]
                inputs = [present(r.value) for r in client.consume("orders")]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
    counts = collections.Counter(values)
    assert len(inputs) == RECORDS
    assert sorted(counts) == sorted(v.upper() for v in inputs)
    assert [v for v, n in counts.items() if n > 1] == []
    driver_log = log.read_text(errors="replace")
    assert "Lost executor 0" in driver_log or "Lost executor 1" in driver_log, driver_log[-4000:]
    assert f"input {RECORDS}, output {RECORDS}, duplicates 0, missing 0" in driver_log
