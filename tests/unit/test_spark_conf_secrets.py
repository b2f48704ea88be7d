"""A group's secret ``spark.conf`` values (interpolated from the environment) stay off the driver JVM's command
line, which ``ps`` shows every user of the host, and out of the config's repr and dumps."""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from mirror_core.config import parse_config

PLANTED = "AKIA-s3cr3t-VALUE"
SECRET_KEYS = ("spark.hadoop.fs.s3a.secret.key", "spark.ssl.keyStorePassword")


class _Stop(Exception):
    """Raised by the fake Popen: no JVM starts in a unit test."""


def _group(tmp_path: Path) -> Any:
    raw = yaml.safe_load(f"""
clusters: {{a: {{kafka: {{bootstrap.servers: "a:9092"}}}}, b: {{kafka: {{bootstrap.servers: "b:9092"}}}}}}
groups:
  - name: g
    source: a
    destination: b
    spark:
      master: local[1]
      checkpoint_dir: {tmp_path / "ckpt"}
      conf: {{spark.hadoop.fs.s3a.secret.key: "${{S3_SECRET}}", spark.ssl.keyStorePassword: "${{S3_SECRET}}",
              spark.hadoop.fs.s3a.endpoint: "http://s3:9000"}}
    mirrors: [{{source_topic: t}}]
""")
    return parse_config(raw, env={"S3_SECRET": PLANTED}).groups[0]


def test_secret_spark_conf_values_are_masked_in_the_configs_repr_and_dumps(tmp_path):
    spark = _group(tmp_path).spark
    for shown in (repr(spark), str(spark.model_dump()), spark.model_dump_json(), repr(spark.public_conf())):
        assert PLANTED not in shown, shown
    assert spark.secret_conf() == dict.fromkeys(SECRET_KEYS, PLANTED)
    assert spark.public_conf() == {"spark.hadoop.fs.s3a.endpoint": "http://s3:9000"}


def test_a_jvm_mirrorflow_starts_gets_secret_spark_conf_values_in_a_private_file_only(tmp_path, monkeypatch):
    """The fake Popen records spark-submit's argv and the properties file it names, as the JVM would read it."""
    import pyspark.java_gateway as gateway
    from pyspark import SparkContext

    from mirror_core import artifacts
    from spark_jobs import mirror_stream

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setenv("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", "python3"))
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setattr(SparkContext, "_gateway", None)
    monkeypatch.setattr(artifacts, "spark_kafka_jars", lambda cache, progress=None: [])
    seen: dict[str, Any] = {}

    def fake_popen(cmd: list[str], **kwargs: Any) -> None:
        seen["argv"] = list(cmd)
        path = Path(cmd[cmd.index("--properties-file") + 1])
        seen["mode"] = stat.S_IMODE(path.stat().st_mode)
        seen["dir_mode"] = stat.S_IMODE(path.parent.stat().st_mode)
        seen["file"] = path
        seen["text"] = path.read_text()
        raise _Stop()

    monkeypatch.setattr(gateway, "Popen", fake_popen)
    with pytest.raises(_Stop):
        mirror_stream.build_session(_group(tmp_path))

    argv = seen["argv"]
    assert not [a for a in argv if PLANTED in a], argv
    assert "--load-spark-defaults" in argv  # spark-defaults.conf is still read
    assert "spark.hadoop.fs.s3a.endpoint=http://s3:9000" in argv  # ordinary options as before
    assert seen["mode"] == 0o600 and seen["dir_mode"] == 0o700
    assert seen["file"].parent.name.startswith(mirror_stream.SECRET_CONF_PREFIX)
    assert sorted(seen["text"].splitlines()) == sorted(f"{k}={PLANTED}" for k in SECRET_KEYS)
    assert not seen["file"].parent.exists()  # gone once the JVM has started (or failed to)
    assert "PYSPARK_SUBMIT_ARGS" not in os.environ


def test_a_users_own_properties_file_is_refused_with_secret_options(tmp_path, monkeypatch):
    from mirror_core.errors import MirrorError
    from spark_jobs.mirror_stream import secret_conf_file

    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", f"--properties-file={shlex.quote(str(tmp_path / 'p'))} pyspark-shell")
    with pytest.raises(MirrorError, match="spark.hadoop.fs.s3a.secret.key") as err, \
            secret_conf_file({"spark.hadoop.fs.s3a.secret.key": PLANTED}):
        pass
    assert PLANTED not in str(err.value)
    with secret_conf_file({}):  # nothing secret: the user's arguments alone
        assert os.environ["PYSPARK_SUBMIT_ARGS"].startswith("--properties-file=")


def test_under_spark_submit_hadoop_secrets_go_to_the_running_contexts_hadoop_configuration():
    from spark_jobs.mirror_stream import set_hadoop_options

    hadoop: dict[str, str] = {}

    class _Conf:
        def set(self, k: str, v: str) -> None:
            hadoop[k] = v

    class _Session:
        class sparkContext:  # noqa: N801 - the attribute's name
            class _jsc:  # noqa: N801
                @staticmethod
                def hadoopConfiguration() -> _Conf:  # noqa: N802 - the JVM method's name
                    return _Conf()

    set_hadoop_options(_Session(), {"spark.hadoop.fs.s3a.secret.key": PLANTED,  # type: ignore[arg-type]
                                    "spark.ssl.keyStorePassword": PLANTED})
    assert hadoop == {"fs.s3a.secret.key": PLANTED}
