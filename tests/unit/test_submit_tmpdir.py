"""The temporary directory the stream DAG's task gives its spark-submit JVM: private, and gone with the task."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.jvm_archive import SUBMIT_TMP_PREFIX, submit_tmpdir


def test_the_jvm_gets_a_private_temporary_directory_removed_when_the_submission_ends(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    conf = {"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=x -Dmine=1", "spark.app.name": "a"}
    with submit_tmpdir(conf) as got:
        first, rest = got["spark.driver.extraJavaOptions"].split(" ", 1)
        path = Path(first.removeprefix("-Djava.io.tmpdir="))
        assert first.startswith("-Djava.io.tmpdir=") and rest == conf["spark.driver.extraJavaOptions"]
        assert path.parent == tmp_path and path.name.startswith(SUBMIT_TMP_PREFIX) and path.is_dir()
        assert path.stat().st_mode & 0o777 == 0o700
        assert got["spark.app.name"] == "a"
        (path / "spark-1234").mkdir()  # what a killed spark-submit leaves
    assert not path.exists()
    assert conf["spark.driver.extraJavaOptions"] == "-Dlog4j2.configurationFile=x -Dmine=1"  # not changed in place

    with pytest.raises(RuntimeError), submit_tmpdir({}) as got:  # a failed submission too
        path = Path(got["spark.driver.extraJavaOptions"].removeprefix("-Djava.io.tmpdir="))
        assert path.is_dir()
        raise RuntimeError("spark-submit failed")
    assert not path.exists()


def test_a_temporary_directory_of_the_users_own_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    conf = {"spark.driver.extraJavaOptions": "-Djava.io.tmpdir=/big"}
    with submit_tmpdir(conf) as got:
        assert got == conf
    assert list(tmp_path.iterdir()) == []
