"""What every config section shares: strict frozen models, path fields and the LSN type."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator

from applier.lsn import format_lsn, parse_lsn

#: Marks a field holding a path: relative values in a config file are resolved from the file's folder.
PATH: dict[str, Any] = {"config_path": True}


def _lsn(value: str) -> str:
    try:
        return format_lsn(parse_lsn(value))
    except Exception:  # noqa: BLE001 - pydantic reports it with the key (or the flag)
        raise ValueError(f"not an LSN like 0/16B3748 (two hex numbers separated by a slash): {value!r}") from None


#: A commit LSN as PostgreSQL prints it, normalised (``0/16b3748`` -> ``0/16B3748``).
Lsn = Annotated[str, AfterValidator(_lsn)]


class SettingsModel(BaseModel):
    """A config section: an unknown key is an error (a typo must not silently fall back to a default),
    and a loaded config cannot change under the run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="after")
    @classmethod
    def _path_not_blank(cls, value: Any, info: ValidationInfo) -> Any:
        """An empty path setting is refused, not taken for the config file's folder (or the working
        directory), where it would silently put Delta tables or state beside the config."""
        if isinstance(value, str) and not value.strip() and info.field_name is not None:
            field = cls.model_fields[info.field_name]
            if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("config_path"):
                raise ValueError("is empty: give the directory or URI meant (\".\" for the config file's own "
                                 "folder)" + ("" if field.is_required() else ", or leave the setting out for its "
                                              "default"))
        return value
