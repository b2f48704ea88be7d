"""The installed pyspark is the full distribution (not the thin Connect client) and starts locally."""

from __future__ import annotations

import subprocess
import sys
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


def test_driver_jvm_archive_is_used_when_present_and_a_bad_one_does_not_stop_spark(tmp_path):
    """The archive only saves start time: none means no option; one the JVM cannot use (another JDK,
    another class path, a damaged file) is ignored by the JVM and the session starts as before."""
    from spark_jobs import jvm_archive

    assert jvm_archive.java_options(tmp_path) == []
    path = jvm_archive.archive_path(tmp_path)
    assert path is not None and path.parent == tmp_path / "jvm"
    path.parent.mkdir()
    path.write_bytes(b"not a class-data sharing archive" * 100)
    opts = jvm_archive.java_options(tmp_path)
    assert opts == [f"-XX:SharedArchiveFile={path}"]
    assert jvm_archive.build(tmp_path) == path  # there already: not made again
    # a JVM of its own (this process's JVM was started by an earlier test, with other options)
    code = ("import sys; from pyspark.sql import SparkSession; "
            "s = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false')"
            ".config('spark.driver.extraJavaOptions', sys.argv[1]).getOrCreate(); "
            "args = [str(a) for a in s._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()"
            ".getInputArguments()]; "
            "print('archive option passed' if sys.argv[1] in args else 'archive option missing', s.range(5).count())")
    proc = subprocess.run([sys.executable, "-c", code, opts[0]], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "archive option passed 5" in proc.stdout
