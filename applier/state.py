"""The applier's own durable state, under ``<target>/_applier/`` (or a configured directory).

What lives here is what Delta cannot hold for us: the Relation/Type catalog as last seen (so a
resumed run can decode changes before the server re-sends Relations), the progress of a run (the
end LSN of the last fully applied transaction), and the staged prepared transactions (two-phase),
which the assembler keeps in its own sub-directory. The authoritative record of what each table has
applied is in Delta itself (txnAppId/txnVersion); the progress file only lets a run skip ahead.
Every file is written atomically: temp file, fsync, rename.

A table path kept here is kept relative to the target's root when it lies under it (state format 2,
applier.infra.stateformat; :func:`stored_path`, :func:`resolved_path`): a target copied, restored or
moved to another path with its state goes on where it is now. With absolute paths it went on writing
under the old path (exit 0, the new copy never updated) or, the old one gone, stopped with "table
gone" and a remedy that recreated each table from later changes alone. A path outside the root (a
``tables.rules`` ``target`` elsewhere, a catalog's location) does not move with it and stays absolute.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write ``path`` so that a crash leaves either the old file or the whole new one.

    Temp file in the same directory, fsync, rename over the target, fsync of the directory.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(path: Path, payload: Any) -> None:
    text = _json_bytes(payload)
    atomic_write(path, lambda f: f.write(text))


def _json_bytes(payload: Any) -> bytes:
    return json.dumps(payload, indent=1, sort_keys=True).encode("utf-8")


def _identity(path: Path) -> tuple[int, int, int] | None:
    """Which file is at ``path`` now: every atomic write makes a new one (a new inode)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def local_state_dir(uri: str) -> Path:
    """``$XDG_STATE_HOME/applier/targets/<bucket>-<hash of the URI>`` (``~/.local/state`` without it):
    the state of an object-store target, one directory per target URI."""
    import hashlib

    from applier.storage.location import bucket_and_prefix

    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    digest = hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:16]
    bucket, _ = bucket_and_prefix(uri)
    return base / "applier" / "targets" / f"{bucket}-{digest}"


def _normal(path: str | Path) -> str:
    """``path`` spelled one way: a URI without its trailing slashes, a local path absolute and normalised."""
    from applier.storage.location import scheme_of

    text = str(path)
    return text.rstrip("/") if scheme_of(text) else os.path.normpath(os.path.abspath(text))


def same_location(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name the same directory (however spelled: ``./t``, ``t/``, ``/x/t``)."""
    return _normal(a) == _normal(b)


def stored_path(root: str | Path | None, path: str | Path) -> str:
    """How the state keeps ``path``: relative to the target ``root`` when it lies under it (``public/t``),
    else as it is (absolute, or a URI). See the module docstring."""
    text = str(path)
    if root is None:
        return text
    base, full = _normal(root).rstrip("/"), _normal(text)
    return full[len(base) + 1:] if full.startswith(base + "/") else text


def resolved_path(root: str | Path | None, stored: str) -> str:
    """The path the state's ``stored`` stands for under the target ``root`` (the inverse of
    :func:`stored_path`): a relative one joined to the root as the target's own paths are joined
    (applier.storage.location.join), an absolute path or a URI as it is."""
    from applier.storage.location import join

    if root is None or _is_absolute(stored):
        return stored
    return join(root, stored)


def _is_absolute(text: str) -> bool:
    return text.startswith("/") or "://" in text or text.startswith("file:")


class StateDir:
    """Files of one target's state directory. ``target``: the root of the target it belongs to, when it was
    made for one (:meth:`for_target`): a migration of the state's format (applier.infra.stateformat) makes
    its table paths relative to that root."""

    def __init__(self, root: str | Path, target: str | Path | None = None) -> None:
        self.root = Path(root)
        self.target = str(target) if target is not None else None
        #: per file, the text this object last wrote and the file it made (inode, mtime, size)
        self._written: dict[str, tuple[bytes, tuple[int, int, int]]] = {}

    @classmethod
    def for_target(cls, target_dir: str | Path, configured: str | None = None) -> StateDir:
        """``configured`` (``target.state_dir``), else ``<target>/_applier``; for an object-store target
        (``s3://...``), whose store has no rename and no ``flock``, a local directory of its own
        (:func:`local_state_dir`): losing it costs time only (docs/object-storage.md)."""
        if configured:
            return cls(configured, target_dir)
        from applier.storage.location import is_object_store

        if is_object_store(target_dir):
            return cls(local_state_dir(str(target_dir)), target_dir)
        return cls(Path(target_dir) / "_applier", target_dir)

    @property
    def staging_dir(self) -> Path:
        return self.root / "prepared"

    @property
    def skipped_table(self) -> Path:
        """The Delta audit table of skipped transactions."""
        return self.root / "skipped_transactions"

    @property
    def spill_dir(self) -> Path:
        return self.root / "spill"

    def load(self, name: str) -> Any | None:
        path = self.root / f"{name}.json"
        if not path.is_file():
            return None
        return json.loads(path.read_text(encoding="utf-8"))

    def save(self, name: str, payload: Any) -> None:
        """Write ``name`` unless the file is still the one this object last wrote, with the same text. The
        catalog is saved after every group, and is nearly always unchanged: its atomic write was a tenth
        of an idle follower's time to apply a one-row transaction (bench/RESULTS.md, thirty-ninth session)."""
        path = self.root / f"{name}.json"
        text = _json_bytes(payload)
        last = self._written.get(name)
        if last is not None and last[0] == text and last[1] == _identity(path):
            return
        atomic_write(path, lambda f: f.write(text))
        identity = _identity(path)
        if identity is not None:
            self._written[name] = (text, identity)
