"""Reading a job config: a YAML file, then ``APPLIER_*`` environment variables, then command-line flags.

- YAML 1.2 (ruamel.yaml), so ``streaming: on`` is the string 'on', not YAML 1.1's ``True``; a key
  written twice in one mapping is refused with both lines, instead of the last one silently winning.
- Relative paths in the file are resolved from the file's folder (a config means the same thing from
  any working directory); paths given as flags or variables are resolved from the working directory.
- ``APPLIER_<SECTION>__<FIELD>`` variables override the file (e.g. ``APPLIER_APPLY__MAX_GROUP_ROWS=1000``;
  lists as JSON), read by pydantic-settings; flags override both.
- Everything is validated once, after merging, so flags can supply what the file lacks, and every
  problem is reported, each with where it came from: ``file:line``, the variable or the flag.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError

from applier.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

ENV_PREFIX = "APPLIER_"
ENV_DELIMITER = "__"

Loc = tuple[str | int, ...]

#: A URI (s3://, abfss://, dbfs:/, file:/) is never resolved against the config's folder.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


def load_config(path: str | Path | None, model: type[M], *,
                overrides: Mapping[str, tuple[object, str]] | None = None, env: bool = True) -> M:
    """Validate ``model`` from the YAML file at ``path`` (may be None), the environment and ``overrides``.

    ``overrides`` maps a dotted key (``target.path``; ``apply.skip_transactions+`` appends to a list)
    to ``(value, flag name)``; None values are ignored. ConfigError lists every problem found."""
    data: dict[str, Any] = {}
    lines: dict[Loc, int] = {}
    origins: dict[Loc, str] = {}
    file = str(path) if path is not None else None
    if path is not None:
        data = _read_yaml(Path(path), lines)
        _resolve_paths(model, data, Path(path).resolve().parent)
    if env:
        _merge_env(model, data, origins)
    for dotted, (value, flag) in (overrides or {}).items():
        if value is None or value == []:
            continue
        _set(data, dotted, value, flag, origins)
    flags: dict[Loc, str] = {tuple(k.rstrip("+").split(".")): flag for k, (_v, flag) in (overrides or {}).items()}
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _config_error(e, file, lines, origins, flags) from None


def validate_mapping(data: Mapping[str, Any], model: type[M]) -> M:
    """Validate settings given as a dict (the Python API), with the same error messages as a file."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as e:
        raise _config_error(e, None, {}, {}) from None


# --- YAML -------------------------------------------------------------------------------------------

def _read_yaml(path: Path, lines: dict[Loc, int]) -> dict[str, Any]:
    from ruamel.yaml import YAML
    from ruamel.yaml.constructor import DuplicateKeyError
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file: {e.strerror}", file=str(path)) from None
    except UnicodeDecodeError:
        raise ConfigError("config file is not UTF-8 text", file=str(path)) from None
    yaml = YAML(typ="rt", pure=True)  # YAML 1.2; duplicate keys are an error (allow_duplicate_keys=False)
    try:
        doc = yaml.load(text)
    except DuplicateKeyError as e:
        # The library's message quotes both values (maybe a DSN): name the key and its lines instead.
        key, first, second = _duplicate_key(text, e.problem_mark.line)
        raise ConfigError(f"key {key!r} is written twice in one mapping, on lines {first} and {second}; "
                          "YAML would keep only the second: merge them", file=str(path), line=second) from None
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise ConfigError(f"not valid YAML: {e.problem or e.context}", file=str(path),
                          line=mark.line + 1 if mark else None) from None
    except YAMLError as e:
        raise ConfigError(f"not valid YAML: {type(e).__name__}", file=str(path)) from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError("a config file must be a mapping of settings", file=str(path), line=1)
    plain = _plain(doc, (), lines)
    assert isinstance(plain, dict)
    return plain


def _duplicate_key(text: str, line0: int) -> tuple[str, int, int]:
    """(key, first line, second line) of the duplicate the loader found at 0-based ``line0``."""
    from ruamel.yaml import YAML
    from ruamel.yaml.nodes import MappingNode, Node, SequenceNode

    found: list[tuple[str, int, int]] = []

    def walk(node: Node) -> None:
        if isinstance(node, MappingNode):
            seen: dict[str, int] = {}
            for k, v in node.value:
                name = str(k.value)
                if name in seen:
                    found.append((name, seen[name] + 1, k.start_mark.line + 1))
                seen.setdefault(name, k.start_mark.line)
                walk(v)
        elif isinstance(node, SequenceNode):
            for item in node.value:
                walk(item)

    root = YAML(typ="rt", pure=True).compose(text)
    if root is not None:
        walk(root)
    return next((f for f in found if f[2] == line0 + 1), found[0] if found else ("?", 0, line0 + 1))


