"""A class-data sharing (CDS) archive for the Spark driver JVM: each mirror job starts faster.

Every start of the driver JVM loads and verifies some ten thousand classes from pyspark's jars. On the
2-core reference machine a local session took 9.4 s to start and 4.9 s for its first job; with a
dynamic CDS archive (JDK 13+) the JVM maps those classes instead, and the figures were 5.9 s and 2.3 s.

``python -m spark_jobs.jvm_archive`` (run by ``mirrorflow local fetch``, so by ``make demo`` and
``make test``) writes the archive into the artifact cache: it runs a short, representative Spark job
in a JVM started with ``-XX:ArchiveClassesAtExit`` and keeps the file once that JVM has exited.
:func:`java_options` gives ``build_session`` the option that uses it, when one exists for this JVM and
these jars (the file name carries a digest of both, and of the driver's extra class path: the jar of
:mod:`spark_jobs.local_fs`, built first). The JVM checks the archive itself: one made by
another JDK or for another class path is ignored with a warning, and the job starts as before.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import mirror_core
from mirror_core import clients
from spark_jobs import local_fs

log = logging.getLogger("mirrorflow.jvm_archive")


def _java() -> Path | None:
    """The ``java`` pyspark starts: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_path(cache: Path) -> Path | None:
    """Where the archive for this JVM and pyspark's jars lives (None: no java found)."""
    import pyspark

    java = _java()
    if java is None:
        return None
    jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    st = java.stat()
    fs_jar = local_fs.existing_jar(cache)  # on the driver's class path when it exists
    key = "\n".join([str(java), str(st.st_size), str(int(st.st_mtime)), pyspark.__version__, *jars,
                     *([str(fs_jar)] if fs_jar else [])])
    return cache / "jvm" / f"spark-driver-{hashlib.sha256(key.encode()).hexdigest()[:12]}.jsa"


def java_options(cache: Path) -> list[str]:
    """Driver JVM options that use the archive, if one was made for this JVM and these jars."""
    path = archive_path(cache)
    return [f"-XX:SharedArchiveFile={path}"] if path is not None and path.is_file() else []


#: The log configuration of a driver JVM that mirrorflow starts (warnings and errors, in the format of
#: mirrorflow's own lines; Hadoop's native-library warning left out)
LOG_CONFIG = Path(mirror_core.__file__).resolve().parent / "resources" / "spark-driver-log4j2.properties"
#: files log4j finds on the driver's class path, of which Spark's conf directory is part
_LOG_CONFIG_NAMES = [f"log4j2{ext}" for ext in (".properties", ".xml", ".yaml", ".yml", ".json", ".jsn")]


def spark_conf_dir() -> Path | None:
    """The conf directory ``spark-submit`` puts on the driver's class path: ``$SPARK_CONF_DIR``, else
    ``$SPARK_HOME/conf`` (with pyspark's own directory as ``SPARK_HOME`` when it is unset)."""
    if os.environ.get("SPARK_CONF_DIR"):
        return Path(os.environ["SPARK_CONF_DIR"])
    try:
        from pyspark.find_spark_home import _find_spark_home

        return Path(os.environ.get("SPARK_HOME") or _find_spark_home()) / "conf"
    except Exception:  # noqa: BLE001 - no Spark found: spark-submit will say so
        return None


def log_options() -> list[str]:
    """The driver JVM's log configuration: :data:`LOG_CONFIG`, unless Spark's conf directory has a log4j2
    file (the user's own, which log4j then finds). Without a file log4j's default configuration printed
    Spark's start-up warnings in another format than mirrorflow's lines, without the logger's name, and
    Hadoop's warning that it has no native library at every start."""
    conf = spark_conf_dir()
    if conf is not None and any((conf / name).is_file() for name in _LOG_CONFIG_NAMES):
        return []
    return [f"-Dlog4j2.configurationFile={LOG_CONFIG}"]


