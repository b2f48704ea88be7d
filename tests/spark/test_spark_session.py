"""The installed pyspark is the full distribution (not the thin Connect client) and starts locally."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.spark


def test_full_pyspark_installed():
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    assert list(jars.glob("spark-core_2.13-*.jar")), "pyspark-client shadowed full pyspark"
    assert pyspark.__version__ == "4.2.0"


def test_local_session_with_kafka_connector_starts():
    from pyspark.sql import SparkSession

    from mirror_core import artifacts

    jars = artifacts.spark_kafka_jars(artifacts.cache_dir())
    assert any("spark-sql-kafka-0-10_2.13-4.2.0" in j for j in jars)
    spark = (SparkSession.builder.master("local[2]").appName("mirrorflow-smoke")
             .config("spark.jars", ",".join(jars)).config("spark.ui.enabled", "false").getOrCreate())
    try:
        assert spark.range(10).selectExpr("sum(id)").first()[0] == 45
        # the Kafka source class resolves (a bad bootstrap fails on connection, not on a missing class)
        reader = spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:1") \
            .option("subscribe", "nothing")
        assert reader.load().columns[:2] == ["key", "value"]
    finally:
        spark.stop()
