"""A local file system for Spark's checkpoint that sets permissions without starting a process.

Spark writes two small files per micro-batch into a streaming query's checkpoint (its offset log and
commit log), each with a checksum file beside it. Without Hadoop's native library, which pyspark does
not ship, Hadoop's local file system sets each new file's permissions by starting ``chmod`` from the
driver's JVM. On the 2-core reference machine that made ``walCommit`` and ``commitOffsets`` 12-13 ms
each (medians of 60 batches, 10,000 records/s, 50 ms trigger) and a whole micro-batch 96-107 ms; with
the permissions set through java.nio (``java/NioLocalFileSystem.java``) they were 2-3 ms and 65-80 ms.

``python -m spark_jobs.jvm_archive`` (so ``mirrorflow local fetch``, ``make demo`` and ``make test``)
compiles the class into the artifact cache with the JDK's ``javac`` against pyspark's Hadoop jar.
``build_session`` puts the jar on the driver's class path whenever it exists (the driver's class-data
sharing archive is made with the same class path, which it must match) and, for a checkpoint on a
local disk and a ``local[...]`` master, makes it the driver's ``file:`` file system before the JVM starts;
under ``spark-submit`` the same comes as ``--conf`` (``jvm_archive.submit_conf``, used by Airflow's stream
task). Without a ``javac``, or in a JVM started without the jar, Spark keeps its own file system: it only
saves time.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from mirror_core.joblock import local_path

log = logging.getLogger("mirrorflow.local_fs")

FS_CLASS = "io.mirrorflow.hadoop.NioLocalFileSystem"
SOURCE = Path(__file__).parent / "java" / "NioLocalFileSystem.java"


def is_local_path(location: str) -> bool:
    """A checkpoint location on this machine's file system (no scheme, a drive letter, or ``file:``)."""
    return local_path(location) is not None


def _hadoop_jar() -> Path | None:
    import pyspark

    found = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    return found[-1] if found else None


def jar_path(cache: Path) -> Path | None:
    """Where the jar for this source and pyspark's Hadoop lives (None: pyspark has no Hadoop jar)."""
    hadoop = _hadoop_jar()
    if hadoop is None:
        return None
    digest = hashlib.sha256(SOURCE.read_bytes() + hadoop.name.encode()).hexdigest()[:12]
    return cache / "jvm" / f"mirrorflow-local-fs-{digest}.jar"


def existing_jar(cache: Path) -> Path | None:
    """The jar, if it was built for this source and this Hadoop."""
    path = jar_path(cache)
    return path if path is not None and path.is_file() else None


def build(cache: Path, timeout: float = 300.0) -> Path | None:
    """Compile the class unless its jar exists; None when it cannot be built here (no ``javac``, or it
    failed): the jobs then keep Hadoop's own local file system."""
    target = jar_path(cache)
    if target is None:
        log.warning("pyspark has no hadoop-client-api jar: Spark keeps its own local file system")
        return None
    if target.is_file():
        return target
    javac = shutil.which("javac")
    if javac is None:
        log.warning("no javac (a JDK's compiler) on PATH: Spark keeps its own local file system, which starts a "
                    "chmod process for every checkpoint file")
        return None
    hadoop = _hadoop_jar()
    with tempfile.TemporaryDirectory(prefix="mirrorflow-local-fs-") as tmp:
        classes = Path(tmp) / "classes"
        try:
            proc = subprocess.run([javac, "--release", "17", "-nowarn", "-cp", str(hadoop), "-d", str(classes),
                                   str(SOURCE)], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("compiling %s took over %.0f s; Spark keeps its own local file system", SOURCE.name, timeout)
            return None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            log.warning("could not compile %s (exit %s): %s", SOURCE.name, proc.returncode, " | ".join(tail))
            return None
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f"{target.name}.tmp")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as jar:
            for f in sorted(classes.rglob("*.class")):
                jar.write(f, f.relative_to(classes).as_posix())
        part.replace(target)
    return target


def starts_jvm() -> bool:
    """The next session of this process starts the driver JVM, so options for the JVM itself still apply: none
    runs in the process yet, and ``spark-submit`` did not start one for it."""
    from pyspark import SparkContext

    return SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ


def session_conf(master: str, fs_jar: Path | None, user_conf: dict[str, str]) -> dict[str, str]:
    """What a session for a local checkpoint sets before its driver JVM starts: the java.nio file system,
    when this session starts the JVM (so the jar is on its class path), runs in it (``local[...]``: an
    executor elsewhere may not have the jar) and the user configured no ``fs.file.impl`` of their own.
    Set before the JVM starts because Spark caches the ``file:`` file system while it adds ``spark.jars``."""
    if fs_jar is None or not starts_jvm() or not master.startswith("local") or "spark.hadoop.fs.file.impl" in user_conf:
        return {}
    return {"spark.hadoop.fs.file.impl": FS_CLASS}


def install(spark: Any) -> bool:
    """Make the session driver's ``file:`` file system the java.nio one where :func:`session_conf` could not
    (a JVM started before), on a ``local[...]`` master, if the class is on its class path and no
    ``fs.file.impl`` was configured. Only new file system instances use it; Spark may already have cached one.
    True when the driver's is it."""
    if not str(spark.sparkContext.master).startswith("local"):
        return False  # an executor elsewhere may lack the jar (the master spark-submit gave, not the group's)
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    if conf.get("fs.file.impl") not in (None, "", FS_CLASS):
        return False  # the user chose one
    try:
        jvm.java.lang.Class.forName(FS_CLASS)
    except Exception:  # py4j's error: the class is not on this JVM's class path
        return False
    conf.set("fs.file.impl", FS_CLASS)
    return str(jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
               .getClass().getName()) == FS_CLASS