#: the driver JVM's options with ``read_path: direct`` or ``executors`` (mirrorflow's readers read the records and
#: the JVM only plans micro-batches): its quick compiler alone. With both, at 24 partitions of 1 KB records the JVM
#: spent about 8 s of CPU on a mirror of 1,000,000 records, over half of it compiling (C2 3.7 s, C1 1.8 s) beside
#: the brokers and writers on a 2-core machine; with the quick one alone, about 4 s, the run as long.
DIRECT_READ_OPTIONS = ("-XX:TieredStopAtLevel=1",)


def driver_options(cache: Path, user_options: str = "", direct: bool = False) -> str:
    """``spark.driver.extraJavaOptions`` for a driver JVM mirrorflow starts: the log options, the archive and,
    for a group whose driver JVM only plans (``read_path: direct`` or ``executors``), :data:`DIRECT_READ_OPTIONS`,
    then a group's own (which win where they overlap: a JVM takes the last ``-D`` of a name, and the last
    ``-XX`` of a flag)."""
    return " ".join([*log_options(), *java_options(cache), *(DIRECT_READ_OPTIONS if direct else ()),
                     user_options]).strip()


def driver_env(master: str, conf: dict[str, str]) -> dict[str, str]:
    """Environment for a driver JVM mirrorflow starts. With a local master and no Spark UI nothing on another
    host talks to the driver (its executors are in its JVM), so it binds to the loopback address: Spark
    otherwise looks for another address and warns at every start that the host name resolves to a loopback
    one ("Set SPARK_LOCAL_IP if you need to bind to another address"). A ``SPARK_LOCAL_IP`` already set, or
    a Spark UI turned on (which binds to ``SPARK_LOCAL_IP`` when it is set), leaves it to Spark."""
    if not master.startswith("local") or "SPARK_LOCAL_IP" in os.environ:
        return {}
    if conf.get("spark.ui.enabled", "false").strip().lower() == "true":
        return {}
    return {"SPARK_LOCAL_IP": "127.0.0.1"}


def submit_conf(cache: Path, master: str, checkpoint_dir: str, user_conf: dict[str, str],
                direct: bool = False) -> dict[str, str]:
    """``--conf`` entries for a driver JVM that ``spark-submit`` starts (Airflow's stream task), where the
    session's own options come too late: what ``build_session`` gives the JVM it starts itself (``direct``:
    the group's driver JVM only plans, ``read_path: direct`` or ``executors``). A group's own ``spark.conf``
    options for the driver JVM come after mirrorflow's (so theirs win)."""
    conf = {"spark.driver.extraJavaOptions": driver_options(
        cache, user_conf.get("spark.driver.extraJavaOptions", ""), direct)}
    fs_jar = local_fs.existing_jar(cache)
    if fs_jar is not None:
        mine = user_conf.get("spark.driver.extraClassPath")
        conf["spark.driver.extraClassPath"] = f"{fs_jar}{os.pathsep}{mine}" if mine else str(fs_jar)
        if local_fs.is_local_path(checkpoint_dir) and master.startswith("local") \
                and "spark.hadoop.fs.file.impl" not in user_conf:
            conf["spark.hadoop.fs.file.impl"] = local_fs.FS_CLASS
    return conf


#: the JVM option that names its temporary directory (``java.io.tmpdir``)
TMPDIR_OPTION = "-Djava.io.tmpdir="


def with_tmpdir(options: str, path: Path) -> str | None:
    """The JVM ``options`` with its temporary directory set to ``path``; None when they name one of their own,
    or when ``path`` holds a blank (the options are split at blanks)."""
    if TMPDIR_OPTION in options or any(c.isspace() for c in str(path)):
        return None
    return f"{TMPDIR_OPTION}{path} {options}".strip()


#: the private temporary directory of a ``spark-submit`` JVM (:func:`submit_tmpdir`): this, the id of the process
#: that starts it (the stream DAG's task), ``-``, its host's hash, ``-`` (see :func:`mirror_core.clients.private_dir`)
SUBMIT_TMP_PREFIX = "mirrorflow-submit-"


