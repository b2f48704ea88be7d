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


def test_local_checkpoints_use_the_file_system_manager_and_the_user_can_override_it():
    """Two checkpoint files are written per micro-batch: on a local disk the cheaper manager is used;
    other stores (s3a://, hdfs://) keep Spark's default, and a user's spark.conf wins."""
    from mirror_core.config import GroupConfig
    from spark_jobs.mirror_stream import LOCAL_CHECKPOINT_MANAGER, build_session, is_local_path

    assert is_local_path(".state/checkpoints") and is_local_path("/var/lib/x") and is_local_path("file:///x")
    assert not is_local_path("s3a://bucket/ck") and not is_local_path("hdfs://nn/ck")

    def group(spark: dict) -> GroupConfig:
        return GroupConfig.model_validate({"name": "g", "source": "a", "destination": "b", "spark": spark,
                                           "mirrors": [{"source_topic": "t"}]})

    key = "spark.sql.streaming.checkpointFileManagerClass"
    spark = build_session(group({"checkpoint_dir": "/tmp/ck"}), app_name="mirrorflow-ckpt")
    try:
        assert spark.conf.get(key) == LOCAL_CHECKPOINT_MANAGER
    finally:
        spark.stop()
    spark = build_session(group({"checkpoint_dir": "s3a://b/ck"}), app_name="mirrorflow-ckpt")
    try:
        assert spark.conf.get(key, None) in (None, "")
    finally:
        spark.stop()
    mine = "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
    spark = build_session(group({"checkpoint_dir": "/tmp/ck", "conf": {key: mine}}), app_name="mirrorflow-ckpt")
    try:
        assert spark.conf.get(key) == mine
    finally:
        spark.stop()
