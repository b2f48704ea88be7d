"""The installed pyspark is the full distribution (not the thin Connect client) and starts locally."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]


def _own_jvm(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (Python, from the project root) in a process of its own, so that its session starts a
    driver JVM of its own (this process's JVM was started by an earlier test, with other options); ``env`` is
    added to this process's environment. Asserts that it exits 0."""
    full = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"} | env
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300,
                          env=full, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


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


_MANAGER_SCRIPT = r"""
import sys
from mirror_core.config import GroupConfig
from spark_jobs.mirror_stream import build_session

key = "spark.sql.streaming.checkpointFileManagerClass"
for ck, conf in (("s3a://b/ck", {}), (sys.argv[1], {}), (sys.argv[1], {key: sys.argv[2]})):
    group = GroupConfig.model_validate({"name": "g", "source": "a", "destination": "b", "spark": {
        "master": "local[1]", "checkpoint_dir": ck, "conf": conf}, "mirrors": [{"source_topic": "t"}]})
    spark = build_session(group, app_name="mirrorflow-ckpt")
    print(ck.split(":")[0], spark.conf.get(key, None) or "-")
    spark.stop()
"""


def test_local_checkpoints_use_the_file_system_manager_and_the_user_can_override_it(tmp_path):
    """Two checkpoint files are written per micro-batch: on a local disk the cheaper manager is used;
    other stores (s3a://, hdfs://) keep Spark's default, and a user's spark.conf wins. In a driver JVM of its
    own, s3a first: a JVM's first session leaves its settings to the sessions after it (a job has one)."""
    from spark_jobs.mirror_stream import LOCAL_CHECKPOINT_MANAGER, is_local_path

    assert is_local_path(".state/checkpoints") and is_local_path("/var/lib/x") and is_local_path("file:///x")
    assert not is_local_path("s3a://bucket/ck") and not is_local_path("hdfs://nn/ck")
    mine = "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
    ck = str(tmp_path / "ck")
    proc = _own_jvm(_MANAGER_SCRIPT, ck, mine)
    assert proc.stdout.splitlines()[-3:] == ["s3a -", f"{ck} {LOCAL_CHECKPOINT_MANAGER}", f"{ck} {mine}"]


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


_COMPILER_SCRIPT = r"""
import sys
from mirror_core.config import GroupConfig
from spark_jobs.mirror_stream import build_session

group = GroupConfig.model_validate({"name": "g", "source": "a", "destination": "b", "mirrors": [{"source_topic": "t"}],
                                    "spark": {"master": "local[1]", "checkpoint_dir": sys.argv[1],
                                              "read_path": sys.argv[2]}})
spark = build_session(group, app_name="mirrorflow-compiler")
jvm = spark._jvm
bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
    jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
print("level", bean.getVMOption("TieredStopAtLevel").getValue(), spark.range(5).count())
spark.stop()
"""


def test_a_direct_read_driver_jvm_runs_without_the_optimizing_compiler_and_a_spark_read_one_with_it(tmp_path):
    """With ``read_path: direct`` the writer processes move the records and the driver JVM only plans batches:
    it runs with the quick compiler alone (compiling took over half of its CPU on a 2-core machine). With
    Spark's read path the JVM reads and converts every record and keeps the optimizing one. A group's own
    driver options come after mirrorflow's, so a user can give it back."""
    from spark_jobs import jvm_archive

    logs = f"-Dlog4j2.configurationFile={jvm_archive.LOG_CONFIG}"
    assert jvm_archive.driver_options(tmp_path, "-Dmine=1") == f"{logs} -Dmine=1"
    assert jvm_archive.driver_options(tmp_path, "-XX:TieredStopAtLevel=4", direct=True) == \
        f"{logs} -XX:TieredStopAtLevel=1 -XX:TieredStopAtLevel=4"
    assert jvm_archive.submit_conf(tmp_path, "local[2]", "s3a://b/ck", {}, direct=True) == {
        "spark.driver.extraJavaOptions": f"{logs} -XX:TieredStopAtLevel=1"}
    for read_path, level in (("direct", "1"), ("spark", "4")):
        proc = _own_jvm(_COMPILER_SCRIPT, str(tmp_path / read_path), read_path)
        assert f"level {level} 5" in proc.stdout, (read_path, proc.stdout, proc.stderr[-2000:])


