"""``target.storage_options``: one set of settings, spelled for each engine (no servers: what each engine
is handed; tests/integration/test_object_storage.py runs them against the S3 server)."""

from __future__ import annotations

import pickle

import pytest

from applier.config import TargetSettings
from applier.config.files import validate_mapping
from applier.errors import ConfigError
from applier.infra.redact import scrub
from applier.storage.options import StorageOptions, deltalake_options, in_force, spark_hadoop_conf


def test_keys_are_made_canonical_and_the_options_are_in_force_for_the_whole_bucket_only() -> None:
    TargetSettings(path="s3://unit-opts-a/mirror", storage_options={
        "AWS_ACCESS_KEY_ID": "AKIDUNIT", "secret_access_key": "unit-secret-value", "endpoint": "http://127.0.0.1:9",
        "allow_http": "true", "region": "eu-west-3"})
    expected = {"aws_access_key_id": "AKIDUNIT", "aws_secret_access_key": "unit-secret-value",
                "aws_endpoint_url": "http://127.0.0.1:9", "aws_allow_http": "true", "aws_region": "eu-west-3"}
    assert deltalake_options("s3://unit-opts-a/mirror/public/t") == expected
    assert deltalake_options("s3a://unit-opts-a/log") == expected  # s3a:// is the same bucket
    assert deltalake_options("s3://unit-opts-b/mirror") is None  # another bucket: the environment
    assert deltalake_options("/tmp/local") is None
    options = in_force("s3://unit-opts-a/x")
    assert options is not None
    config, client = options.obstore()
    assert "aws_allow_http" not in config and client == {"allow_http": True}
    assert options.pyarrow_s3() == {"access_key": "AKIDUNIT", "secret_key": "unit-secret-value", "region": "eu-west-3",
                                    "endpoint_override": "127.0.0.1:9", "scheme": "http"}
    assert pickle.loads(pickle.dumps(options)) == options  # what an executor's task carries


def test_spark_gets_the_same_options_per_bucket_so_two_buckets_keep_their_own() -> None:
    TargetSettings(path="s3://unit-opts-c/m", storage_options={"aws_access_key_id": "AKIDC",
                                                               "aws_secret_access_key": "secret-of-c",
                                                               "aws_session_token": "token-of-c"})
    conf = spark_hadoop_conf({"s3"}, {}, ("s3://unit-opts-c/m", "s3://unit-opts-d/log"))
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.hadoop.fs.s3a.bucket.unit-opts-c.access.key"] == "AKIDC"
    assert conf["spark.hadoop.fs.s3a.bucket.unit-opts-c.secret.key"] == "secret-of-c"
    assert conf["spark.hadoop.fs.s3a.bucket.unit-opts-c.session.token"] == "token-of-c"
    assert conf["spark.hadoop.fs.s3a.bucket.unit-opts-c.aws.credentials.provider"].endswith(
        "TemporaryAWSCredentialsProvider")
    assert not any("unit-opts-d" in key for key in conf)
    assert not any(key.startswith("spark.hadoop.fs.s3a.access") for key in conf)  # never for every bucket


def test_azure_and_gcs_options_reach_hadoop_too() -> None:
    azure = StorageOptions.of("abfss://c@acct.dfs.core.windows.net/m", {"account_key": "azure-key-value"})
    assert azure.hadoop_conf() == {"spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": "azure-key-value"}
    gcs = StorageOptions.of("gs://b/m", {"google_service_account": "/keys/sa.json"})
    assert gcs.hadoop_conf()["spark.hadoop.fs.gs.auth.service.account.json.keyfile"] == "/keys/sa.json"


def test_an_azure_or_gcs_endpoint_of_ones_own_and_plain_http_are_options_too() -> None:
    """What an emulator (Azurite, fake-gcs-server) or a private endpoint needs: delta-rs takes the keys as they
    are; obstore gets plain http as its client option."""
    azure = StorageOptions.of("az://c/m", {"account_name": "devstoreaccount1", "endpoint": "http://127.0.0.1:9/x",
                                           "allow_http": "true", "use_emulator": "false"})
    assert azure.deltalake() == {"azure_storage_account_name": "devstoreaccount1",
                                 "azure_storage_endpoint": "http://127.0.0.1:9/x", "azure_allow_http": "true",
                                 "azure_storage_use_emulator": "false"}
    config, client = azure.obstore()
    assert "azure_allow_http" not in config and client == {"allow_http": True}
    gcs = StorageOptions.of("gs://b/m", {"service_account": "/keys/sa.json", "allow_http": "yes"})
    assert gcs.obstore() == ({"google_service_account": "/keys/sa.json"}, {"allow_http": True})


def test_secrets_are_never_printed_and_are_masked_in_the_config() -> None:
    settings = TargetSettings(path="s3://unit-opts-e/m", storage_options={"aws_secret_access_key": "e-secret-e-secret",
                                                                          "aws_session_token": "e-token-e-token"})
    assert "e-secret-e-secret" not in repr(settings) and "e-token-e-token" not in repr(settings)
    assert scrub("failed with e-secret-e-secret and e-token-e-token") == "failed with ******** and ********"


@pytest.mark.parametrize(("path", "options", "words"), [
    ("s3://unit-opts-f/m", {"aws_secret_key": "x"}, ["aws_secret_key", "aws_secret_access_key"]),
    ("gs://unit-opts-f/m", {"aws_access_key_id": "x"}, ["aws_access_key_id", "google_service_account"]),
    ("/tmp/local-target", {"aws_access_key_id": "x"}, ["local"]),
])
def test_an_unknown_key_or_options_for_a_local_target_are_refused_naming_what_is_accepted(
        path: str, options: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as raised:
        validate_mapping({"source_log": "/tmp/raw", "target": {"path": path, "storage_options": options}},
                         _replay_config())
    assert all(word in str(raised.value) for word in words), str(raised.value)
    assert in_force(path) is None or path.startswith("/")


def _replay_config() -> type:
    from applier.config import ReplayConfig

    return ReplayConfig


@pytest.mark.parametrize(("value", "seconds"), [("", 60.0), ("7.5", 7.5), ("2", None), ("soon", None)])
def test_the_lease_length_comes_from_applier_lease_seconds_and_a_bad_one_is_a_config_error(
        monkeypatch: pytest.MonkeyPatch, value: str, seconds: float | None) -> None:
    from applier.storage.lease import lease_seconds_from_env

    monkeypatch.setenv("APPLIER_LEASE_SECONDS", value)
    if seconds is None:
        with pytest.raises(ConfigError, match="APPLIER_LEASE_SECONDS"):
            lease_seconds_from_env()
    else:
        assert lease_seconds_from_env() == seconds
