"""delta-rs options derived from the filesystem fsspec opened for a Delta table (no server needed)."""

from __future__ import annotations

import fsspec
import pytest
import s3fs

from airflow_provider_checkpoint.connectors.delta.storage import delta_rs_options, split_options


def s3(**options: object) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(skip_instance_cache=True, **options)


def test_aws_prefixed_options_go_to_delta_rs_only() -> None:
    given = {"key": "k", "AWS_ALLOW_HTTP": "true", "aws_conditional_put": "dynamo:t", "conn_id": "lake"}
    assert split_options(given) == (
        {"key": "k", "conn_id": "lake"},
        {"aws_allow_http": "true", "aws_conditional_put": "dynamo:t"},
    )
    assert split_options(None) == ({}, {})


def test_s3fs_credentials_endpoint_and_region_become_object_store_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    fs = s3(key="AK", secret="SK", token="T", endpoint_url="http://127.0.0.1:9", client_kwargs={"region_name": "eu-1"})
    assert delta_rs_options(fs, {}, {}) == {
        "aws_access_key_id": "AK",
        "aws_secret_access_key": "SK",
        "aws_session_token": "T",
        "aws_endpoint_url": "http://127.0.0.1:9",
        "aws_region": "eu-1",
        "aws_allow_http": "true",
        "aws_conditional_put": "etag",
    }
    https = s3(key="AK", secret="SK", client_kwargs={"endpoint_url": "https://s3.example"})
    assert delta_rs_options(https, {}, {"aws_conditional_put": "dynamo:t"}) == {
        "aws_access_key_id": "AK",
        "aws_secret_access_key": "SK",
        "aws_endpoint_url": "https://s3.example",
        "aws_conditional_put": "dynamo:t",
    }


def test_without_options_delta_rs_reads_the_environment_and_may_speak_http(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:9000")
    assert delta_rs_options(s3(), {}, {}) == {"aws_allow_http": "true", "aws_conditional_put": "etag"}


def test_other_schemes_pass_the_options_as_given() -> None:
    local = fsspec.filesystem("file")
    assert delta_rs_options(local, {}, {}) == {}
    assert delta_rs_options(local, {"account_name": "a"}, {"aws_x": "1"}) == {"account_name": "a", "aws_x": "1"}
