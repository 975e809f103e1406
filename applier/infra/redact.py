"""Secrets (DSN passwords) kept out of everything applier prints, tracebacks included.

Errors are written never to contain a DSN, but libpq and psycopg messages quote pieces of the
connection string they could not parse, and an unexpected traceback may show any string. So every
DSN the commands resolve is registered here, and the CLI's error and log output goes through
``scrub``: the last line of defence, not the first.
"""

from __future__ import annotations

import re
import threading

_MASK = "********"
_lock = threading.Lock()
_secrets: set[str] = set()

#: Keys of a libpq connection string whose values are secret.
SECRET_KEYS = ("password", "sslpassword")
#: Shorter secrets are not masked: masking every "ab" would garble messages and still hide little.
_MIN_LEN = 4
_TOKEN = re.compile(r"[^\s='\"]{" + str(_MIN_LEN) + ",}")


def register(value: str) -> None:
    """Never print ``value`` (nor, when it is a whole DSN, its secret parts)."""
    if not value:
        return
    with _lock:
        _secrets.add(value)
    try:
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(value)
    except Exception:  # noqa: BLE001 - a DSN that does not parse: any token of it may be the password
        with _lock:
            _secrets.update(t for t in _TOKEN.findall(value) if not _is_keyword(t))
        return
    with _lock:
        _secrets.update(str(parts[k]) for k in SECRET_KEYS if len(str(parts.get(k) or "")) >= _MIN_LEN)


def _is_keyword(token: str) -> bool:
    """libpq keywords (host, dbname, ...) stay readable in scrubbed text; they are not secrets."""
    try:
        import psycopg

        return token in {o.keyword.decode() for o in psycopg.pq.Conninfo.get_defaults()}
    except Exception:  # noqa: BLE001
        return False


def scrub(text: str) -> str:
    """``text`` with every registered secret masked (longest first, so a DSN goes before its password)."""
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for s in secrets:
        if s in text:
            text = text.replace(s, _MASK)
    return text
