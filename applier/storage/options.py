"""How every engine reaches an object store with the same settings: the cloud's environment, or the
explicit ``target.storage_options`` of a config.

Why one module: delta-rs, ``obstore`` (lock and state objects), pyarrow (raw-log objects) and
Spark's Hadoop file systems each spell a store's settings differently. With the environment alone,
the first three read the standard variables by themselves and only Spark needs them translated.
With explicit options, each needs its own spelling of the *same* options, or the two merge
engines could write one table with different credentials or endpoints. So the options are checked
once here (unknown keys refused: a typo would otherwise be ignored by one engine and not the
other), and each engine asks here for its spelling.

Explicit options are kept per bucket (``s3://bucket``, ``abfss://container@account...``), in force
for the process from the moment a config naming them is loaded (``TargetSettings``), and they reach
Spark's executors inside each task (``FoldJob``). They apply to everything in that bucket: the
target's tables, its lock, and a raw log kept in the same bucket; anything elsewhere uses the
environment. A table of settings per bucket, rather than options passed to each of the dozen
places that open a table, keeps a store's settings out of every signature between the config and
the Rust call, the way the environment does.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from applier.errors import ConfigError
from applier.storage.location import OBJECT_SCHEMES, bucket_and_prefix, bucket_root, scheme_of

__all__ = ["StorageOptions", "deltalake_options", "in_force", "options_in_force", "put_in_force", "spark_hadoop_conf"]

#: Accepted keys (object_store's names, the ones delta-rs documents), by scheme family, with aliases.
_S3_KEYS: dict[str, tuple[str, ...]] = {
    "aws_access_key_id": ("access_key_id",),
    "aws_secret_access_key": ("secret_access_key",),
    "aws_session_token": ("session_token", "aws_token", "token"),
    "aws_region": ("region",),
    "aws_endpoint_url": ("aws_endpoint", "endpoint", "endpoint_url"),
    "aws_allow_http": ("allow_http",),
}
_AZURE_KEYS: dict[str, tuple[str, ...]] = {
    "azure_storage_account_name": ("account_name",),
    "azure_storage_account_key": ("account_key", "access_key"),
    "azure_storage_endpoint": ("azure_endpoint", "endpoint"),
    "azure_storage_use_emulator": ("use_emulator",),
    "azure_allow_http": ("allow_http",),
}
_GCS_KEYS: dict[str, tuple[str, ...]] = {
    "google_service_account": ("service_account", "google_service_account_path"),
    "google_allow_http": ("allow_http",),
}
_FAMILY: dict[str, dict[str, tuple[str, ...]]] = {"s3": _S3_KEYS, "s3a": _S3_KEYS, "gs": _GCS_KEYS, "gcs": _GCS_KEYS,
           "abfs": _AZURE_KEYS, "abfss": _AZURE_KEYS, "az": _AZURE_KEYS, "azure": _AZURE_KEYS, "adl": _AZURE_KEYS}
#: Plain http to the endpoint: a client option of obstore's, not a key of its store config.
_ALLOW_HTTP = frozenset({"aws_allow_http", "azure_allow_http", "google_allow_http"})
#: Values never printed (applier.infra.redact) and masked in the config (SecretStr).
SECRET_KEYS = frozenset({"aws_secret_access_key", "aws_session_token", "azure_storage_account_key"})


def _is_true(value: str) -> bool:
    return value.strip().lower() in {"true", "1", "yes", "on"}


@dataclass(frozen=True, slots=True)
class StorageOptions:
    """Checked, canonical settings for the one bucket ``root`` (``s3://bucket``)."""

    root: str
    values: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, location: str, options: Mapping[str, str]) -> StorageOptions:
        """``options`` for the bucket of ``location``, keys made canonical (case and aliases); an unknown
        key, or options for a local path, is a ConfigError that lists what is accepted."""
        scheme = scheme_of(location)
        if scheme not in OBJECT_SCHEMES:
            raise ConfigError("target.storage_options is for an s3://, gs:// or abfss:// target; this target is "
                              "local", target=location)
        known = _FAMILY[scheme]
        alias = {a: key for key, aliases in known.items() for a in (key, *aliases)}
        values: dict[str, str] = {}
        unknown = []
        for key, value in options.items():
            canonical = alias.get(key.strip().lower())
            if canonical is None:
                unknown.append(key)
            else:
                values[canonical] = str(value)
        if unknown:
            raise ConfigError(f"target.storage_options: unknown key(s) {', '.join(sorted(unknown))} for a {scheme}:// "
                              f"target; accepted: {', '.join(known)} (docs/object-storage.md)")
        return cls(bucket_root(location), values)

    @property
    def is_s3(self) -> bool:
        return self.root.startswith("s3://")

    def deltalake(self) -> dict[str, str]:
        """delta-rs's ``storage_options`` (it takes object_store's names as they are)."""
        return dict(self.values)

    def obstore(self) -> tuple[dict[str, str], dict[str, Any]]:
        """``obstore.store.from_url``'s (config, client_options): plain http is a client option there."""
        config = {k: v for k, v in self.values.items() if k not in _ALLOW_HTTP}
        allow_http = any(_is_true(v) for k, v in self.values.items() if k in _ALLOW_HTTP)
        return config, {"allow_http": True} if allow_http else {}

    def pyarrow_s3(self) -> dict[str, Any]:
        """``pyarrow.fs.S3FileSystem``'s arguments (raw-log objects are read through it)."""
        v = self.values
        out: dict[str, Any] = {}
        for key, arg in (("aws_access_key_id", "access_key"), ("aws_secret_access_key", "secret_key"),
                         ("aws_session_token", "session_token"), ("aws_region", "region")):
            if key in v:
                out[arg] = v[key]
        endpoint = v.get("aws_endpoint_url")
        if endpoint:
            scheme, _, host = endpoint.rpartition("://")
            out["endpoint_override"] = host.rstrip("/")
            out["scheme"] = scheme or ("http" if _is_true(v.get("aws_allow_http", "")) else "https")
        return out

    def hadoop_conf(self) -> dict[str, str]:
        """Spark's Hadoop settings for this bucket only (S3A's per-bucket ``fs.s3a.bucket.<b>.*``,
        ABFS's per-account key), so a log and a target in different buckets keep their own."""
        v = self.values
        conf: dict[str, str] = {}
        if self.is_s3:
            prefix = f"spark.hadoop.fs.s3a.bucket.{bucket_and_prefix(self.root + '/')[0]}."
            for key, name in (("aws_access_key_id", "access.key"), ("aws_secret_access_key", "secret.key"),
                              ("aws_session_token", "session.token"), ("aws_region", "endpoint.region")):
                if key in v:
                    conf[prefix + name] = v[key]
            if "aws_session_token" in v:
                conf[prefix + "aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            conf.update(_s3a_endpoint(prefix, v.get("aws_endpoint_url")))
        elif "azure_storage_account_key" in v:
            host = self.root.split("@", 1)[1] if "@" in self.root else None
            if host is None and "azure_storage_account_name" in v:
                host = f"{v['azure_storage_account_name']}.dfs.core.windows.net"
            if host:
                conf[f"spark.hadoop.fs.azure.account.key.{host}"] = v["azure_storage_account_key"]
        elif "google_service_account" in v:
            conf["spark.hadoop.fs.gs.auth.type"] = "SERVICE_ACCOUNT_JSON_KEYFILE"
            conf["spark.hadoop.fs.gs.auth.service.account.json.keyfile"] = v["google_service_account"]
        return conf


def _s3a_endpoint(prefix: str, endpoint: str | None) -> dict[str, str]:
    """S3A's settings for an endpoint (``prefix``: every bucket's, or one bucket's): path-style requests,
    which S3-compatible servers expect, and plain http when the endpoint is."""
    if not endpoint:
        return {}
    conf = {prefix + "endpoint": endpoint, prefix + "path.style.access": "true"}
    if endpoint.startswith("http://"):
        conf[prefix + "connection.ssl.enabled"] = "false"
    return conf


_lock = threading.Lock()
_in_force: dict[str, StorageOptions] = {}


def put_in_force(options: StorageOptions) -> None:
    """From now on, everything this process opens in ``options.root`` uses ``options`` (a later config
    naming the same bucket replaces them); their secrets are never printed."""
    from applier.infra.redact import register

    for key in SECRET_KEYS & options.values.keys():
        register(options.values[key])
    with _lock:
        _in_force[options.root] = options


def in_force(location: str) -> StorageOptions | None:
    """The explicit options for the bucket of ``location`` (None: the environment alone)."""
    if scheme_of(location) not in OBJECT_SCHEMES:
        return None
    with _lock:
        return _in_force.get(bucket_root(location))


def deltalake_options(location: str) -> dict[str, str] | None:
    """delta-rs's ``storage_options`` for a table at ``location`` (None: the environment alone)."""
    options = in_force(location)
    return options.deltalake() if options is not None else None


def options_in_force() -> tuple[StorageOptions, ...]:
    """Every bucket's explicit options (what an executor's task carries)."""
    with _lock:
        return tuple(_in_force.values())


def spark_hadoop_conf(schemes: set[str], environ: Mapping[str, str],
                      locations: tuple[str, ...] = ()) -> dict[str, str]:
    """Spark's Hadoop settings that reach the stores of ``schemes`` as delta-rs does from the same
    environment: ``s3://`` served by S3A (Hadoop knows only ``s3a://``), ``AWS_ENDPOINT_URL`` as the
    endpoint with path-style requests (what S3-compatible servers expect), plain http when the
    endpoint is, ``AWS_REGION``; then, per bucket of ``locations``, the explicit options in force.
    Credentials from the environment are not copied into Spark's conf (it is shown in the UI and
    event logs; Spark redacts keys named like secrets, but an environment credential need not be
    there at all): S3A reads ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``
    from the environment itself, and instance roles as well. Explicit ones must be, so executors
    on other hosts get them."""
    conf: dict[str, str] = {}
    if schemes & {"s3", "s3a"}:
        conf["spark.hadoop.fs.s3.impl"] = "org.apache.hadoop.fs.s3a.S3AFileSystem"
        conf.update(_s3a_endpoint("spark.hadoop.fs.s3a.",
                                  environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")))
        region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
        if region:
            conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    for location in locations:
        options = in_force(location)
        if options is not None:
            conf.update(options.hadoop_conf())
    return conf