@contextlib.contextmanager
def submit_tmpdir(conf: dict[str, str]) -> Iterator[dict[str, str]]:
    """``conf`` with the driver JVM's temporary directory (``-Djava.io.tmpdir``) set to a private directory
    of this process, removed when the block ends. Under ``spark-submit`` the JVM (spark-submit's own, the
    driver) keeps there what it removes only when it ends normally: the directory ``spark-submit`` fetches
    into (``spark-<uuid>``) and Spark's artifact directory (``artifacts-<uuid>``). The provider's ``on_kill``
    SIGKILLs ``spark-submit``: each kill left both in the machine's ``/tmp``. One left by a task process that
    was itself killed is removed when the next task on the host makes its own. ``conf`` unchanged when its
    driver options name a temporary directory, or when the directory's path holds a blank (the options are
    split at blanks)."""
    options = conf.get("spark.driver.extraJavaOptions", "")
    if TMPDIR_OPTION in options:
        yield conf
        return
    path = clients.private_dir(SUBMIT_TMP_PREFIX)
    try:
        given = with_tmpdir(options, path)
        yield conf if given is None else {**conf, "spark.driver.extraJavaOptions": given}
    finally:
        shutil.rmtree(path, ignore_errors=True)


def build(cache: Path, timeout: float = 600.0) -> Path | None:
    """Make the archive unless it exists; None when it cannot be made here (the jobs then start
    without one: it only saves time)."""
    target = archive_path(cache)
    if target is None:
        log.warning("no java found: no class-data sharing archive")
        return None
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("making the Spark driver's class-data sharing archive %s (once, about 40 s)", target)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        proc = subprocess.run([sys.executable, "-m", "spark_jobs.jvm_archive", "--train", str(tmp)],
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            log.warning("could not make the class-data sharing archive (exit %s): %s", proc.returncode,
                        " | ".join(tail))
            return None
        os.replace(tmp, target)  # whole, since the JVM that wrote it has exited
        return target
    except subprocess.TimeoutExpired:
        log.warning("making the class-data sharing archive took over %.0f s; skipped", timeout)
        return None
    finally:
        tmp.unlink(missing_ok=True)


def train(out: Path) -> None:
    """Run what a mirror job's driver runs (session, Arrow collect, a Python UDF over Arrow, the Kafka
    source's classes) in a JVM that writes the classes it loaded to ``out`` when it exits."""
    import pyarrow as pa
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from mirror_core import artifacts

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    cache = artifacts.cache_dir()
    jars = artifacts.spark_kafka_jars(cache)
    builder = (SparkSession.builder.master("local[2]").appName("mirrorflow-jvm-archive")
               .config("spark.jars", ",".join(jars)).config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.extraJavaOptions", " ".join([f"-XX:ArchiveClassesAtExit={out}", *log_options()])))
    fs_jar = local_fs.existing_jar(cache)
    if fs_jar is not None:  # the class path build_session gives the driver, which the archive must match
        builder = builder.config("spark.driver.extraClassPath", str(fs_jar))
    spark = builder.getOrCreate()
    if fs_jar is not None:
        local_fs.install(spark)
    df = spark.range(0, 20000, 1, 4).selectExpr("id", "cast(id as string) as s", "encode(cast(id as string), 'utf-8') as b")
    assert df.toArrow().num_rows == 20000

    def double(batches):  # type: ignore[no-untyped-def]
        for b in batches:
            yield pa.RecordBatch.from_pydict({"id": pa.compute.multiply(b.column(0), 2)})

    assert df.select("id").mapInArrow(double, "id long").count() == 20000
    spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:1") \
        .option("subscribe", "mirrorflow-archive").load()
    gateway = SparkContext._gateway
    spark.stop()
    if gateway is not None and getattr(gateway, "proc", None) is not None:
        gateway.shutdown()
        gateway.proc.stdin.close()  # the JVM exits on end of input, writing the archive first
        gateway.proc.wait(300)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="jvm_archive", description=__doc__.splitlines()[0])
    ap.add_argument("--train", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    if args.train:
        train(Path(args.train))
        return 0
    from mirror_core import artifacts

    cache = artifacts.cache_dir()
    fs_jar = local_fs.build(cache)  # first: it is on the class path the archive is made for
    print(f"local checkpoint file system: {fs_jar or 'none (Spark keeps its own)'}")
    path = build(cache)
    print(f"jvm class-data sharing archive: {path or 'none (jobs start without one)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
