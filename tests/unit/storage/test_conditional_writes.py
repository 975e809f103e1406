"""The tag a conditional replace goes by, per store: the ETag on S3 and Azure, the generation on GCS.

Why a unit test: object_store replaces a GCS object only by its generation (``x-goog-if-generation-match``)
and refuses an ETag alone ("missing version"), so a lease on gs:// failed its first renewal and stopped
the run (exit 3), and could never take over a dead holder's lock. fake-gcs-server cannot store objects
through the API object_store writes with (docs/object-storage.md), so what obstore is handed is checked
here, with obstore's put replaced."""

from __future__ import annotations

from typing import Any

import pytest

from applier.storage.objects import ObjectStore


@pytest.mark.parametrize(("uri", "tag", "mode"), [
    ("gs://b/m", "1700000000000017", {"version": "1700000000000017"}),
    ("s3://b/m", '"etag-1"', {"e_tag": '"etag-1"'}),
    ("abfss://c@acct.dfs.core.windows.net/m", '"0x8DC"', {"e_tag": '"0x8DC"'})])
def test_a_conditional_replace_goes_by_the_tag_the_store_replaces_by(monkeypatch, uri: str, tag: str,
                                                                     mode: dict[str, str]) -> None:
    import obstore

    modes: list[Any] = []

    def put(_store: Any, _key: str, _data: bytes, mode: Any = None) -> dict[str, str]:
        modes.append(mode)
        return {"e_tag": '"etag-1"' if uri.startswith("s3") else '"0x8DC"', "version": "1700000000000017"}

    monkeypatch.setattr(obstore, "put", put)
    store = ObjectStore(uri)
    assert store.put_if_absent("lock", b"a") == tag
    assert store.put_if_unchanged("lock", b"b", tag) == tag
    assert modes == ["create", mode]
