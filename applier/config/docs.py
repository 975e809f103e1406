"""Generate docs/config.md, the config reference, from the pydantic models in applier.config.

    python -m applier.config.docs > docs/config.md      # or: python -m applier.config.docs --write

The models are the single source: every field's type, default and description come from them, so the
reference cannot drift (tests/unit/config/test_config_docs.py fails when docs/config.md is out of date).
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic_core import PydanticUndefined

from applier.config import (
    ApplySettings,
    CaptureConfig,
    CatalogSettings,
    DistributedSettings,
    MaintenanceSettings,
    MetadataNames,
    MetricsSettings,
    MirrorConfig,
    ReplayConfig,
    SnapshotSettings,
    SourceSettings,
    SparkConfig,
    TableRule,
    TablesSettings,
    TargetSettings,
)
from applier.config.files import ENV_DELIMITER, ENV_PREFIX, is_path_field, nested_model

assert (ENV_PREFIX, ENV_DELIMITER) == ("APPLIER_", "__"), "update HEADER"

JOBS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("applier mirror", MirrorConfig), ("applier replay", ReplayConfig), ("applier capture", CaptureConfig))
SECTIONS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("source", SourceSettings), ("target", TargetSettings), ("tables", TablesSettings),
    ("tables.rules[]", TableRule), ("tables.metadata_names", MetadataNames), ("snapshot", SnapshotSettings),
    ("apply", ApplySettings), ("distributed", DistributedSettings), ("metrics", MetricsSettings),
    ("maintenance", MaintenanceSettings), ("catalog", CatalogSettings),
    ("spark", SparkConfig))

HEADER = """\
# Config reference

Generated from the pydantic models in `applier/config/` by `python -m applier.config.docs --write`;
do not edit by hand (a test fails when this file is out of date). Examples: `configs/*.yaml`.

How a config is read (`applier COMMAND --config FILE`, or `applier.replay(spark, "FILE")`):

- YAML 1.2: `on`, `off`, `yes`, `no` are strings unless the field is a boolean (`streaming: on` is
  the string `on`). A key written twice in one mapping is an error naming both lines.
- Unknown keys are errors (a typo never falls back to a default). Every problem is reported, each
  with its `file:line`.
- Relative paths (fields marked *path*) are resolved from the config file's folder, not from the
  working directory; `~` is expanded; URIs (`s3://...`, `abfss://...`) are kept as they are. Paths
  given as flags are the shell's own: relative to the working directory.
- Precedence: command-line flags, then environment variables `APPLIER_<SECTION>__<FIELD>`
  (e.g. `APPLIER_APPLY__MAX_GROUP_ROWS=100000`, `APPLIER_SOURCE__SLOT=s2`; top-level fields as
  `APPLIER_LOG_PATH`; lists and mappings as JSON: `APPLIER_TABLES__INCLUDE='["shop.*"]'`), then the
  file, then the defaults below. Flags may supply required fields the file lacks.
- The DSN: `source.dsn`, else the variable named by `source.dsn_env` (`APPLIER_DSN`), else libpq's
  own variables (`PGHOST`, `PGPORT`, `PGDATABASE`, `PGUSER`, `PGSERVICE` with `pg_service.conf`;
  the password from `PGPASSWORD` or `~/.pgpass`). It is never printed.
"""


def type_name(annotation: Any) -> str:
    """A short, readable spelling of a field's type."""
    origin = get_origin(annotation)
    if annotation is type(None):
        return "null"
    if annotation is SecretStr:
        return "string (secret)"
    if annotation in (str, int, float, bool):
        return {str: "string", int: "integer", float: "number", bool: "boolean"}[annotation]
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(annotation))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(type_name(a) for a in get_args(annotation))
    if origin is typing.Annotated:
        return type_name(get_args(annotation)[0])
    if origin is list:
        return f"list of {type_name(get_args(annotation)[0])}"
    if origin is dict:
        k, v = get_args(annotation)
        return f"mapping {type_name(k)} to {type_name(v)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    return getattr(annotation, "__name__", str(annotation))


def default_text(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]  # our factories take no arguments
        return f"`{_yaml(value)}`" if not isinstance(value, BaseModel) else "(section defaults)"
    if field.default is PydanticUndefined:
        return ""
    return f"`{_yaml(field.default)}`"


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "[" + ", ".join(f'"{v}"' if isinstance(v, str) else _yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value)


def _constraints(model: type[BaseModel], name: str) -> str:
    out = []
    for m in model.model_fields[name].metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(m, attr, None) is not None:
                out.append(f"{sign} {getattr(m, attr)}")
    return f" ({', '.join(out)})" if out else ""


def model_table(model: type[BaseModel]) -> str:
    rows = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
        if is_path_field(model, name):
            desc += " *(path: relative to the config file)*"
        rows.append(f"| `{name}` | {type_name(field.annotation)}{_constraints(model, name)} | "
                    f"{default_text(model, name)} | {desc} |")
    return "\n".join(rows)


def render() -> str:
    parts = [HEADER]
    parts.append("## Jobs\n")
    for command, model in JOBS:
        doc = " ".join((model.__doc__ or "").replace("``", "`").split())
        parts.append(f"### {model.__name__}\n\n{doc} Run as `{command} --config FILE`.\n")
        parts.append(model_table(model) + "\n")
    parts.append("## Sections\n")
    for key, model in SECTIONS:
        doc = " ".join((model.__doc__ or "").replace("``", "`").split())
        parts.append(f"### {model.__name__}\n\n`{key}`: {doc}\n")
        parts.append(model_table(model) + "\n")
    missing = {m for _, m in SECTIONS} ^ _all_sections()
    assert not missing, f"sections not documented: {missing}"
    return "\n".join(parts).rstrip() + "\n"


def _all_sections() -> set[type[BaseModel]]:
    found: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel]) -> None:
        for field in model.model_fields.values():
            sub = nested_model(field.annotation)
            if sub is not None and sub not in found:
                found.add(sub)
                walk(sub)

    for _, job in JOBS:
        walk(job)
    return found


DOCS_PATH = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def main(argv: list[str]) -> int:
    text = render()
    if "--write" in argv:
        DOCS_PATH.parent.mkdir(exist_ok=True)
        DOCS_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {DOCS_PATH}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
