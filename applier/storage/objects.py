"""Small objects next to the tables on an object store: the lock, and applier's state files.

Why not files: an object store has no rename and no ``flock``. What it has, on AWS S3 (since 2024),
GCS, Azure and the local test server alike, is a conditional write: put-if-absent (``If-None-Match:
*``) and put-if-unchanged (``If-Match: <etag>``). Every write here is one of those or a plain
whole-object put, which an object store makes atomic by itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from applier.errors import ConfigError
from applier.storage.location import bucket_and_prefix, scheme_of
from applier.storage.options import in_force

__all__ = ["ObjectStore", "StoredObject", "StorageAccessError"]


#: A few retries over seconds, not object_store's default 10 over 3 minutes: a lock or state object
#: that cannot be written after that is an endpoint or credential problem to report, not to wait out.
_RETRIES = {"max_retries": 3, "backoff": {"init_backoff": timedelta(milliseconds=100),
                                           "max_backoff": timedelta(seconds=2), "base": 2.0},
            "retry_timeout": timedelta(seconds=20)}


class StorageAccessError(ConfigError):
    """The object store refused or could not be reached: bucket, credentials or endpoint (exit 2)."""


@dataclass(frozen=True, slots=True)
class StoredObject:
    data: bytes
    etag: str | None  # what put_if_unchanged needs: the ETag, or on GCS the generation (ObjectStore's docstring)


#: Schemes whose put-if-unchanged is by the object's generation, not its ETag: object_store sends GCS
#: ``x-goog-if-generation-match`` with the ``version`` it was given and refuses an ``e_tag`` alone.
_BY_GENERATION = frozenset({"gs", "gcs"})


class ObjectStore:
    """Keys under one URI prefix (``s3://bucket/prefix``) of one store, with conditional writes.

    The "etag" a conditional write returns and takes is the tag that store replaces by: the ETag on S3
    and Azure, the generation on GCS (whose ETag object_store cannot replace by), so callers (the lease)
    hold one opaque string for every store."""

    def __init__(self, uri: str) -> None:
        from obstore.store import from_url

        self.uri = uri.rstrip("/")
        self._by_generation = scheme_of(uri) in _BY_GENERATION
        url = "s3://" + self.uri.split("://", 1)[1] if scheme_of(uri) == "s3a" else self.uri
        explicit = in_force(uri)
        config, client = explicit.obstore() if explicit is not None else ({}, {})
        try:  # the cloud's standard environment, as delta-rs reads it, then target.storage_options
            self._store: Any = from_url(url, config=cast(Any, config or None), client_options=cast(Any, client or None),
                                        retry_config=cast(Any, _RETRIES))
        except Exception as e:  # noqa: BLE001 - obstore raises its own (and Rust panics) for a bad URL or option
            raise _access_error("opening", uri.rstrip("/"), e) from None

    def _tag(self, meta: Any) -> str | None:
        """The tag this store replaces by, from an object's metadata or a put's result."""
        tag = meta.get("version") if self._by_generation else meta.get("e_tag")
        return str(tag) if tag else None

    def _failed(self, action: str, key: str, e: Exception) -> StorageAccessError:
        return _access_error(action, f"{self.uri}/{key}", e, self.uri)

    def get(self, key: str) -> StoredObject | None:
        import obstore

        try:
            result = obstore.get(self._store, key)
            return StoredObject(bytes(result.bytes()), self._tag(result.meta))
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001
            if type(e).__name__ == "NotFoundError":
                return None
            raise self._failed("reading", key, e) from None

    def put(self, key: str, data: bytes) -> None:
        import obstore

        try:
            obstore.put(self._store, key, data)
        except Exception as e:  # noqa: BLE001
            raise self._failed("writing", key, e) from None

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        """Write ``key`` unless it exists: the new object's ETag ('' when the store gives none), or None
        when it existed (someone else's write won)."""
        import obstore

        try:
            return self._tag(obstore.put(self._store, key, data, mode="create")) or ""
        except FileExistsError:
            return None
        except Exception as e:  # noqa: BLE001
            if type(e).__name__ in ("AlreadyExistsError", "PreconditionError"):
                return None
            raise self._failed("writing (if absent)", key, e) from None

    def put_if_unchanged(self, key: str, data: bytes, etag: str) -> str | None:
        """Replace ``key`` only if it still has ``etag``: the new ETag ('' when the store gives none), or
        None when it changed or went away."""
        import obstore

        mode = {"version": etag} if self._by_generation else {"e_tag": etag}
        try:
            return self._tag(obstore.put(self._store, key, data, mode=cast(Any, mode))) or ""
        except (FileNotFoundError, FileExistsError):
            return None
        except Exception as e:  # noqa: BLE001
            if type(e).__name__ in ("PreconditionError", "NotFoundError", "AlreadyExistsError"):
                return None
            raise self._failed("writing (if unchanged)", key, e) from None

    def copy(self, from_key: str, to_key: str) -> None:
        """Copy an object within the store (server-side: no bytes through this process), replacing ``to_key``."""
        import obstore

        try:
            obstore.copy(self._store, from_key, to_key, overwrite=True)
        except Exception as e:  # noqa: BLE001
            raise self._failed("copying", f"{from_key} to {to_key}", e) from None

    def delete(self, key: str) -> None:
        import obstore

        try:
            obstore.delete(self._store, key)
        except FileNotFoundError:
            return
        except Exception as e:  # noqa: BLE001
            if type(e).__name__ == "NotFoundError":
                return
            raise self._failed("deleting", key, e) from None

    def keys(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` (recursive), relative to the store's URI."""
        import obstore

        try:
            return [str(meta["path"]) for chunk in obstore.list(self._store, prefix=prefix or None)
                    for meta in chunk]
        except Exception as e:  # noqa: BLE001
            raise self._failed("listing", prefix, e) from None

    def any_under(self, prefix: str) -> bool:
        """Whether at least one key lies under ``prefix`` (one listing page, not the whole prefix)."""
        import obstore

        try:
            for chunk in obstore.list(self._store, prefix=prefix or None, chunk_size=1):
                if chunk:
                    return True
            return False
        except Exception as e:  # noqa: BLE001
            raise self._failed("listing", prefix, e) from None

    def files(self, prefix: str = "") -> list[str]:
        """The names of the objects directly under ``prefix`` (not in its 'sub-directories')."""
        import obstore

        try:
            listed = obstore.list_with_delimiter(self._store, prefix=prefix or None)
        except Exception as e:  # noqa: BLE001
            raise self._failed("listing", prefix, e) from None
        return [str(meta["path"]).rsplit("/", 1)[-1] for meta in listed["objects"]]

    def directories(self, prefix: str = "") -> list[str]:
        """The immediate 'sub-directories' (common prefixes) under ``prefix``, names only."""
        import obstore

        try:
            listed = obstore.list_with_delimiter(self._store, prefix=prefix or None)
        except Exception as e:  # noqa: BLE001
            raise self._failed("listing", prefix, e) from None
        return [str(p).rstrip("/").rsplit("/", 1)[-1] for p in listed["common_prefixes"]]


#: Per store family: (a bucket's name, the settings of its credentials, the settings of its endpoint).
_WORDS = {
    "s3": ("bucket", "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"),
    "azure": ("container", "AZURE_STORAGE_ACCOUNT_NAME / AZURE_STORAGE_ACCOUNT_KEY, or AZURE_CLIENT_ID, "
              "AZURE_CLIENT_SECRET and AZURE_TENANT_ID", "AZURE_STORAGE_ENDPOINT, or AZURITE_BLOB_STORAGE_URL with "
              "AZURE_STORAGE_USE_EMULATOR"),
    "gcs": ("bucket", "GOOGLE_SERVICE_ACCOUNT or GOOGLE_APPLICATION_CREDENTIALS", "the service account's gcs_base_url"),
}
_FAMILY = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "abfs": "azure", "abfss": "azure", "az": "azure",
           "azure": "azure", "adl": "azure"}


# "403" only as a status, never inside the random hex of a probe's file name (a04a24031...).
_FORBIDDEN = re.compile(r"(?<![0-9A-Za-z])403(?![0-9A-Za-z])")


def _access_error(action: str, where: str, e: Exception, uri: str | None = None) -> StorageAccessError:
    """One line that says what failed and, where the store's words allow, which setting to fix (in the
    words of that store: a container and AZURE_* variables for abfss://, a bucket and GOOGLE_* for gs://)."""
    uri = uri or where
    said = str(e)
    text = said.splitlines()[0] if said else type(e).__name__
    bucket, _ = bucket_and_prefix(uri)
    kind, credentials, endpoint = _WORDS[_FAMILY.get(scheme_of(uri) or "", "s3")]
    hint = ""
    missing = ("NoSuchBucket" in said or "ContainerNotFound" in said or "bucket does not exist" in said.lower()
               or (isinstance(e, FileNotFoundError) or type(e).__name__ == "NotFoundError")
               and action.startswith("writing"))
    if missing:
        hint = f"; the {kind} {bucket!r} does not exist: create it, or correct the URI"
    elif "token request" in said or "credential" in said.lower():
        hint = f"; no credentials were found for this store ({credentials}; or target.storage_options)"
    else:
        refused = any(w in said for w in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied",
                                          "AuthorizationFailure", "AuthenticationFailed"))
        unreachable = any(w in said.lower() for w in ("connect", "error sending request", "dns"))
        if refused or (not unreachable and _FORBIDDEN.search(said)):  # a bare 403 after the connection words
            hint = f"; the store refused the credentials ({credentials}, or target.storage_options)"
        elif unreachable:
            hint = f"; the endpoint cannot be reached ({endpoint}, or target.storage_options)"
    return StorageAccessError(f"{action} {where} failed: {text}{hint}", uri=uri)