_CHECKPOINT_SCRIPT = r"""
import os, sys, time
os.umask(0o022)
from mirror_core.config import GroupConfig
from spark_jobs.mirror_stream import build_session

ck, extra = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
group = GroupConfig.model_validate({"name": "g", "source": "a", "destination": "b", "mirrors": [{"source_topic": "t"}],
                                    "spark": {"master": "local[1]", "checkpoint_dir": ck, "conf": extra}})
spark = build_session(group, app_name="mirrorflow-local-fs")
jvm = spark._jvm
conf = spark.sparkContext._jsc.hadoopConfiguration()
print("fs", jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf).getClass().getName())
print("vm", jvm.java.lang.System.getProperty("java.vm.info"))
q = (spark.readStream.format("rate").option("rowsPerSecond", 50).load().writeStream
     .foreachBatch(lambda df, n: time.sleep(0.15)).option("checkpointLocation", ck + "/q").trigger(processingTime="100 milliseconds")
     .start())
deadline = time.monotonic() + 120
while (q.lastProgress or {}).get("batchId", -1) < 3 and time.monotonic() < deadline:
    time.sleep(0.2)
print("batches", (q.lastProgress or {}).get("batchId", -1) + 1)
q.stop()
fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
for mode in (0o600, 0o640, 0o751):
    p = jvm.org.apache.hadoop.fs.Path("file://" + ck + "/mode-" + oct(mode))
    fs.create(p, True).close()
    fs.setPermission(p, jvm.org.apache.hadoop.fs.permission.FsPermission(mode))
spark.stop()
"""


def _checkpoint_run(tmp_path: Path, name: str, *extra: str) -> tuple[str, list[str], Path, str]:
    """A session on a local checkpoint in a fresh driver JVM whose PATH's ``chmod`` records each call."""
    bin_dir = tmp_path / f"bin-{name}"
    bin_dir.mkdir()
    calls = tmp_path / f"chmod-{name}.log"
    calls.touch()
    (bin_dir / "chmod").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec /bin/chmod "$@"\n')
    (bin_dir / "chmod").chmod(0o755)
    ck = tmp_path / f"ck-{name}"
    proc = _own_jvm(_CHECKPOINT_SCRIPT, str(ck), *extra, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return proc.stdout, calls.read_text().splitlines(), ck, proc.stderr


def test_local_checkpoints_are_written_without_a_chmod_process_per_file(tmp_path):
    """Hadoop's local file system without its native library starts `chmod` for every file it creates
    (a streaming query's offset and commit logs: several per micro-batch, 30-50 ms of each). `make test`
    built mirrorflow's java.nio one; a session on a local checkpoint uses it, sets the same modes, and the
    driver's class-data sharing archive still applies with its jar on the class path."""
    from mirror_core import artifacts
    from spark_jobs import jvm_archive, local_fs

    cache = artifacts.cache_dir()
    assert local_fs.existing_jar(cache) is not None, "mirrorflow local fetch did not build the jar (javac?)"
    out, calls, ck, err = _checkpoint_run(tmp_path, "nio")
    assert f"fs {local_fs.FS_CLASS}" in out
    assert "batches 4" in out or "batches 5" in out or "batches 6" in out, out
    if jvm_archive.java_options(cache):
        assert "sharing" in out, out  # the archive matched the class path
    # (Spark itself marks the jars it copies at start-up executable, once: not a checkpoint's cost)
    assert [c for c in calls if str(ck) in c] == [], calls[:5]
    offsets = sorted((ck / "q" / "offsets").iterdir())
    assert offsets and all(f.stat().st_mode & 0o777 == 0o644 for f in offsets)
    assert (ck / "q" / "commits").stat().st_mode & 0o777 == 0o755
    for mode in (0o600, 0o640, 0o751):
        assert (ck / f"mode-{oct(mode)}").stat().st_mode & 0o777 == mode
    # every batch took longer than the trigger: Spark's warning about it, on each batch, is not shown
    assert "falling behind" not in err, err[-2000:]

    # the control: Hadoop's own local file system (a user's fs.file.impl wins) forks chmod for each file
    out, calls, ck, _ = _checkpoint_run(tmp_path, "hadoop", "spark.hadoop.fs.file.impl=org.apache.hadoop.fs.LocalFileSystem")
    assert "fs org.apache.hadoop.fs.LocalFileSystem" in out
    assert len(calls) >= 8 and any(str(ck / "q" / "offsets") in c for c in calls), calls[:5]
    assert (ck / "mode-0o751").stat().st_mode & 0o777 == 0o751


def test_the_java_nio_file_system_is_only_set_where_its_class_is_there(monkeypatch, tmp_path):
    """Set before the JVM starts, and only when this session starts it with the jar, runs executors in it
    and the user chose no file system; otherwise a JVM without the class would fail on every local file."""
    from pyspark import SparkContext

    from spark_jobs import local_fs

    jar = tmp_path / "fs.jar"
    want = {"spark.hadoop.fs.file.impl": local_fs.FS_CLASS}
    monkeypatch.setattr(SparkContext, "_gateway", None)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert local_fs.session_conf("local[2]", jar, {}) == want
    assert local_fs.session_conf("local[2]", None, {}) == {}
    assert local_fs.session_conf("spark://h:7077", jar, {}) == {}
    assert local_fs.session_conf("local[2]", jar, {"spark.hadoop.fs.file.impl": "x.Y"}) == {}
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "4711")  # spark-submit started the JVM
    assert local_fs.session_conf("local[2]", jar, {}) == {}
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT")
    monkeypatch.setattr(SparkContext, "_gateway", object())  # an earlier session's JVM
    assert local_fs.session_conf("local[2]", jar, {}) == {}
    # nor after the JVM started (install), where the master is the one spark-submit gave: a cluster's is left
    # alone before the driver's Hadoop configuration (which Spark ships to executors) is touched
    from types import SimpleNamespace

    assert local_fs.install(SimpleNamespace(sparkContext=SimpleNamespace(master="spark://h:7077"))) is False