def _plain(value: Any, loc: Loc, lines: dict[Loc, int]) -> Any:
    """ruamel's round-trip containers as plain dicts and lists; the 1-based line of every key and item."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            here = (*loc, str(k))
            try:
                lines[here] = value.lc.key(k)[0] + 1  # type: ignore[attr-defined]  # ruamel's CommentedMap
            except (AttributeError, KeyError, TypeError):
                pass
            out[str(k)] = _plain(v, here, lines)
        return out
    if isinstance(value, list):
        items = []
        for i, v in enumerate(value):
            try:
                lines[(*loc, i)] = value.lc.item(i)[0] + 1  # type: ignore[attr-defined]  # ruamel's CommentedSeq
            except (AttributeError, KeyError, TypeError):
                pass
            items.append(_plain(v, (*loc, i), lines))
        return items
    for base in (bool, int, float, str):  # ScalarFloat, ScalarInt, ... as the builtin type
        if isinstance(value, base):
            return base(value)
    return value


# --- relative paths ---------------------------------------------------------------------------------

def is_path_field(model: type[BaseModel], name: str) -> bool:
    """Fields marked ``json_schema_extra={"config_path": True}`` hold a path (resolved from the file's folder)."""
    extra = model.model_fields[name].json_schema_extra
    return isinstance(extra, dict) and bool(extra.get("config_path"))


def _resolve_paths(model: type[BaseModel], data: dict[str, Any], base: Path) -> None:
    for name in model.model_fields:
        value = data.get(name)
        if value is None:
            continue
        if is_path_field(model, name) and isinstance(value, str):
            data[name] = resolve_path(value, base)
            continue
        sub = nested_model(model.model_fields[name].annotation)
        if sub is None:
            continue
        if isinstance(value, dict):
            _resolve_paths(sub, value, base)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, dict):
                    _resolve_paths(sub, item, base)


def resolve_path(value: str, base: Path) -> str:
    """``value`` from the config's folder ``base``, unless it is absolute, ``~/...`` or a URI. An empty
    value is left empty, for the model to refuse (it would otherwise mean the config's folder)."""
    if _URI.match(value) or not value.strip():
        return value
    expanded = os.path.expanduser(value)
    return expanded if os.path.isabs(expanded) else str(base / expanded)


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model inside ``annotation`` (``X``, ``X | None``, ``list[X]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is not None or get_args(annotation):
        for arg in get_args(annotation):
            found = nested_model(arg)
            if found is not None:
                return found
    return None


# --- environment and flags --------------------------------------------------------------------------

def _merge_env(model: type[BaseModel], data: dict[str, Any], origins: dict[Loc, str]) -> None:
    from pydantic_settings import EnvSettingsSource
    from pydantic_settings.exceptions import SettingsError

    try:
        # The source only reads model_config and the fields, so a plain model works as well as a BaseSettings.
        source = EnvSettingsSource(model, env_prefix=ENV_PREFIX,  # type: ignore[arg-type]  # see above
                                   env_nested_delimiter=ENV_DELIMITER, case_sensitive=False)
        values = source()
    except SettingsError as e:
        raise ConfigError(f"an {ENV_PREFIX}* environment variable does not parse: {str(e).splitlines()[0]}") from None

    def merge(into: dict[str, Any], new: Mapping[str, Any], loc: Loc) -> None:
        for k, v in new.items():
            here = (*loc, k)
            if isinstance(v, Mapping) and isinstance(into.get(k), dict):
                merge(into[k], v, here)
            elif isinstance(v, Mapping):
                into[k] = {}
                merge(into[k], v, here)
            else:
                into[k] = v
                origins[here] = "$" + ENV_PREFIX + ENV_DELIMITER.join(str(p) for p in here).upper()

    merge(data, values, ())


def _set(data: dict[str, Any], dotted: str, value: object, flag: str, origins: dict[Loc, str]) -> None:
    append = dotted.endswith("+")
    parts = dotted.rstrip("+").split(".")
    node = data
    for p in parts[:-1]:
        child = node.get(p)
        if not isinstance(child, dict):
            child = node[p] = {}
        node = child
    last = parts[-1]
    loc: Loc = tuple(parts)
    if append:
        existing = node.get(last)
        start = len(existing) if isinstance(existing, list) else 0
        items = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value]
        node[last] = [*(existing if isinstance(existing, list) else []), *items]
        for i in range(start, start + len(items)):
            origins[(*loc, i)] = flag
    else:
        node[last] = value
        origins[loc] = flag


# --- errors -----------------------------------------------------------------------------------------

def _config_error(error: ValidationError, file: str | None, lines: dict[Loc, int],
                  origins: dict[Loc, str], flags: Mapping[Loc, str] | None = None) -> ConfigError:
    problems: list[tuple[str, int | None, str]] = []  # (where, line, text)
    for item in error.errors():
        loc: Loc = tuple(item["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        msg = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "missing":
            flag = next((f for at, f in (flags or {}).items() if at[:len(loc)] == loc), None)
            msg = "required, and not given: " + " or ".join(
                ([f"pass {flag}"] if flag else []) + (["set it in the config file"] if file else ["give --config"]))
        origin = _longest(origins, loc)
        if origin is not None:  # a flag or a variable: named as the user wrote it
            problems.append((origin, None, msg if origin.startswith("-") else f"{key}: {msg}"))
        else:
            line = _longest(lines, loc)
            where = f"{file}:{line}" if file and line else (file or "flags")
            problems.append((where, line, f"{key}: {msg}"))
    problems.sort(key=lambda p: (p[1] is None, p[1] or 0))
    where, line, text = problems[0]
    if len(problems) == 1:
        if file and where.startswith(file):
            return ConfigError(text, file=file, line=line)
        return ConfigError(f"{where}: {text}" if where != "flags" else text)
    first_line = next((p[1] for p in problems if p[1]), None)
    return ConfigError(f"{len(problems)} problems in the config", file=file, line=first_line,
                       problems=[f"{w}: {t}" for w, _, t in problems])


def _longest(table: Mapping[Loc, Any], loc: Loc) -> Any:
    for n in range(len(loc), 0, -1):
        if loc[:n] in table:
            return table[loc[:n]]
    return None
