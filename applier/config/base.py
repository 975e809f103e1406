"""What every config section shares: strict frozen models, path fields and the LSN type."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

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
