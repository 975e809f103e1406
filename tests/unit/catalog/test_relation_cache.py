"""RelationCache: identical re-sends are not schema changes; real changes bump the version and say what changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from applier.catalog import RelationCache
from applier.errors import CatalogError
from applier.lsn import parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.protocol.messages import Relation, RelationColumn, Type

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pgoutput"


def rel(*cols: tuple[int, str, int, int], identity: str = "d", name: str = "t") -> Relation:
    return Relation(None, 42, "public", name, identity, tuple(RelationColumn(*c) for c in cols))


def test_versions_and_changes():
    cache = RelationCache()
    v1 = cache.update(rel((1, "id", 23, -1), (0, "a", 25, -1), (0, "b", 1700, 655366)))
    assert (v1.version, v1.key_indexes, v1.change) == (1, (0,), None)
    assert cache.update(rel((1, "id", 23, -1), (0, "a", 25, -1), (0, "b", 1700, 655366))) is v1  # re-send
    v2 = cache.update(rel((1, "id", 20, -1), (0, "b", 1700, 786438), (0, "c", 16, -1)))
    assert v2.version == 2 and cache.get(42) is v2
    assert v2.change is not None
    assert v2.change.added == ("c",) and v2.change.dropped == ("a",)
    assert v2.change.retyped == (("id", 23, -1, 20, -1), ("b", 1700, 655366, 1700, 786438))
    assert not v2.change.key_changed and v2.change.renamed_relation is None
    v3 = cache.update(rel((1, "id", 20, -1), (1, "b", 1700, 786438), (0, "c", 16, -1), identity="f", name="t2"))
    assert v3.change is not None
    assert v3.change.key_changed and v3.change.replica_identity_changed
    assert v3.change.renamed_relation == ("public.t", "public.t2")
    with pytest.raises(CatalogError) as e:
        cache.get(7)
    assert e.value.context["relation_oid"] == 7


def test_json_round_trip_keeps_relations_versions_and_types():
    cache = RelationCache()
    cache.update(rel((1, "id", 23, -1)))
    cache.update(rel((1, "id", 23, -1), (0, "x", 16400, -1)))
    cache.update_type(Type(None, 16400, "public", "mood"))
    back = RelationCache.from_json(json.loads(json.dumps(cache.to_json())))
    assert back.get(42).relation == cache.get(42).relation and back.get(42).version == 2
    mood = back.types.get(16400)
    assert mood is not None and mood.name == "mood"


def test_captured_streams_describe_every_changed_relation():
    for path in sorted(FIXTURES.glob("*.jsonl")):
        cache, dec = RelationCache(), MessageDecoder()
        for line in path.read_text().splitlines():
            row = json.loads(line)
            msg = dec.decode(bytes.fromhex(row["data"]), parse_lsn(row["lsn"]))
            if isinstance(msg, Relation):
                cache.update(msg)
            elif hasattr(msg, "relation_oid"):
                assert msg.relation_oid in cache, path.name
