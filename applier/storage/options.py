"""Storage options: how delta-rs, the lock objects and Spark reach the same object store.

Why one place: delta-rs and ``obstore`` (both Rust ``object_store``) read the cloud's standard
environment (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``...) by themselves,
and take explicit options as a flat ``{key: value}`` map (``target.storage_options``). ``obstore``
wants the HTTP client's keys apart and every store key with its cloud's prefix; Spark wants Hadoop
settings. This module turns the one map into each of those, and masks its secrets for printing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["SECRET_OPTION_WORDS", "masked", "obstore_arguments", "register_secrets", "spark_hadoop_conf"]

#: An option whose key holds one of these words is a secret: masked wherever applier prints options.
SECRET_OPTION_WORDS = ("secret", "token", "password", "access_key", "account_key", "sas", "service_account_key",
                       "client_secret")
#: ``object_store``'s HTTP client options (``ClientConfigKey``): not a store's own keys.
_CLIENT_KEYS = frozenset({"allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type",
                          "http1_only", "http2_only", "pool_idle_timeout", "pool_max_idle_per_host", "proxy_url",
                          "proxy_ca_certificate", "proxy_excludes", "timeout", "user_agent",
                          "http2_keep_alive_interval", "http2_keep_alive_timeout", "http2_keep_alive_while_idle",
                          "randomize_addresses"})
_PREFIX = {"s3": "aws_", "s3a": "aws_", "gs": "google_", "gcs": "google_", "abfs": "azure_", "abfss": "azure_",
           "az": "azure_", "azure": "azure_", "adl": "azure_"}


def _is_secret(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in SECRET_OPTION_WORDS)


def masked(options: Mapping[str, str]) -> dict[str, str]:
    """The options as they may be printed: secret values replaced by ``********``."""
    return {k: ("********" if _is_secret(k) and v else v) for k, v in options.items()}


def register_secrets(options: Mapping[str, str]) -> None:
    """Keep the secret values out of every line the CLI prints (applier.infra.redact)."""
    from applier.infra.redact import register

    for key, value in options.items():
        if _is_secret(key):
            register(str(value))


def obstore_arguments(scheme: str, options: Mapping[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
    """(store config, client options) for ``obstore.store.from_url`` from delta-rs style options:
    keys lower-cased, the HTTP client's keys (``allow_http``, ``aws_allow_http``...) apart, the
    store's keys with their cloud's prefix (``endpoint`` -> ``aws_endpoint``)."""
    prefix = _PREFIX.get(scheme, "")
    config: dict[str, str] = {}
    client: dict[str, Any] = {}
    for raw_key, value in options.items():
        key = raw_key.lower()
        bare = key[len(prefix):] if prefix and key.startswith(prefix) else key
        if bare in _CLIENT_KEYS:
            client[bare] = str(value).lower() == "true" if str(value).lower() in ("true", "false") else value
        elif bare in ("conditional_put", "s3_locking_provider", "copy_if_not_exists"):
            continue  # delta-rs' commit settings; the lock objects use put-if-absent directly
        else:
            config[key if key.startswith(prefix) else prefix + key] = str(value)
    return config, client


def spark_hadoop_conf(schemes: set[str], environ: Mapping[str, str]) -> dict[str, str]:
    """Spark's Hadoop settings that reach the stores of ``schemes`` as delta-rs does from the same
    environment: ``s3://`` served by S3A (Hadoop knows only ``s3a://``), ``AWS_ENDPOINT_URL`` as the
    endpoint with path-style requests (what S3-compatible servers expect), plain http when the
    endpoint is, ``AWS_REGION``. Credentials are not copied into Spark's conf (it is shown in the UI
    and event logs): S3A reads ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``
    from the environment itself, and instance roles as well."""
    conf: dict[str, str] = {}
    if schemes & {"s3", "s3a"}:
        conf["spark.hadoop.fs.s3.impl"] = "org.apache.hadoop.fs.s3a.S3AFileSystem"
        endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
            conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
            if endpoint.startswith("http://"):
                conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false"
        region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
        if region:
            conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    return conf
