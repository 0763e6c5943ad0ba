"""The embedded session's configuration (no JVM started): quiet logs and fast-start JVM options."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_checkpoint.spark import session
from airflow_provider_checkpoint.spark.session import CDS_ENV, LOG4J2_PROPERTIES, embedded_conf


@pytest.fixture
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "driver.jsa"
    monkeypatch.setattr(session, "archive_path", lambda: path)
    monkeypatch.delenv(CDS_ENV, raising=False)
    return path


def test_defaults_are_quiet_and_start_fast(archive: Path) -> None:
    conf = embedded_conf()
    assert conf["spark.ui.showConsoleProgress"] == "false"
    assert LOG4J2_PROPERTIES.is_file()
    assert conf["spark.driver.extraJavaOptions"].split() == [
        f"-Dlog4j2.configurationFile={LOG4J2_PROPERTIES.as_uri()}",
        "-XX:TieredStopAtLevel=1",
        "-Xshare:auto",
    ]


def test_the_archive_is_used_once_created_unless_switched_off(archive: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive.write_bytes(b"jsa")
    assert embedded_conf()["spark.driver.extraJavaOptions"].endswith(f"-XX:SharedArchiveFile={archive}")
    monkeypatch.setenv(CDS_ENV, "off")
    assert "SharedArchiveFile" not in embedded_conf()["spark.driver.extraJavaOptions"]


def test_user_java_options_come_last_and_win(archive: Path) -> None:
    conf = embedded_conf(
        {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4", "spark.sql.shuffle.partitions": "2"}
    )
    assert conf["spark.driver.extraJavaOptions"].split()[-1] == "-XX:TieredStopAtLevel=4"
    assert conf["spark.sql.shuffle.partitions"] == "2"
