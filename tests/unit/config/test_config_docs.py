"""docs/config.md is generated from the models and must be up to date; every field is documented."""

from __future__ import annotations

from applier.config.docs import DOCS_PATH, SECTIONS, render


def test_docs_config_md_is_up_to_date():
    assert DOCS_PATH.read_text(encoding="utf-8") == render(), (
        "docs/config.md is out of date: run `python -m applier.config.docs --write`")


def test_every_field_has_a_description():
    from applier.config.docs import JOBS

    missing = [f"{m.__name__}.{name}" for _, m in (*JOBS, *SECTIONS)
               for name, f in m.model_fields.items() if not (f.description or "").strip()]
    assert not missing, missing
    text = render()
    for field in ("`origin`", "`skip_any_origin`", "`unresolved_toast`", "`driver_memory`", "`conf`"):
        assert field in text