def test_spark_submit_gets_the_driver_options_the_session_would_give_it(tmp_path, monkeypatch):
    """Under spark-submit (Airflow's stream task) the driver JVM starts before the job's session: the class
    path, the archive, the log configuration and the file system come as --conf, a group's own driver options
    after mirrorflow's."""
    from spark_jobs import jvm_archive, local_fs

    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "conf"))  # none of the user's own there
    logs = f"-Dlog4j2.configurationFile={jvm_archive.LOG_CONFIG}"
    assert jvm_archive.submit_conf(tmp_path, "local[2]", "/ck", {}) == {
        "spark.driver.extraJavaOptions": logs}  # nothing built in this cache
    jar = local_fs.jar_path(tmp_path)
    assert jar is not None
    jar.parent.mkdir(parents=True)
    jar.write_bytes(b"PK")
    assert jvm_archive.submit_conf(tmp_path, "local[2]", "file:///ck", {}) == {
        "spark.driver.extraJavaOptions": logs, "spark.driver.extraClassPath": str(jar),
        "spark.hadoop.fs.file.impl": local_fs.FS_CLASS}
    mine = {"spark.driver.extraClassPath": "/opt/x.jar", "spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=/my.xml"}
    conf = jvm_archive.submit_conf(tmp_path, "local[2]", "/ck", mine)
    assert conf["spark.driver.extraClassPath"] == f"{jar}{os.pathsep}/opt/x.jar"
    assert conf["spark.driver.extraJavaOptions"] == f"{logs} -Dlog4j2.configurationFile=/my.xml"  # the last wins
    assert "spark.hadoop.fs.file.impl" not in jvm_archive.submit_conf(tmp_path, "spark://m:7077", "/ck", {})
    assert "spark.hadoop.fs.file.impl" not in jvm_archive.submit_conf(tmp_path, "local[2]", "s3a://b/ck", {})
    assert "spark.hadoop.fs.file.impl" not in jvm_archive.submit_conf(
        tmp_path, "local[2]", "/ck", {"spark.hadoop.fs.file.impl": "x.Y"})


def test_a_log4j2_file_in_sparks_conf_directory_keeps_its_place(tmp_path, monkeypatch):
    """A user who configures Spark's logging the usual way (``log4j2.properties`` in ``$SPARK_CONF_DIR``,
    which spark-submit puts on the class path) keeps it: mirrorflow names no file of its own then."""
    from spark_jobs import jvm_archive

    conf = tmp_path / "conf"
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    assert jvm_archive.log_options() == [f"-Dlog4j2.configurationFile={jvm_archive.LOG_CONFIG}"]
    assert jvm_archive.LOG_CONFIG.is_file()
    conf.mkdir()
    (conf / "log4j2.properties").write_text("rootLogger.level = info\n")
    assert jvm_archive.log_options() == []
    assert jvm_archive.driver_options(tmp_path, "-Dmine=1") == "-Dmine=1"


def test_a_local_driver_without_a_ui_binds_to_the_loopback_address(monkeypatch):
    """A local master's executors run in the driver's JVM, so with no Spark UI nothing on another host talks
    to it: SPARK_LOCAL_IP=127.0.0.1 (no warning that the host name resolves to a loopback address). A cluster
    master, a UI turned on or a SPARK_LOCAL_IP of the user's own leave Spark's choice alone."""
    from spark_jobs import jvm_archive

    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    assert jvm_archive.driver_env("local[2]", {}) == {"SPARK_LOCAL_IP": "127.0.0.1"}
    assert jvm_archive.driver_env("local[*]", {"spark.ui.enabled": "false"}) == {"SPARK_LOCAL_IP": "127.0.0.1"}
    assert jvm_archive.driver_env("local[2]", {"spark.ui.enabled": "True"}) == {}
    assert jvm_archive.driver_env("spark://m:7077", {}) == {}
    assert jvm_archive.driver_env("yarn", {}) == {}
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.0.0.5")
    assert jvm_archive.driver_env("local[2]", {}) == {}


