"""Can this run write where it was told to? Checked before the writer lock, the server and Spark.

Why: a target path that is a regular file, or a directory on a read-only mount, used to surface as
an ``OSError`` deep in the state directory's code: exit 5 ("a bug") with a traceback, after the
DSN check. It is a mistake in a flag or the config, which a restart will not cure: exit 2 with one
line that names the path, the setting and what the file system said.

An object-store URI (``s3://``, ``abfss://``, ``gs://``...) is checked by writing and removing a
probe object: a missing bucket, refused credentials or an endpoint that does not answer are exit 2
with the store's own words, before any table is touched. ``file://`` URIs pass unchecked.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from applier.errors import ConfigError
from applier.storage.location import is_object_store

__all__ = ["check_writable_directory"]


def check_writable_directory(path: str | Path, setting: str) -> None:
    """Raise ConfigError unless ``path`` is (or can be made) a directory this process can write in.

    ``setting`` names where the path came from (``target.path`` / ``--target``), for the message. The
    directory is created if it is missing (the run would create it anyway), and a file is made and
    removed in it: ``os.access`` does not see a read-only mount for root, a real write does."""
    text = str(path)
    if "://" in text:
        scheme = text.split("://", 1)[0].lower()
        if scheme == "file":
            return
        if is_object_store(text):
            _check_store(text, setting)
            return
        raise ConfigError(f"{setting} {text}: applier does not write to {scheme}:// locations; give a local "
                          "directory or an s3://, gs:// or abfss:// URI")
    where = Path(text)
    blocker = _file_on_the_way(where)
    if blocker is not None:
        detail = "is a regular file, not a directory" if blocker == where else \
            f"cannot be a directory: {blocker} is a regular file"
        raise ConfigError(f"{setting} {text} {detail}; give a directory (it is created when missing)")
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".applier-write-check-", dir=where)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        reason = e.strerror or str(e)
        if e.errno == errno.EROFS:
            reason = "it is on a read-only file system"
        elif e.errno in (errno.EACCES, errno.EPERM):
            reason = f"permission denied for user id {os.geteuid()}"
        raise ConfigError(f"{setting} {text} cannot be written: {reason}; give a directory this process may "
                          "write in") from None


def _file_on_the_way(path: Path) -> Path | None:
    """``path`` itself or its nearest existing ancestor when that is not a directory (so that
    mkdir would fail with ENOTDIR or EEXIST), else None."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def _check_store(uri: str, setting: str) -> None:
    """Write and remove a probe object under ``uri``: a missing bucket, refused credentials or an
    endpoint that does not answer are found here (exit 2, naming which), before any table is touched."""
    import uuid

    from applier.storage.objects import ObjectStore

    store = ObjectStore(uri)
    probe = f"_applier/.write-check-{uuid.uuid4().hex}"
    try:
        store.put(probe, b"")
        store.delete(probe)
    except ConfigError as e:
        raise ConfigError(f"{setting}: {e.message}", **e.context) from None
