"""The embedded session's configuration (no JVM started): quiet logs and fast-start JVM options."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_checkpoint.spark import session
from airflow_provider_checkpoint.spark.session import (
    C1_ONLY,
    CDS_ENV,
    FULL_JIT_INPUT_BYTES,
    LOG4J2_PROPERTIES,
    embedded_conf,
)
from airflow_provider_checkpoint.spark.step_reads import step_input_bytes
from tests.unit.helpers import STEP, make_ack, make_env


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


def java_options(input_bytes: int | None) -> list[str]:
    return embedded_conf(input_bytes=input_bytes)["spark.driver.extraJavaOptions"].split()


def test_a_step_that_reads_enough_input_starts_its_jvm_with_the_full_jit(tmp_path: Path, archive: Path) -> None:
    """The step's input bytes come from the barrier's file sizes (what a later checkpoint reads only);
    from ``FULL_JIT_INPUT_BYTES`` on, the JVM starts without the C1-only option."""
    env = make_env(tmp_path)  # lands a.json: 9 bytes
    (env.landing / "b.json").write_bytes(b'{"k": 2}\n' * 100)
    first = env.coordinator.trigger("run-1")
    assert step_input_bytes(env.coordinator.graph, STEP, first) == 9 + 900
    env.coordinator.finalize(first, [make_ack(env, first)])
    (env.landing / "c.json").write_bytes(b'{"k": 3}\n' * 3)
    second = env.coordinator.trigger("run-2")
    assert step_input_bytes(env.coordinator.graph, STEP, second) == 27
    assert C1_ONLY in java_options(None) and C1_ONLY in java_options(FULL_JIT_INPUT_BYTES - 1)
    assert C1_ONLY not in java_options(FULL_JIT_INPUT_BYTES)
    assert java_options(FULL_JIT_INPUT_BYTES) == [o for o in java_options(None) if o != C1_ONLY]