_SCRATCH_SCRIPT = r"""
import sys
from mirror_core.config import GroupConfig
from spark_jobs.mirror_stream import build_session

group = GroupConfig.model_validate({"name": "g", "source": "a", "destination": "b", "spark": {
    "master": "local[1]", "checkpoint_dir": sys.argv[1]}, "mirrors": [{"source_topic": "t"}]})
spark = build_session(group, app_name="mirrorflow-scratch")
jvm = spark.sparkContext._jvm
manager = getattr(getattr(jvm.org.apache.spark.sql.artifact, "ArtifactManager$"), "MODULE$")
print("tmpdir", jvm.java.lang.System.getProperty("java.io.tmpdir"))
print("artifacts", manager.artifactRootDirectory().toString())
print("local.dir", spark.conf.get("spark.local.dir", "-"))
spark.stop()
"""


def test_a_job_that_starts_the_driver_jvm_keeps_sparks_files_in_its_private_directory(tmp_path):
    """The JVM's temporary directory is the job's private one, removed when the job exits: Spark keeps its
    scratch files and its artifact directory there, which a killed JVM used to leave in the machine's /tmp
    (an empty ``artifacts-<uuid>`` for each kill). Set as a JVM option, not ``spark.local.dir`` (Spark warns
    about that at every start)."""
    from spark_jobs.mirror_stream import SPARK_SCRATCH_PREFIX

    (tmp_path / "tmp").mkdir()
    out = _own_jvm(_SCRATCH_SCRIPT, str(tmp_path / "ck"), TMPDIR=str(tmp_path / "tmp")).stdout
    got = dict(line.split(" ", 1) for line in out.splitlines() if line.split(" ", 1)[0] in
               ("tmpdir", "artifacts", "local.dir"))
    private = Path(got["tmpdir"])
    assert private.parent == tmp_path / "tmp" and private.name.startswith(SPARK_SCRATCH_PREFIX), got
    assert Path(got["artifacts"]).parent == private, got
    assert got["local.dir"] == "-", got
    assert not private.exists()  # removed on the job's way out
    assert list((tmp_path / "tmp").iterdir()) == []


def test_where_a_job_keeps_sparks_scratch_files(monkeypatch):
    """Its own JVM, any master: the JVM's temporary directory, unless the driver's options name one;
    spark-submit's JVM: ``spark.local.dir`` on a local master whose group sets none, else Spark's choice."""
    from spark_jobs import mirror_stream

    monkeypatch.setattr(mirror_stream, "_private_scratch", lambda: Path("/tmp/mine"))
    for master in ("local[2]", "spark://h:7077"):
        assert mirror_stream.scratch_dir(master, {}, "-Dx=1", starts_jvm=True) == Path("/tmp/mine")
        assert mirror_stream.scratch_dir(master, {}, "-Djava.io.tmpdir=/big -Dx=1", starts_jvm=True) is None
    assert mirror_stream.scratch_dir("local[2]", {}, "", starts_jvm=False) == Path("/tmp/mine")
    assert mirror_stream.scratch_dir("local[2]", {"spark.local.dir": "/big"}, "", starts_jvm=False) is None
    assert mirror_stream.scratch_dir("spark://h:7077", {}, "", starts_jvm=False) is None


_SPECULATION_SCRIPT = r"""
from mirror_core.config import GroupConfig
from spark_jobs.mirror_stream import build_session

group = GroupConfig.model_validate({"name": "g", "source": "a", "destination": "b", "spark": {
    "master": "local[1]"}, "mirrors": [{"source_topic": "t"}]})
spark = build_session(group, app_name="mirrorflow-speculation")
conf = spark.sparkContext.getConf()
print(conf.get("spark.speculation.multiplier"), conf.get("spark.speculation"))
spark.stop()
"""


def test_a_clusters_speculation_default_is_turned_off_for_the_job(tmp_path):
    """A cluster whose ``spark-defaults.conf`` turns speculation on (some do, for batch jobs): the job runs
    without it, so no two attempts of one task write the same records at once (a mirror's ``spark.conf`` cannot
    turn it on either: the config is rejected). The cluster's other defaults still apply."""
    (tmp_path / "spark-defaults.conf").write_text("spark.speculation true\nspark.speculation.multiplier 3\n")
    proc = _own_jvm(_SPECULATION_SCRIPT, SPARK_CONF_DIR=str(tmp_path))
    assert proc.stdout.splitlines()[-1] == "3 false"
