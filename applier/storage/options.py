"""How Spark reaches the object store that delta-rs and the lock objects reach from the environment.

Why: delta-rs, ``obstore`` and pyarrow (all reading the cloud's standard variables: ``AWS_ENDPOINT_URL``,
``AWS_REGION``, ``AWS_ALLOW_HTTP``...) find the store by themselves; Spark's Hadoop file systems do
not, and need the same facts as Hadoop settings. A config section of explicit options
(``target.storage_options``, issue 33) is not built yet: the environment is the one source.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["spark_hadoop_conf"]


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
