"""Java artifacts from Maven Central, fetched once with ``mvn`` into the cache.

One place names every JVM artifact the project runs (Kafka broker and tools,
MirrorMaker 2, the schema registry, Spark's Kafka connector), so the demo, the
tests and the benchmarks all use the same versions. A second fetch is a no-op:
each bundle writes a ``.complete`` marker after its files are in place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mirror_core.errors import LocalClusterError, PrerequisiteError

KAFKA_VERSION = "4.1.1"
APICURIO_VERSION = "3.3.3"
#: pyspark is pinned to the same version (see pyproject.toml); the connector must match it.
SPARK_VERSION = "4.2.0"
LOG4J_VERSION = "2.24.3"
SLF4J_VERSION = "2.0.17"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Coordinate:
    group: str
    artifact: str
    version: str
    exclusions: tuple[str, ...] = ()  # "group:artifact"

    def pom_xml(self) -> str:
        excl = "".join(
            f"<exclusion><groupId>{e.split(':')[0]}</groupId><artifactId>{e.split(':')[1]}</artifactId></exclusion>"
            for e in self.exclusions
        )
        excl = f"<exclusions>{excl}</exclusions>" if excl else ""
        return (
            f"<dependency><groupId>{self.group}</groupId><artifactId>{self.artifact}</artifactId>"
            f"<version>{self.version}</version>{excl}</dependency>"
        )


#: Broker, admin tools, MirrorMaker 2 (bench, interop tests) and their logging, on one classpath.
KAFKA_BUNDLE = (
    Coordinate("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
    Coordinate("org.apache.kafka", "kafka-tools", KAFKA_VERSION),
    Coordinate("org.apache.kafka", "connect-mirror", KAFKA_VERSION),
    Coordinate("org.apache.kafka", "connect-mirror-client", KAFKA_VERSION),
    Coordinate("org.slf4j", "slf4j-api", SLF4J_VERSION),
    Coordinate("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
    Coordinate("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
)

#: Spark's own Kafka source and what pyspark does not already ship.
SPARK_KAFKA_BUNDLE = (
    Coordinate(
        "org.apache.spark", "spark-sql-kafka-0-10_2.13", SPARK_VERSION,
        # pyspark's own jars/ already has these (other versions would clash on the classpath)
        exclusions=("org.apache.spark:spark-tags_2.13", "org.slf4j:slf4j-api", "com.google.code.findbugs:jsr305",
                    "org.apache.hadoop:hadoop-client-runtime", "org.apache.hadoop:hadoop-client-api",
                    "org.scala-lang:scala-library", "org.scala-lang.modules:scala-parallel-collections_2.13",
                    "org.lz4:lz4-java", "at.yawk.lz4:lz4-java", "org.xerial.snappy:snappy-java", "com.github.luben:zstd-jni"),
    ),
)


def cache_dir(project_root: Path | None = None) -> Path:
    """``$MIRRORFLOW_CACHE``, else ``<project>/.cache`` (git-ignored)."""
    env = os.environ.get("MIRRORFLOW_CACHE")
    if env:
        return Path(env).resolve()
    root = project_root or Path(__file__).resolve().parent.parent
    return root / ".cache"


def require_tool(name: str, why: str) -> str:
    path = shutil.which(name)
    if not path:
        raise PrerequisiteError(f"'{name}' is not on PATH; it is needed to {why}. Install it and retry.")
    return path


def _mvn(args: list[str], cwd: Path, cache: Path, log: Path) -> None:
    mvn = require_tool("mvn", "fetch the Kafka / registry / Spark artifacts from Maven Central (once)")
    cmd = [mvn, "-B", "-q", f"-Dmaven.repo.local={cache / 'm2'}", *args]
    with log.open("ab") as fh:
        rc = subprocess.call(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT)
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise LocalClusterError(f"mvn failed (exit {rc}): {' '.join(args[:2])}; see {log}\n" + "\n".join(tail))


def fetch_classpath(name: str, coords: tuple[Coordinate, ...], cache: Path, progress: Progress | None = None) -> Path:
    """Resolve ``coords`` with their runtime dependencies into ``cache/<name>/lib``; returns that dir."""
    digest = hashlib.sha256(repr(coords).encode()).hexdigest()[:8]
    target = cache / f"{name}-{digest}"  # a change of coordinates fetches afresh
    lib = target / "lib"
    if (target / ".complete").exists():
        return lib
    if progress:
        progress(f"fetching {name} jars with mvn into {target} (first run only)...")
    target.mkdir(parents=True, exist_ok=True)
    if lib.exists():
        shutil.rmtree(lib)
    pom = (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>mirrorflow.fetch</groupId><artifactId>{name}</artifactId><version>0</version>"
        "<dependencies>" + "".join(c.pom_xml() for c in coords) + "</dependencies></project>"
    )
    (target / "pom.xml").write_text(pom)
    _mvn(
        ["dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={lib}"],
        target, cache, target / "mvn.log",
    )
    (target / ".complete").write_text("ok\n")
    return lib


def fetch_kafka(cache: Path, progress: Progress | None = None) -> Path:
    return fetch_classpath(f"kafka-{KAFKA_VERSION}", KAFKA_BUNDLE, cache, progress)


def fetch_spark_kafka(cache: Path, progress: Progress | None = None) -> Path:
    return fetch_classpath(f"spark-kafka-{SPARK_VERSION}", SPARK_KAFKA_BUNDLE, cache, progress)


def spark_kafka_jars(cache: Path, progress: Progress | None = None) -> list[str]:
    """Local jar paths for ``spark.jars`` (offline; no ``spark.jars.packages`` resolution at run time)."""
    lib = fetch_spark_kafka(cache, progress)
    return sorted(str(p) for p in lib.glob("*.jar"))


def fetch_apicurio(cache: Path, progress: Progress | None = None) -> Path:
    """Apicurio Registry's Quarkus app (``apicurio-registry-app:<v>:tar.gz:all``), unpacked; returns its dir."""
    target = cache / f"apicurio-registry-{APICURIO_VERSION}"
    if (target / ".complete").exists():
        return _quarkus_app_dir(target)
    if progress:
        progress(f"fetching Apicurio Registry {APICURIO_VERSION} with mvn into {target} (first run only)...")
    target.mkdir(parents=True, exist_ok=True)
    download = target / "download"
    _mvn(
        [
            "dependency:copy",
            f"-Dartifact=io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all",
            f"-DoutputDirectory={download}",
        ],
        target, cache, target / "mvn.log",
    )
    archives = list(download.glob("*.tar.gz"))
    if not archives:
        raise LocalClusterError(f"mvn fetched no Apicurio archive into {download}")
    unpacked = target / "app"
    if unpacked.exists():
        shutil.rmtree(unpacked)
    with tarfile.open(archives[0]) as tf:
        tf.extractall(unpacked, filter="data")
    archives[0].unlink()
    (target / ".complete").write_text("ok\n")
    return _quarkus_app_dir(target)


def _quarkus_app_dir(target: Path) -> Path:
    runs = sorted((target / "app").rglob("quarkus-run.jar"))
    if not runs:
        raise LocalClusterError(f"no quarkus-run.jar under {target / 'app'}; delete {target} and retry")
    return runs[0].parent
