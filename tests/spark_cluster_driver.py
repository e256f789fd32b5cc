"""The driver of test_spark_cluster.py, run in its own process (a Python process holds one
SparkContext, and the suite's is local): reads PATH with the ``ambrosia`` data source on
the standalone cluster at MASTER and prints, as one JSON line, the rows (``commit_time``
in µs, binaries in hex) and where they were read.

Usage: python spark_cluster_driver.py MASTER PATH SPLIT_BYTES
"""

from __future__ import annotations

import json
import sys

from ambrosia_py.spark import cluster_session

QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def main() -> None:
    master, path, split = sys.argv[1:4]
    spark = cluster_session(
        master,
        app_name="ambrosia-cluster-test",
        executor_memory="512m",
        driver_host="127.0.0.1",
        conf={
            "spark.executor.cores": "2",
            "spark.sql.shuffle.partitions": "1",
            # Short-lived JVMs on a small machine: the quick compiler only.
            "spark.driver.extraJavaOptions": QUICK_JVM,
            "spark.executor.extraJavaOptions": QUICK_JVM,
        },
    )
    try:
        from pyspark.sql import functions as F

        df = spark.read.format("ambrosia").option("split_bytes", split).load(path)
        df = df.withColumn("commit_time", F.unix_micros("commit_time"))
        rows = []
        partitions = set()
        # One job (planning the Python data source is the slow part of a small query).
        for row in df.withColumn("partition", F.spark_partition_id()).collect():
            d = row.asDict()
            partitions.add(d.pop("partition"))
            if d["payload"] is not None:
                d["payload"] = bytes(d["payload"]).hex()
            rows.append(d)
        # The JVMs that ran tasks: the driver and the cluster's executors.
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        result = {"rows": rows, "partitions": len(partitions), "executors": executors}
        print(json.dumps({"result": result}), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
