"""Paths and URIs of targets, logs and state: joined as what they are.

Why: ``Path("s3://lake/m") / "public"`` is ``s3:/lake/m/public`` (one slash lost), which delta-rs
cannot recognise and which a local ``mkdir`` happily creates in the working directory. A URI is
joined as text with ``/``; a local path stays a ``Path`` join (``file://`` URIs included: delta-rs
and Spark both take them).
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["OBJECT_SCHEMES", "bucket_and_prefix", "bucket_root", "is_object_store", "join", "scheme_of"]

#: URI schemes of object stores applier writes through delta-rs and ``obstore`` (Rust ``object_store``).
OBJECT_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "azure", "adl"})
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def scheme_of(location: str | Path) -> str | None:
    """The URI scheme, lower case (``s3``), or None for a plain local path."""
    match = _SCHEME.match(str(location))
    return match.group(1).lower() if match else None


def is_object_store(location: str | Path) -> bool:
    """True for ``s3://``, ``gs://``, ``abfss://``... (not for local paths or ``file://``)."""
    return scheme_of(location) in OBJECT_SCHEMES


def join(base: str | Path, *parts: str) -> str:
    """``base/part/...``: text joined with single slashes for a URI, ``Path`` joined for a local path."""
    if scheme_of(base) is None:
        return str(Path(base).joinpath(*parts))
    out = str(base).rstrip("/")
    for part in parts:
        out += "/" + part.strip("/")
    return out


def bucket_and_prefix(uri: str) -> tuple[str, str]:
    """(``bucket``, ``prefix/without/slashes``) of ``s3://bucket/prefix/`` (container for abfss)."""
    rest = str(uri).split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    return bucket.split("@", 1)[0], prefix.strip("/")



def bucket_root(uri: str) -> str:
    """The bucket a store location is in, as one spelling: ``s3://bucket`` (``s3a://`` is ``s3://``)."""
    scheme = scheme_of(uri) or ""
    return f"{'s3' if scheme == 's3a' else scheme}://{str(uri).split('://', 1)[1].partition('/')[0]}"
